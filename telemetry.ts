/**
 * OpenTelemetry for @outbox/nats: traces from the enqueue in a request to the publish and to the
 * inbox handler, and metrics for outcomes, latency, time in outbox and backlog. Built on
 * `@opentelemetry/api` only: a no-op until the application installs an SDK (or runs Deno with
 * `OTEL_DENO=true`, whose built-in exporter picks it up). No SDK is a dependency.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
 * import { OutboxTelemetry } from "@outbox/nats/telemetry";
 *
 * const telemetry = new OutboxTelemetry({ publishContext: "link" });
 * const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
 * const runtime = telemetry.instrumentRuntime({ publishPreparedEvent: () => Promise.resolve() });
 * const dispatcher = new OutboxDispatcher(outbox, runtime, { ...telemetry.hooks });
 * await outbox.enqueue({
 *   id: "evt-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
 * });
 * dispatcher.notify();
 * await dispatcher.whenIdle();
 * await dispatcher.stop();
 * ```
 *
 * @module
 */

export {
  type BacklogObservation,
  type OutboxErrorAttributes,
  OutboxTelemetry,
  type OutboxTelemetryOptions,
} from "./src/telemetry/outbox_telemetry.ts";
export {
  extractTraceContext,
  injectTraceContext,
  type TraceContext,
  traceHeaderNames,
} from "./src/telemetry/trace_context.ts";
