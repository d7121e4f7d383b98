/**
 * Retry policy: exponential backoff with full jitter, capped, and an attempt budget after which
 * a message goes `dead`.
 *
 * @module
 */

import { OutboxValidationError } from "./errors.ts";

/**
 * How failed attempts are retried.
 *
 * The delay after attempt `n` (1-based) is a uniformly random value in
 * `[0, min(capMs, baseMs * 2 ** (n - 1))]` ("full jitter"). A message whose `attempts` reached
 * `maxAttempts` goes `dead` instead of being retried.
 *
 * @example
 * ```ts
 * import type { RetryPolicy } from "@outbox/nats";
 * const policy: RetryPolicy = { baseMs: 500, capMs: 60_000, maxAttempts: 5 };
 * ```
 */
export interface RetryPolicy {
  /** Upper bound of the first delay. @default {1000} */
  baseMs?: number;
  /** Largest upper bound of any delay. @default {300000} */
  capMs?: number;
  /** Attempts before a message goes `dead`. @default {10} */
  maxAttempts?: number;
  /**
   * The budget for `unavailable` failures of a message's OWN scope (its stream without a leader
   * or full, its subject's stream not answering, or a half-open trial that failed while the
   * broker answered probes): once the message's `attempts` reached this, such a failure moves
   * it to `dead` with the reason. Broker-wide outages (connection down, JetStream disabled or
   * unreachable) never make a message dead. While a stream is paused its messages are claimed
   * (and not attempted) once or twice per scope probe, which runs at most every 2 s plus its own
   * duration, so the default allows at least about half an hour of one stream's outage.
   *
   * @default {1000}
   */
  maxUnavailableAttempts?: number;
  /** Source of randomness in `[0, 1)`; inject for deterministic tests. @default {Math.random} */
  random?: () => number;
}

/**
 * A {@linkcode RetryPolicy} with every default filled in.
 *
 * @example
 * ```ts
 * import { resolveRetryPolicy, type ResolvedRetryPolicy } from "@outbox/nats";
 * const policy: ResolvedRetryPolicy = resolveRetryPolicy({ maxAttempts: 3 });
 * ```
 */
export type ResolvedRetryPolicy = Readonly<Required<RetryPolicy>>;

/**
 * The default retry policy: base 1 s, cap 5 min, 10 attempts.
 *
 * @example
 * ```ts
 * import { defaultRetryPolicy } from "@outbox/nats";
 * console.log(defaultRetryPolicy.maxAttempts); // 10
 * ```
 */
export const defaultRetryPolicy: ResolvedRetryPolicy = Object.freeze({
  baseMs: 1_000,
  capMs: 300_000,
  maxAttempts: 10,
  maxUnavailableAttempts: 1000,
  random: Math.random,
});

/**
 * Fills in defaults and checks the numbers (positive, finite; `capMs >= baseMs`).
 *
 * @example
 * ```ts
 * import { resolveRetryPolicy } from "@outbox/nats";
 * console.log(resolveRetryPolicy({ baseMs: 10 }).capMs); // 300000
 * ```
 */
export function resolveRetryPolicy(policy: RetryPolicy = {}): ResolvedRetryPolicy {
  const resolved = {
    baseMs: policy.baseMs ?? defaultRetryPolicy.baseMs,
    capMs: policy.capMs ?? Math.max(defaultRetryPolicy.capMs, policy.baseMs ?? 0),
    maxAttempts: policy.maxAttempts ?? defaultRetryPolicy.maxAttempts,
    maxUnavailableAttempts: policy.maxUnavailableAttempts ??
      defaultRetryPolicy.maxUnavailableAttempts,
    random: policy.random ?? defaultRetryPolicy.random,
  };
  for (const key of ["baseMs", "capMs"] as const) {
    if (!Number.isFinite(resolved[key]) || resolved[key] < 0) {
      throw new OutboxValidationError(`retry.${key}`, `retry.${key} must be a finite number >= 0`);
    }
  }
  if (resolved.capMs < resolved.baseMs) {
    throw new OutboxValidationError("retry.capMs", "retry.capMs must be >= retry.baseMs");
  }
  for (const key of ["maxAttempts", "maxUnavailableAttempts"] as const) {
    if (!Number.isInteger(resolved[key]) || resolved[key] < 1) {
      throw new OutboxValidationError(`retry.${key}`, `retry.${key} must be an integer >= 1`);
    }
  }
  return Object.freeze(resolved);
}

/**
 * The upper bound of the backoff after attempt `attempts` (1-based), before jitter.
 *
 * @example
 * ```ts
 * import { backoffCeilingMs, resolveRetryPolicy } from "@outbox/nats";
 * const policy = resolveRetryPolicy({ baseMs: 100, capMs: 1_000 });
 * console.log([1, 2, 3, 4, 5].map((n) => backoffCeilingMs(n, policy))); // [100, 200, 400, 800, 1000]
 * ```
 */
export function backoffCeilingMs(attempts: number, policy: ResolvedRetryPolicy): number {
  const exponent = Math.min(Math.max(attempts - 1, 0), 52);
  return Math.min(policy.capMs, policy.baseMs * 2 ** exponent);
}

/**
 * A full-jitter backoff delay for the retry after attempt `attempts` (1-based).
 *
 * @example
 * ```ts
 * import { backoffDelayMs, resolveRetryPolicy } from "@outbox/nats";
 * const delay = backoffDelayMs(3, resolveRetryPolicy()); // somewhere in [0, 4000]
 * ```
 */
export function backoffDelayMs(attempts: number, policy: ResolvedRetryPolicy): number {
  return Math.floor(policy.random() * (backoffCeilingMs(attempts, policy) + 1));
}
