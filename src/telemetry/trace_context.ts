/**
 * W3C trace context in outbox record headers and JetStream message headers, through the
 * globally registered OpenTelemetry propagator (a no-op until the application installs one).
 *
 * @module
 */

import { type Context, context, propagation, type TextMapGetter } from "@opentelemetry/api";

/**
 * An OpenTelemetry `Context` (from `@opentelemetry/api`), described structurally so this
 * package's API does not re-export the API package's types.
 *
 * @example
 * ```ts
 * import { context } from "@opentelemetry/api";
 * import type { TraceContext } from "@outbox/nats/telemetry";
 * const active: TraceContext = context.active();
 * ```
 */
export interface TraceContext {
  /** Reads a value stored under `key`. */
  getValue(key: symbol): unknown;
  /** A new context with `key` set. */
  setValue(key: symbol, value: unknown): TraceContext;
  /** A new context without `key`. */
  deleteValue(key: symbol): TraceContext;
}

const recordGetter: TextMapGetter<Record<string, string>> = {
  keys: (carrier) => Object.keys(carrier),
  get: (carrier, key) => carrier[key] ?? carrier[key.toLowerCase()] ?? lookup(carrier, key),
};

function lookup(carrier: Record<string, string>, key: string): string | undefined {
  const wanted = key.toLowerCase();
  for (const [name, value] of Object.entries(carrier)) {
    if (name.toLowerCase() === wanted) return value;
  }
  return undefined;
}

/**
 * The names of the headers trace context travels in: `traceparent` and `tracestate`, plus the
 * fields the globally registered OpenTelemetry propagator writes (`propagation.fields()`: `b3`,
 * `uber-trace-id`, `baggage`...). Read at each call, so a propagator registered later counts.
 * Pass them as `contextHeaders` when you inject trace context into records yourself;
 * `OutboxTelemetry#instrumentOutbox` does it for you.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * import { injectTraceContext, traceHeaderNames } from "@outbox/nats/telemetry";
 * const outbox = new MemoryOutboxRepository();
 * await outbox.enqueue({
 *   id: "evt-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}",
 *   headers: injectTraceContext({}),
 * }, { contextHeaders: traceHeaderNames() });
 * ```
 */
export function traceHeaderNames(): string[] {
  const fields = propagation.fields();
  return fields.length === 0 ? [...w3cHeaders] : [...new Set([...w3cHeaders, ...fields])];
}

const w3cHeaders = ["traceparent", "tracestate"] as const;

/**
 * Headers with the trace context of `ctx` (default: the active context) added as `traceparent`
 * and `tracestate`. Headers that already carry a `traceparent` are returned unchanged: the
 * caller chose the context.
 *
 * @example
 * ```ts
 * import { injectTraceContext } from "@outbox/nats/telemetry";
 * const headers = injectTraceContext({ "X-Tenant": "t1" });
 * ```
 */
export function injectTraceContext(
  headers: Record<string, string>,
  ctx: TraceContext = context.active(),
): Record<string, string> {
  if (recordGetter.get(headers, "traceparent") !== undefined) return headers;
  const out: Record<string, string> = { ...headers };
  propagation.inject(ctx as Context, out);
  return out;
}

/**
 * The trace context carried by record or message headers (a plain object, or anything with
 * `get(name)` such as nats.js `MsgHdrs`), on top of `base` (default: the active context).
 *
 * @example
 * ```ts
 * import { extractTraceContext } from "@outbox/nats/telemetry";
 * const ctx = extractTraceContext({ traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" });
 * ```
 */
export function extractTraceContext(
  headers: Record<string, string> | { get(name: string): string } | undefined,
  base: TraceContext = context.active(),
): TraceContext {
  if (!headers) return base as Context;
  if (typeof headers.get === "function") {
    const source = headers as { get(name: string): string };
    const carrier: Record<string, string> = {};
    for (const name of traceHeaderNames()) {
      const value = source.get(name);
      if (value) carrier[name] = value;
    }
    return propagation.extract(base as Context, carrier, recordGetter);
  }
  return propagation.extract(base as Context, headers as Record<string, string>, recordGetter);
}
