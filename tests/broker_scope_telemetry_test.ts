/**
 * The metric for "no stream captures the subject" (issue #19 item 1), on real JetStream:
 * `outbox.messages.no_stream` counts every such attempt, and the failure counters carry the
 * error's scope.
 */

import assert from "node:assert/strict";
import { jetstream } from "@nats-io/jetstream";
import { type DataPoint, MeterProvider } from "@opentelemetry/sdk-metrics";
import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "../mod.ts";
import { OutboxTelemetry } from "../telemetry.ts";
import { connectNats, uniqueName } from "./kit/mod.ts";
import { signal } from "./helpers/dispatch.ts";
import { metricPoints, TestReader } from "./helpers/metrics.ts";

async function points(reader: TestReader, name: string): Promise<DataPoint<unknown>[]> {
  return (await metricPoints(reader)).get(name) ?? [];
}

Deno.test("telemetry: attempts on a subject without a stream are counted in outbox.messages.no_stream, failures carry the scope", async () => {
  const reader = new TestReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const nc = await connectNats();
  try {
    const telemetry = new OutboxTelemetry({ meterProvider });
    const outbox = new MemoryOutboxRepository();
    await outbox.enqueue({
      id: uniqueName("m"),
      kind: "event.publish",
      name: "order.created",
      subject: `${uniqueName("nostream")}.created`,
      payload: "{}",
      headers: {},
    });
    const dead = signal();
    const dispatcher = new OutboxDispatcher(
      outbox,
      telemetry.instrumentRuntime(createJetStreamRuntime(jetstream(nc))),
      {
        ...telemetry.hooks,
        idleRetryMs: false,
        retry: { baseMs: 1, capMs: 1, maxAttempts: 2 },
        onError: () => {},
        onDead: (message, info) => {
          telemetry.hooks.onDead(message, info);
          dead.resolve();
        },
      },
    );
    await dead.promise;
    await dispatcher.stop();
    const noStream = await points(reader, "outbox.messages.no_stream");
    assert.equal(noStream.reduce((total, point) => total + (point.value as number), 0), 2);
    const [failed] = await points(reader, "outbox.messages.failed");
    assert.equal(failed.attributes["error.type"], "no_stream");
    assert.equal(failed.attributes["outbox.failure.scope"], "subject");
  } finally {
    await nc.close();
    await meterProvider.shutdown();
  }
});
