/**
 * Identity of outbox records: enqueueing an id twice is only allowed with identical content.
 *
 * @module
 */

import { OutboxDuplicateIdentityError } from "./errors.ts";
import type { OutboxRecord } from "./types.ts";

/**
 * Headers that describe the request that enqueued a message rather than the message: W3C trace
 * context. They are stored and published, but a retried enqueue from another trace is still the
 * same message.
 */
const contextHeaders = new Set(["traceparent", "tracestate"]);

function contentHeaders(headers: Record<string, string>): string[] {
  return Object.keys(headers).filter((key) => !contextHeaders.has(key.toLowerCase()));
}

/**
 * Whether two records have the same immutable content (kind, name, subject, payload and
 * headers; header order does not matter, and the trace-context headers `traceparent` and
 * `tracestate` are not content).
 *
 * @example
 * ```ts
 * import { sameOutboxContent } from "@outbox/nats";
 * const a = { id: "1", kind: "event.publish", name: "n", subject: "s", payload: "{}", headers: {} } as const;
 * console.log(sameOutboxContent(a, { ...a, payload: "[]" })); // false
 * ```
 */
export function sameOutboxContent(a: OutboxRecord, b: OutboxRecord): boolean {
  if (
    a.kind !== b.kind || a.name !== b.name || a.subject !== b.subject || a.payload !== b.payload
  ) {
    return false;
  }
  const keys = contentHeaders(a.headers);
  if (keys.length !== contentHeaders(b.headers).length) return false;
  return keys.every((key) => Object.hasOwn(b.headers, key) && b.headers[key] === a.headers[key]);
}

/**
 * Throws {@linkcode OutboxDuplicateIdentityError} unless `candidate` has the same content as the
 * stored record with its id.
 *
 * @example
 * ```ts
 * import { assertOutboxIdentity } from "@outbox/nats";
 * const stored = { id: "1", kind: "event.publish", name: "n", subject: "s", payload: "{}", headers: {} } as const;
 * assertOutboxIdentity(stored, { ...stored }); // same content: no error
 * ```
 */
export function assertOutboxIdentity(existing: OutboxRecord, candidate: OutboxRecord): void {
  if (!sameOutboxContent(existing, candidate)) {
    throw new OutboxDuplicateIdentityError(candidate.id);
  }
}
