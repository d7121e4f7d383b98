/**
 * Exactly-once processing inside the caller's transaction: record the message id in the inbox
 * and run the handler's work in the SAME transaction. If the transaction rolls back, the id is
 * not recorded either, so a redelivery runs the work again; if it commits, a redelivery finds
 * the id and skips the work.
 *
 * Inboxes that cannot join a transaction (memory, NATS KV: `recordsImmediately`) are checked
 * with `has()` before the work and recorded only after it succeeded, so a failed work is run
 * again by the next call (at-least-once, never lost).
 *
 * @module
 */

import { OutboxValidationError } from "../core/errors.ts";
import type { InboxRepository } from "../core/types.ts";

/**
 * What {@linkcode processOnce} did.
 *
 * @example
 * ```ts
 * import type { ProcessOnceResult } from "@outbox/nats";
 * const result: ProcessOnceResult<number> = { duplicate: false, value: 1 };
 * ```
 */
export type ProcessOnceResult<T> =
  | { duplicate: true }
  | { duplicate: false; value: T };

/**
 * Runs `work` once per `messageId` and `consumer`.
 *
 * With an inbox bound to the same transaction as the work (for example
 * `new SqlInboxRepository(postgresJsExecutor(tx), "postgres")` inside `sql.begin`), it records
 * the id first and runs `work` only if this call recorded it: the id and the work's writes
 * commit or roll back together (exactly-once). On Postgres, a concurrent delivery of the same id
 * waits on the first transaction's row lock and then sees it as a duplicate.
 *
 * With an inbox that records immediately (memory, NATS KV), it checks `has()`, runs `work`, and
 * records the id only after `work` succeeded: a `work` that throws leaves nothing recorded and
 * the next call runs it again. Two concurrent calls for one id may both run `work`
 * (at-least-once); a crash between the work and the record runs it again on redelivery.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository, processOnce } from "@outbox/nats";
 * const inbox = new MemoryInboxRepository();
 * const first = await processOnce(inbox, { messageId: "evt-1", consumer: "billing" }, () =>
 *   Promise.resolve("charged"));
 * const again = await processOnce(inbox, { messageId: "evt-1", consumer: "billing" }, () =>
 *   Promise.resolve("charged"));
 * console.log(first, again); // { duplicate: false, value: "charged" } { duplicate: true }
 * ```
 */
export async function processOnce<T>(
  inbox: InboxRepository,
  key: { messageId: string; consumer?: string; now?: Date },
  work: () => Promise<T>,
): Promise<ProcessOnceResult<T>> {
  const options = { consumer: key.consumer, now: key.now };
  if (inbox.recordsImmediately === true) {
    if (typeof inbox.has !== "function") {
      throw new OutboxValidationError(
        "inbox",
        "an inbox that records immediately must offer has(): processOnce checks it before the " +
          "work and records after the work succeeded",
      );
    }
    if (await inbox.has(key.messageId, options)) return { duplicate: true };
    const value = await work();
    // false here means a concurrent call recorded it first: both ran the work.
    await inbox.record(key.messageId, options);
    return { duplicate: false, value };
  }
  const recorded = await inbox.record(key.messageId, options);
  if (!recorded) return { duplicate: true };
  return { duplicate: false, value: await work() };
}
