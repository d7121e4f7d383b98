/**
 * The test servers (from tests/kit/run.ts through the environment) and unique names, for the
 * Node suite.
 *
 * @module
 */

import { randomBytes } from "node:crypto";

/** The test NATS server; fails when the suite was not started through the kit. */
export function natsUrl(): string {
  const url = process.env.OUTBOX_TEST_NATS_URL;
  if (!url) throw new Error("OUTBOX_TEST_NATS_URL is not set (run through tests/kit/run.ts)");
  return url;
}

/** The test Postgres server. */
export function postgresUrl(): string {
  const url = process.env.OUTBOX_TEST_POSTGRES_URL;
  if (!url) throw new Error("OUTBOX_TEST_POSTGRES_URL is not set (run through tests/kit/run.ts)");
  return url;
}

let counter = 0;

/** `prefix_<time>_<random>_<n>`, valid as a stream, bucket or table name. */
export function uniqueName(prefix: string): string {
  counter += 1;
  return `${prefix}_${Date.now().toString(36)}_${randomBytes(4).toString("hex")}_${counter}`;
}

/** Retries `check` (every 25 ms) until it stops throwing; rethrows its last error after `timeoutMs`. */
export async function eventually(
  check: () => void | Promise<void>,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await check();
      return;
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }
}
