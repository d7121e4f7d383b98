/**
 * Retrying an operation until a server is back, without sleep-and-hope: the operation itself
 * is the readiness check.
 *
 * @module
 */

import { sleep } from "./process.ts";

/** Calls `fn` until it resolves (or `timeoutMs` passes, then rethrows its last error). */
export async function eventually<T>(
  fn: () => T | Promise<T>,
  { timeoutMs = 20_000, intervalMs = 50 }: { timeoutMs?: number; intervalMs?: number } = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (true) {
    try {
      return await fn();
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await sleep(intervalMs);
    }
  }
}
