/**
 * Closing a NATS KV outbox while a claim is under way: the claim fails at once with
 * `NatsKvIndexError` (its index was stopped), it does not wait out `syncTimeoutMs`.
 */

import assert from "node:assert/strict";
import type { NatsKvOutboxRepository } from "../mod.ts";
import { syncKey } from "../src/stores/nats_kv/keys.ts";
import { intercept, openKvFixture } from "./nats_kv_fixture.ts";

Deno.test("nats kv close: a claim whose sync barrier write is in flight when the repository closes fails at once, not after syncTimeoutMs", async () => {
  await using fixture = await openKvFixture();
  let closing: Promise<void> | undefined;
  // The barrier's write lands after close() stopped the watch (the claim's index start).
  const kv = intercept(fixture.kv, "put", (put) => async (key, ...rest) => {
    if (key === syncKey && closing === undefined) closing = a.close();
    await closing;
    return await put(key, ...rest);
  });
  const a: NatsKvOutboxRepository = fixture.outbox({ kv, syncTimeoutMs: 3_000 });
  const startedMs = Date.now();
  await assert.rejects(a.claimDue(10, new Date()), /closed|stopped/);
  const elapsedMs = Date.now() - startedMs;
  assert.ok(elapsedMs < 1_500, `the claim failed after ${elapsedMs} ms`);
});
