/**
 * Exactly-once processing inside the caller's transaction: record the message id in the inbox
 * and run the handler's work in the SAME transaction. If the transaction rolls back, the id is
 * not recorded either, so a redelivery runs the work again; if it commits, a redelivery finds
 * the id and skips the work.
 *
 * @module
 */

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
 * Records `messageId` for `consumer` in `inbox` and, only if this call recorded it, runs
 * `work`. Pass an inbox bound to the same transaction as the work (for example
 * `new SqlInboxRepository(postgresJsExecutor(tx), "postgres")` inside `sql.begin`), so the id
 * and the work's writes commit or roll back together. On Postgres, a concurrent delivery of the
 * same id waits on the first transaction's row lock and then sees it as a duplicate.
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
  const recorded = await inbox.record(key.messageId, { consumer: key.consumer, now: key.now });
  if (!recorded) return { duplicate: true };
  return { duplicate: false, value: await work() };
}
