/**
 * Checks for the numeric arguments stores take (claim limits, batch sizes).
 *
 * @module
 */

import { OutboxValidationError } from "./errors.ts";
import { defaultLeaseMs } from "./time.ts";

/**
 * Default number of rows deleted per prune statement.
 *
 * @example
 * ```ts
 * import { defaultPruneBatchSize } from "@outbox/nats";
 * console.log(defaultPruneBatchSize); // 1000
 * ```
 */
export const defaultPruneBatchSize = 1000;

/** Returns `value` if it is a finite number >= 0 (a duration, say), else throws. */
export function nonNegative(field: string, value: number): number {
  if (!Number.isFinite(value) || value < 0) {
    throw new OutboxValidationError(field, `${field} must be a finite number >= 0, got ${value}`);
  }
  return value;
}

/** Returns `value` if it is an integer >= 1, else throws `OutboxValidationError`. */
export function positiveInteger(field: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new OutboxValidationError(field, `${field} must be an integer >= 1, got ${value}`);
  }
  return value;
}

/** `date` as an ISO string if it is a valid `Date`, else throws `OutboxValidationError`. */
export function checkedDate(date: Date, field = "now"): string {
  if (!(date instanceof Date) || !Number.isFinite(date.getTime())) {
    throw new OutboxValidationError(field, `${field} must be a valid Date`);
  }
  const iso = date.toISOString();
  // Years 0000-9999 only: later (or negative) years are written "+275760-..." by
  // toISOString, which Postgres refuses and the NATS KV records' schema reads as corrupt.
  if (iso.length !== 24) {
    throw new OutboxValidationError(field, `${field} must be within the years 0000-9999`);
  }
  return iso;
}

/** The claim lease of `claimDue`'s options, checked (default {@linkcode defaultLeaseMs}). */
export function checkedLeaseMs(leaseMs: number | undefined): number {
  return nonNegative("leaseMs", leaseMs ?? defaultLeaseMs);
}

/** Returns `limit` if it is an integer >= 0, else throws `OutboxValidationError`. */
export function checkedLimit(limit: number, field = "limit"): number {
  if (!Number.isSafeInteger(limit) || limit < 0) {
    throw new OutboxValidationError(field, `${field} must be an integer >= 0, got ${limit}`);
  }
  return limit;
}

/** Returns `batchSize` (default {@linkcode defaultPruneBatchSize}) if it is an integer >= 1. */
export function checkedBatchSize(batchSize: number | undefined, field = "batchSize"): number {
  const value = batchSize ?? defaultPruneBatchSize;
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new OutboxValidationError(field, `${field} must be an integer >= 1, got ${value}`);
  }
  return value;
}

/** Checks `options.action` of an `unblockKey` call. Internal. */
export function checkedUnblockAction(options: { action?: unknown } | undefined): "retry" | "skip" {
  const action = options?.action;
  if (action !== "retry" && action !== "skip") {
    throw new OutboxValidationError(
      "action",
      `unblockKey action must be "retry" or "skip", got ${JSON.stringify(action)}`,
    );
  }
  return action;
}

/**
 * The `sequence` of a dispatched mark: `undefined` (none), or a stream sequence (an integer
 * >= 1); anything else throws `OutboxValidationError`.
 */
export function checkedSequence(sequence: unknown): number | undefined {
  if (sequence === undefined) return undefined;
  if (typeof sequence !== "number" || !Number.isSafeInteger(sequence) || sequence < 1) {
    throw new OutboxValidationError(
      "sequence",
      `sequence must be a stream sequence (an integer >= 1), got ${String(sequence)}`,
    );
  }
  return sequence;
}
