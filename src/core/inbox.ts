/**
 * Inbox argument handling shared by every inbox store.
 *
 * @module
 */

import { OutboxValidationError } from "./errors.ts";
import type { InboxRecordOptions } from "./types.ts";

/**
 * The consumer scope used when `record()` is called without one (the reference's behaviour).
 *
 * @example
 * ```ts
 * import { defaultInboxConsumer } from "@outbox/nats";
 * console.log(JSON.stringify(defaultInboxConsumer)); // '""'
 * ```
 */
export const defaultInboxConsumer = "";

/**
 * Validates an inbox message id and normalises `record()`'s second argument (a receive time, as
 * in the reference API, or an options object).
 *
 * @example
 * ```ts
 * import { resolveInboxRecordOptions } from "@outbox/nats";
 * const { now, consumer } = resolveInboxRecordOptions("evt-1", { consumer: "billing" });
 * ```
 */
export function resolveInboxRecordOptions(
  messageId: string,
  options?: Date | InboxRecordOptions,
): { now: Date; consumer: string } {
  if (typeof messageId !== "string" || messageId.length === 0) {
    throw new OutboxValidationError("messageId", "Inbox message id must be a non-empty string");
  }
  if (messageId.includes("\u0000") || !messageId.isWellFormed()) {
    throw new OutboxValidationError(
      "messageId",
      "Inbox message id must be well-formed Unicode without NUL",
    );
  }
  const resolved = options instanceof Date ? { now: options } : options ?? {};
  const consumer = resolved.consumer ?? defaultInboxConsumer;
  if (typeof consumer !== "string" || consumer.includes("\u0000") || !consumer.isWellFormed()) {
    throw new OutboxValidationError(
      "consumer",
      "Inbox consumer must be a well-formed string without NUL",
    );
  }
  const now = resolved.now ?? new Date();
  if (!(now instanceof Date) || !Number.isFinite(now.getTime())) {
    throw new OutboxValidationError("now", "Inbox receive time must be a valid Date");
  }
  return { now, consumer };
}
