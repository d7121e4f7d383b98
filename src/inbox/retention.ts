/**
 * Inbox retention versus redelivery: an inbox that forgets an id before JetStream can deliver
 * the message again (or before the stream stops deduplicating re-publishes of it) reopens the
 * door to double processing.
 *
 * @module
 */

/**
 * The consumer settings that bound redelivery, as in JetStream's consumer configuration
 * (durations in nanoseconds).
 *
 * @example
 * ```ts
 * import type { RedeliveryConfig } from "@outbox/nats";
 * const config: RedeliveryConfig = { max_deliver: 5, ack_wait: 30_000_000_000 };
 * ```
 */
export interface RedeliveryConfig {
  /** Deliveries before JetStream gives up; -1 or absent: unlimited. */
  max_deliver?: number;
  /** Ack wait in nanoseconds. @default {30000000000} */
  ack_wait?: number;
  /** Redelivery backoff steps in nanoseconds. */
  backoff?: number[];
}

/**
 * The retention you apply to the inbox (`prune({ receivedBefore: now - inboxRetentionMs })`,
 * or the KV bucket's max age), checked when a consumer starts.
 *
 * @example
 * ```ts
 * import type { InboxRetentionOptions } from "@outbox/nats";
 * const retention: InboxRetentionOptions = { inboxRetentionMs: 7 * 86_400_000 };
 * ```
 */
export interface InboxRetentionOptions {
  /** How long the inbox keeps ids. */
  inboxRetentionMs: number;
  /**
   * The stream's duplicate window in milliseconds (`stream.config.duplicate_window / 1e6`):
   * ids must outlive it too. @default {0 (not checked)}
   */
  duplicateWindowMs?: number;
  /** Throw {@linkcode InboxRetentionError} instead of warning. @default {false} */
  strict?: boolean;
  /** Receives the warning text. @default {console.warn} */
  onWarning?: (message: string) => void;
}

/**
 * The inbox retention is shorter than the redelivery horizon or the duplicate window.
 *
 * @example
 * ```ts
 * import { InboxRetentionError } from "@outbox/nats";
 * const error = new InboxRetentionError("retention 1 h < horizon 2 h", 3_600_000, 7_200_000);
 * console.log(error.requiredMs);
 * ```
 */
export class InboxRetentionError extends Error {
  /** The configured retention. */
  readonly retentionMs: number;
  /** The smallest safe retention. */
  readonly requiredMs: number;
  /** Creates the error. */
  constructor(message: string, retentionMs: number, requiredMs: number, options?: ErrorOptions) {
    super(message, options);
    this.name = "InboxRetentionError";
    this.retentionMs = retentionMs;
    this.requiredMs = requiredMs;
  }
}

const nanosPerMs = 1_000_000;

/**
 * How long after its first delivery JetStream may still deliver a message to this consumer:
 * `max_deliver` deliveries, each waiting at most the largest of `ack_wait`, the consumer's
 * `backoff` steps, and our nak delay cap. `Infinity` when `max_deliver` is unlimited.
 *
 * @example
 * ```ts
 * import { redeliveryHorizonMs } from "@outbox/nats";
 * const horizon = redeliveryHorizonMs({ max_deliver: 5, ack_wait: 30_000_000_000 }, 60_000);
 * console.log(horizon); // 300000
 * ```
 */
export function redeliveryHorizonMs(
  consumer: RedeliveryConfig,
  nakCapMs: number,
): number {
  const maxDeliver = consumer.max_deliver ?? -1;
  if (maxDeliver < 1) return Infinity;
  const ackWaitMs = (consumer.ack_wait ?? 30_000 * nanosPerMs) / nanosPerMs;
  const backoffMs = Math.max(0, ...(consumer.backoff ?? []).map((n) => n / nanosPerMs));
  return maxDeliver * Math.max(ackWaitMs, backoffMs, nakCapMs);
}

/**
 * Warns (or throws, with `strict`) when `inboxRetentionMs` is shorter than the consumer's
 * redelivery horizon or than the stream's duplicate window.
 *
 * @example
 * ```ts
 * import { checkInboxRetention } from "@outbox/nats";
 * checkInboxRetention({ inboxRetentionMs: 86_400_000, duplicateWindowMs: 120_000 }, {
 *   consumer: { max_deliver: 5, ack_wait: 30_000_000_000 },
 *   nakCapMs: 60_000,
 * }); // fine: one day covers both
 * ```
 */
export function checkInboxRetention(
  retention: InboxRetentionOptions,
  limits: { consumer: RedeliveryConfig; nakCapMs: number },
): void {
  const problems: string[] = [];
  const horizon = redeliveryHorizonMs(limits.consumer, limits.nakCapMs);
  const windowMs = retention.duplicateWindowMs ?? 0;
  if (retention.inboxRetentionMs < horizon) {
    problems.push(
      horizon === Infinity
        ? "the consumer's max_deliver is unlimited, so a redelivery can arrive after any retention"
        : `it is shorter than the consumer's redelivery horizon (${horizon} ms = max_deliver x the longest redelivery wait)`,
    );
  }
  if (retention.inboxRetentionMs < windowMs) {
    problems.push(`it is shorter than the stream's duplicate window (${windowMs} ms)`);
  }
  if (problems.length === 0) return;
  const required = Math.max(horizon, windowMs);
  const message =
    `Inbox retention of ${retention.inboxRetentionMs} ms can let a message be processed twice: ${
      problems.join("; ")
    }.`;
  if (retention.strict) {
    throw new InboxRetentionError(message, retention.inboxRetentionMs, required);
  }
  (retention.onWarning ?? console.warn)(message);
}
