/**
 * Identity of outbox records: enqueueing an id twice is only allowed with identical content.
 *
 * @module
 */

import { OutboxDuplicateIdentityError } from "./errors.ts";
import type { OutboxRecord } from "./types.ts";

/**
 * Headers that always describe the request that enqueued a message rather than the message: W3C
 * trace context. They are stored and published, but a retried enqueue from another trace is
 * still the same message.
 *
 * @example
 * ```ts
 * import { defaultContextHeaders } from "@outbox/nats";
 * console.log(defaultContextHeaders); // ["traceparent", "tracestate"]
 * ```
 */
export const defaultContextHeaders: readonly string[] = Object.freeze([
  "traceparent",
  "tracestate",
]);

const defaultContext = new Set(defaultContextHeaders);

function contextSet(extra: Iterable<string> | undefined): ReadonlySet<string> {
  if (extra === undefined) return defaultContext;
  const names = new Set(defaultContext);
  for (const name of extra) names.add(name.toLowerCase());
  return names;
}

function contentHeaders(headers: Record<string, string>, context: ReadonlySet<string>): string[] {
  return Object.keys(headers).filter((key) => !context.has(key.toLowerCase()));
}

/**
 * Whether two records have the same immutable content (kind, name, subject, payload and
 * headers; header order does not matter, and context headers are not content: the trace-context
 * headers `traceparent` and `tracestate`, plus `contextHeaders`, case-insensitively, such as the
 * fields of a B3 or Jaeger propagator or `baggage`).
 *
 * @example
 * ```ts
 * import { sameOutboxContent } from "@outbox/nats";
 * const a = { id: "1", kind: "event.publish", name: "n", subject: "s", payload: "{}", headers: {} } as const;
 * console.log(sameOutboxContent(a, { ...a, payload: "[]" })); // false
 * console.log(sameOutboxContent(a, { ...a, headers: { b3: "80f198ee56343ba8-e457b5a2e4d86bd1-1" } }, ["b3"])); // true
 * ```
 */
export function sameOutboxContent(
  a: OutboxRecord,
  b: OutboxRecord,
  contextHeaders?: Iterable<string>,
): boolean {
  if (
    a.kind !== b.kind || a.name !== b.name || a.subject !== b.subject || a.payload !== b.payload
  ) {
    return false;
  }
  const context = contextSet(contextHeaders);
  const keys = contentHeaders(a.headers, context);
  if (keys.length !== contentHeaders(b.headers, context).length) return false;
  return keys.every((key) => Object.hasOwn(b.headers, key) && b.headers[key] === a.headers[key]);
}

/**
 * Throws {@linkcode OutboxDuplicateIdentityError} unless `candidate` has the same content as the
 * stored record with its id (context headers aside, see {@linkcode sameOutboxContent}).
 *
 * @example
 * ```ts
 * import { assertOutboxIdentity } from "@outbox/nats";
 * const stored = { id: "1", kind: "event.publish", name: "n", subject: "s", payload: "{}", headers: {} } as const;
 * assertOutboxIdentity(stored, { ...stored }); // same content: no error
 * ```
 */
export function assertOutboxIdentity(
  existing: OutboxRecord,
  candidate: OutboxRecord,
  contextHeaders?: Iterable<string>,
): void {
  if (!sameOutboxContent(existing, candidate, contextHeaders)) {
    throw new OutboxDuplicateIdentityError(candidate.id);
  }
}
