/**
 * Interleavings in the NATS KV outbox that a whole-process fault test cannot produce (issue #15
 * items 3, 4, 5 and 8), on a real bucket: an operator's requeue between a mark's record write and
 * its marker cleanup, a requeue between a claim's read of a stale record and its marker cleanup,
 * two marks of one id in a batch, and a process clock that disagrees with the server's.
 */

import assert from "node:assert/strict";
import type { KV, KvEntry } from "@nats-io/kv";
import type { OutboxRecord } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { intercept, openKvFixture } from "./nats_kv_fixture.ts";

function record(id: string): OutboxRecord {
  return { id, kind: "event.publish", name: "n", subject: "s.a", payload: "{}", headers: {} };
}

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function markerExists(kv: KV, id: string): Promise<boolean> {
  const entry = await kv.get(markerKeyOf(await outboxRecordKey(id)));
  return entry?.operation === "PUT";
}

Deno.test("nats kv: markDead racing a requeue leaves the requeue's marker (item 3)", async () => {
  await using fixture = await openKvFixture();
  const id = "race-dead";
  const recordKey = await outboxRecordKey(id);
  const operator = fixture.outbox({ kv: fixture.peerKv });
  let requeued = false;
  let seen: (() => void) | undefined;
  // Right after the dead record is written, an operator requeues it, and this process's watch
  // learns the new marker before the mark cleans up its marker.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    const written = await update(key, data, revision);
    const state = JSON.parse(new TextDecoder().decode(data as Uint8Array)).state;
    if (key === recordKey && state === "dead" && !requeued) {
      requeued = true;
      const learnt = new Promise<void>((resolve) => (seen = resolve));
      assert.equal(await operator.requeue([id]), 1);
      await within(learnt, 5_000, "the requeue's marker in the watch");
    }
    return written;
  });
  const outbox = fixture.outbox({ kv });
  await outbox.enqueue(record(id));
  const [claim] = await outbox.claimDue(1, new Date());
  await outbox.watch((work) => {
    if (work.id === id) seen?.();
  });
  assert.equal(await outbox.markDead(claim, { error: "no stream", now: new Date() }), true);
  assert.ok(requeued);
  assert.equal((await outbox.get(id))?.state, "pending");
  assert.ok(await markerExists(fixture.kv, id), "the requeued message keeps its marker");
  const [again] = await outbox.claimDue(1, new Date());
  assert.equal(again?.id, id, "and this process claims it again");
});

Deno.test("nats kv: a claim that read a stale dead record drops only the marker it saw (item 4)", async () => {
  await using fixture = await openKvFixture();
  const id = "race-stale";
  const recordKey = await outboxRecordKey(id);
  const setup = fixture.outbox({ kv: fixture.peerKv });
  await setup.enqueue(record(id));
  const [claim] = await setup.claimDue(1, new Date());
  assert.equal(await setup.markDead(claim, { error: "x", now: new Date() }), true);
  // A marker left behind for the dead record (as after a crash before the cleanup).
  await fixture.kv.put(markerKeyOf(recordKey), JSON.stringify({ v: 1, id }));

  let requeued = false;
  let seen: (() => void) | undefined;
  // The claim reads the dead record; before it acts on it, the operator requeues the message
  // and this process's watch applies the new marker.
  const kv = intercept(fixture.kv, "get", (get) => async (key: string) => {
    const entry = await get(key) as KvEntry | null;
    if (key === recordKey && !requeued) {
      requeued = true;
      const learnt = new Promise<void>((resolve) => (seen = resolve));
      assert.equal(await setup.requeue([id]), 1);
      await within(learnt, 5_000, "the requeue's marker in the watch");
    }
    return entry;
  });
  const outbox = fixture.outbox({ kv });
  await outbox.watch((work) => {
    if (work.id === id && requeued) seen?.();
  });
  assert.deepEqual(await outbox.claimDue(1, new Date()), [], "the stale read claims nothing");
  assert.ok(requeued);
  assert.ok(await markerExists(fixture.kv, id), "the requeue's marker stays");
  const [again] = await outbox.claimDue(1, new Date());
  assert.equal(again?.id, id, "this process still knows the message and claims it");
});

