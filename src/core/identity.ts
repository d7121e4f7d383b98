/**
 * Identity of outbox records: enqueueing an id twice is only allowed with identical content.
 *
 * @module
 */

import { OutboxDuplicateIdentityError } from "./errors.ts";
import type { OutboxRecord } from "./types.ts";

/**
 * Whether two records have the same immutable content (kind, name, subject, payload and
 * headers; header order does not matter).
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
  const keys = Object.keys(a.headers);
  if (keys.length !== Object.keys(b.headers).length) return false;
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
