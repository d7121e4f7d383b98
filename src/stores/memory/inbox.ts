/**
 * An in-process inbox.
 *
 * @module
 */

import { checkedBatchSize } from "../../core/limits.ts";
import type {
  InboxAdmin,
  InboxPruneOptions,
  InboxRecordOptions,
  InboxRepository,
} from "../../core/types.ts";
import { resolveInboxRecordOptions } from "../../core/inbox.ts";

/**
 * An inbox kept in process memory: `record()` is true once per `(consumer, messageId)`.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository } from "@outbox/nats";
 * const inbox = new MemoryInboxRepository();
 * if (await inbox.record("evt-1")) {
 *   // first delivery: apply the side effect
 * }
 * ```
 */
export class MemoryInboxRepository implements InboxRepository, InboxAdmin {
  /** `record()` takes effect at once: no transaction can undo it. */
  readonly recordsImmediately = true;
  /** consumer -> message id -> received at (epoch ms) */
  #seen = new Map<string, Map<string, number>>();

  /** Records `messageId` for the consumer scope; `true` only the first time. */
  record(messageId: string, options?: Date | InboxRecordOptions): Promise<boolean> {
    try {
      const { now, consumer } = resolveInboxRecordOptions(messageId, options);
      let scope = this.#seen.get(consumer);
      if (!scope) this.#seen.set(consumer, scope = new Map());
      if (scope.has(messageId)) return Promise.resolve(false);
      scope.set(messageId, now.getTime());
      return Promise.resolve(true);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Whether `messageId` is recorded for the consumer scope. */
  has(messageId: string, options?: InboxRecordOptions): Promise<boolean> {
    try {
      const { consumer } = resolveInboxRecordOptions(messageId, options);
      return Promise.resolve(this.#seen.get(consumer)?.has(messageId) ?? false);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Forgets ids received before `receivedBefore`; returns how many were removed. */
  async prune(options: InboxPruneOptions): Promise<number> {
    const batchSize = checkedBatchSize(options.batchSize);
    const cutoff = options.receivedBefore.getTime();
    let removed = 0;
    for (const [consumer, scope] of this.#seen) {
      let inBatch = 0;
      for (const [id, receivedAt] of scope) {
        if (receivedAt >= cutoff) continue;
        scope.delete(id);
        removed += 1;
        if (++inBatch === batchSize) {
          inBatch = 0;
          await Promise.resolve();
        }
      }
      if (scope.size === 0) this.#seen.delete(consumer);
    }
    return removed;
  }
}