Deno.test("nats kv: two marks of one id in one markMany: the first decides, in input order (item 5)", async () => {
  await using fixture = await openKvFixture();
  const claimer = fixture.outbox();
  const settler = fixture.outbox({ kv: fixture.peerKv }); // no claim cache: reads, then writes
  const ids = Array.from({ length: 10 }, (_, i) => `dup-${i}`);
  await claimer.enqueueMany(ids.map(record));
  const claims = await claimer.claimDue(10, new Date());
  for (const [i, claim] of claims.entries()) {
    const store = i % 2 === 0 ? claimer : settler;
    const now = new Date();
    const results = await store.markMany([
      { claim, state: "dead", error: "first" },
      { claim, state: "dispatched" },
      { claim, state: "dead", error: "third" },
    ], now);
    assert.deepEqual(results, [true, false, true], claim.id);
    const stored = await claimer.get(claim.id);
    assert.equal(stored?.state, "dead");
    assert.equal(stored?.lastError, "first");
  }
});

Deno.test("nats kv: the orphan-marker grace is measured on the server's clock (item 8)", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox({ orphanGraceMs: 60_000 });
  await outbox.enqueue(record("live"));
  // A marker whose record write is still in flight (no record yet), written just now.
  const orphanKey = markerKeyOf(await outboxRecordKey("in-flight"));
  await fixture.kv.put(orphanKey, JSON.stringify({ v: 1, id: "in-flight" }));
  // This process's clock runs two minutes ahead of the server's.
  const realNow = Date.now;
  Date.now = () => realNow() + 120_000;
  try {
    const claimed = await outbox.claimDue(10, new Date(realNow()));
    assert.deepEqual(claimed.map((m) => m.id), ["live"]);
  } finally {
    Date.now = realNow;
  }
  const marker = await fixture.kv.get(orphanKey);
  assert.equal(marker?.operation, "PUT", "a marker younger than the grace (server time) stays");
  // With no grace, the same marker is an orphan and goes.
  const strict = fixture.outbox({ orphanGraceMs: 0 });
  await strict.claimDue(10, new Date());
  assert.notEqual((await fixture.kv.get(orphanKey))?.operation, "PUT");
});

Deno.test("nats kv: a requeue ends the claims before it, also for a claimer that writes no token", async () => {
  await using fixture = await openKvFixture();
  const id = "rolling";
  const key = await outboxRecordKey(id);
  const outbox = fixture.outbox();
  await outbox.enqueue(record(id));
  const now = new Date();
  // This process dead-letters its claim; the reply of the mark is lost, so it will retry it.
  const [claim] = await outbox.claimDue(1, now);
  assert.equal(await outbox.markDead(claim, { error: "refused", now }), true);
  assert.equal(await outbox.requeue([id], now), 1);
  // An older library version (during a rolling upgrade) claims the requeued message the way it
  // did: the record copied, state and attempts changed, no token written.
  const got = await fixture.peerKv.get(key);
  const stored = JSON.parse(new TextDecoder().decode(got!.value));
  await fixture.peerKv.update(
    key,
    JSON.stringify({
      ...stored,
      state: "claimed",
      attempts: stored.attempts + 1,
      updatedAt: now.toISOString(),
      nextAttemptAt: new Date(now.getTime() + 30_000).toISOString(),
    }),
    got!.revision,
  );
  assert.equal(
    await outbox.markDead(claim, { error: "refused", now }),
    false,
    "the retried mark of the claim before the requeue is superseded",
  );
  assert.equal((await outbox.get(id))?.state, "claimed", "the other process keeps its claim");
});
