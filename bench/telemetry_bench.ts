/**
 * What OutboxTelemetry adds per message on the dispatch path, without the broker: a publish
 * through `instrumentRuntime` (publish span, latency histogram) plus the `onDispatched` hook
 * (counters, time-in-outbox histogram), against the same runtime uninstrumented. The runtime
 * resolves at once, so the difference is the instrumentation alone.
 *
 * - no SDK: `@opentelemetry/api` only (its no-ops), what every user of the library pays;
 * - SDK: tracer and meter providers from the OpenTelemetry SDK with a BatchSpanProcessor and a
 *   periodic metric reader exporting to nowhere (../support/otel_sdk.ts), W3C propagation and an
 *   AsyncLocalStorage context manager. It runs last: it installs global context handling.
 *
 * 100 messages per iteration. Run with `deno task bench` (or `deno bench -A bench/telemetry_bench.ts`).
 *
 * @module
 */

import {
  type OutboxMessage,
  outboxMessageToPreparedEvent,
  type OutboxRuntime,
  type PreparedEvent,
} from "../mod.ts";
import { OutboxTelemetry } from "../telemetry.ts";
import { startOtelSdk } from "./support/otel_sdk.ts";
import { records } from "./support/records.ts";

const perIteration = 100;
const now = new Date().toISOString();

function messages(traced: boolean): Array<{ message: OutboxMessage; event: PreparedEvent }> {
  return records("telemetry", "bench", perIteration).map((record, i) => {
    const headers: Record<string, string> = traced
      ? { traceparent: `00-${"1".repeat(31)}${i % 10}-${"2".repeat(15)}${i % 10}-01` }
      : {};
    const message: OutboxMessage = {
      ...record,
      headers,
      state: "claimed",
      attempts: 1,
      createdAt: now,
      updatedAt: now,
      nextAttemptAt: now,
    };
    return { message, event: outboxMessageToPreparedEvent(message) };
  });
}

const receipt = { duplicate: false, stream: "BENCH", seq: 1 };
const runtime: OutboxRuntime = { publishPreparedEvent: () => Promise.resolve(receipt) };

async function dispatch(
  target: OutboxRuntime,
  batch: Array<{ message: OutboxMessage; event: PreparedEvent }>,
  onDispatched?: OutboxTelemetry["hooks"]["onDispatched"],
): Promise<void> {
  for (const { message, event } of batch) {
    const result = await target.publishPreparedEvent(event, { timeoutMs: 5_000 });
    onDispatched?.(message, { duplicate: false, receipt: result ?? undefined });
  }
}

const plain = messages(false);
const traced = messages(true);
const noSdk = new OutboxTelemetry();
const noSdkRuntime = noSdk.instrumentRuntime(runtime);

Deno.bench({
  name: "100 publishes, no telemetry",
  group: "telemetry per 100 messages",
  baseline: true,
  fn: async () => await dispatch(runtime, plain),
});
Deno.bench({
  name: "100 publishes, OutboxTelemetry, no SDK",
  group: "telemetry per 100 messages",
  fn: async () => await dispatch(noSdkRuntime, plain, noSdk.hooks.onDispatched),
});

// Registered last: the SDK's context manager and propagator are global from here on.
let sdkTelemetry: OutboxTelemetry | undefined;
let sdkRuntime: OutboxRuntime | undefined;
Deno.bench({
  name: "100 publishes, OutboxTelemetry + SDK (trace context in headers)",
  group: "telemetry per 100 messages",
  fn: async () => {
    if (!sdkTelemetry) {
      const sdk = startOtelSdk();
      sdkTelemetry = new OutboxTelemetry({
        tracerProvider: sdk.tracerProvider,
        meterProvider: sdk.meterProvider,
      });
      sdkRuntime = sdkTelemetry.instrumentRuntime(runtime);
    }
    await dispatch(sdkRuntime!, traced, sdkTelemetry.hooks.onDispatched);
  },
});
