/**
 * The broker-side key fence's store half on the NATS KV outbox (#18, /work's fence interface): a
 * keyed claim carries its key's last stream sequence (`keySequence`), which the key's entry keeps
 * and the hand-over writes in the same compare-and-set as the new head; only marks that apply
 * change it; `dead` forgets it. On a real bucket, with two store instances where it matters.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import type { OutboxMessage, OutboxRecord } from "../mod.ts";
import { keyEntryPrefix } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { countingKv, newCounts, openKvFixture } from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string | undefined): OutboxRecord => keyedRecord("kf", orderingKey);

function at(base: Date, ms: number): Date {
  return new Date(base.getTime() + ms);
}

async function claimOnly(
  outbox: { claimDue(limit: number, now: Date): Promise<OutboxMessage[]> },
  id: string,
  now: Date,
): Promise<OutboxMessage> {
  const claimed = await outbox.claimDue(10, now);
  assert.deepEqual(claimed.map((message) => message.id), [id]);
  return claimed[0];
}

Deno.test("nats kv fence: keyed claims carry the key's last sequence; marks that apply set it", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const peer = fixture.outbox({ kv: fixture.peerKv });
  const k = "fence-a";
  const [a, b, c, d, e] = [keyed(k), keyed(k), keyed(k), keyed(k), keyed(k)];
  const plain = keyed(undefined);
  await outbox.enqueueMany([a, b, c, d, e, plain]);
  const t0 = new Date();
  const first = await outbox.claimDue(10, t0);
  assert.deepEqual(first.map((m) => m.id), [a.id, plain.id]);
  for (const message of first) assert.equal("keySequence" in message, false);
  assert.deepEqual(
    await outbox.markMany([
      { claim: first[0], state: "dispatched", sequence: 41 },
      { claim: first[1], state: "dispatched", sequence: 42 },
    ], t0),
    [true, true],
  );
  // The other instance learns it through its watch.
  const claimB = await claimOnly(peer, b.id, at(t0, 1));
  assert.equal(claimB.keySequence, 41);
  // A failed attempt keeps it; a replayed mark and a superseded one change nothing.
  assert.equal(
    await peer.markFailed(claimB, { error: "x", now: at(t0, 2), nextAttemptAt: at(t0, 3) }),
    true,
  );
  const againB = await claimOnly(outbox, b.id, at(t0, 4));
  assert.equal(againB.keySequence, 41);
  assert.equal(await outbox.markDispatched(againB, at(t0, 5), undefined, { sequence: 7 }), true);
  assert.equal(await outbox.markDispatched(againB, at(t0, 5), undefined, { sequence: 99 }), true);
  assert.equal(await peer.markDispatched(claimB, at(t0, 5), undefined, { sequence: 98 }), false);
  const claimC = await claimOnly(peer, c.id, at(t0, 6));
  assert.equal(claimC.keySequence, 7, "overwritten even though smaller; replays ignored");
  // Without a sequence (a job): unchanged.
  assert.equal(await peer.markDispatched(claimC, at(t0, 7)), true);
  const claimD = await claimOnly(outbox, d.id, at(t0, 8));
  assert.equal(claimD.keySequence, 7);
  // Dead forgets it: the retried head and then the next message publish unfenced.
  assert.equal(await outbox.markDead(claimD, { error: "fence", now: at(t0, 9) }), true);
  assert.equal(await outbox.unblockKey(k, { action: "retry", now: at(t0, 10) }), true);
  const retried = await claimOnly(peer, d.id, at(t0, 11));
  assert.equal("keySequence" in retried, false, "a dead head forgot the key's sequence");
  assert.equal(await peer.markDead(retried, { error: "again", now: at(t0, 12) }), true);
  assert.equal(await peer.unblockKey(k, { action: "skip", now: at(t0, 13) }), true);
  const claimE = await claimOnly(outbox, e.id, at(t0, 14));
  assert.equal("keySequence" in claimE, false);
  assert.equal(await outbox.markDispatched(claimE, at(t0, 15), undefined, { sequence: 500 }), true);

  // Kept per key: after the key drained and its earlier dispatched messages were pruned (it was
  // used at the cutoff: e, so prune does not retire it).
  assert.ok((await outbox.prune({ dispatchedBefore: at(t0, 15) })).dispatched);
  const f = keyed(k);
  await peer.enqueue(f);
  const claimF = await claimOnly(peer, f.id, new Date());
  assert.equal(claimF.keySequence, 500);
  // Idle since a later cutoff: retired, the key's next message is its first again.
  assert.equal(await peer.markDispatched(claimF, at(t0, 16)), true);
  assert.ok((await outbox.prune({ dispatchedBefore: at(t0, 17) })).dispatched);
  const g = keyed(k);
  await peer.enqueue(g);
  assert.equal("keySequence" in await claimOnly(outbox, g.id, new Date()), false);
});

Deno.test("nats kv fence: an invalid sequence is refused before any mark of the batch applies", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const [a, b] = [keyed("fence-v1"), keyed("fence-v2")];
  await outbox.enqueueMany([a, b]);
  const now = new Date();
  const [claimA, claimB] = await outbox.claimDue(10, now);
  for (const bad of [0, -1, 1.5, Number.NaN, "3", Number.MAX_SAFE_INTEGER + 1]) {
    await assert.rejects(
      outbox.markMany([
        { claim: claimA, state: "dispatched", sequence: 3 },
        { claim: claimB, state: "dispatched", sequence: bad as number },
      ], now),
      { name: "OutboxValidationError" },
    );
    await assert.rejects(
      outbox.markDispatched(claimB, now, undefined, { sequence: bad as number }),
      { name: "OutboxValidationError" },
    );
  }
  assert.equal((await outbox.get(a.id))?.state, "claimed", "nothing applied");
  assert.equal((await outbox.get(b.id))?.state, "claimed");
});

for (const markerCopies of [false, true]) {
  Deno.test(`nats kv fence${markerCopies ? " (marker copies)" : ""}: a hand-over finished later (lost write, claim heals it) keeps the mark's sequence; the claim reads nothing more`, async () => {
    await using fixture = await openKvFixture({ markerCopies });
    const k = "fence-heal";
    const [a, b, c] = [keyed(k), keyed(k), keyed(k)];
    let failed = false;
    let armed = false;
    // The hand-over's write of the key entry fails once (not applied).
    const kv: KV = new Proxy(fixture.kv, {
      get(target, property) {
        const value = Reflect.get(target, property, target);
        if (property !== "update" || typeof value !== "function") {
          return typeof value === "function" ? value.bind(target) : value;
        }
        return (key: string, data: Uint8Array, revision: number) => {
          if (key.startsWith(`${keyEntryPrefix}.`) && armed && !failed) {
            failed = true;
            return Promise.reject(new Error("connection lost (simulated)"));
          }
          return value.call(target, key, data, revision);
        };
      },
    });
    const outbox = fixture.outbox({ kv });
    await outbox.enqueueMany([a, b, c]);
    const now = new Date();
    const [claimA] = await outbox.claimDue(10, now);
    armed = true;
    assert.equal(await outbox.markDispatched(claimA, now, undefined, { sequence: 1234 }), true);
    assert.ok(failed);
    // The next claim finds the head's marker, its record dispatched: it hands over (with the
    // sequence the mark recorded), then claims b.
    const counts = newCounts();
    const peer = fixture.outbox({ kv: countingKv(fixture.peerKv, counts) });
    const claimB = await claimOnly(peer, b.id, new Date());
    assert.equal(claimB.keySequence, 1234);
    await peer.markDispatched(claimB, new Date(), undefined, { sequence: 1300 });
    const before = counts.calls.get ?? 0;
    const claimC = await claimOnly(peer, c.id, new Date());
    assert.equal(claimC.keySequence, 1300);
    // The sequence comes with the key entry the index holds; with copies, c's marker carries its
    // record too.
    assert.equal(
      (counts.calls.get ?? 0) - before,
      markerCopies ? 0 : 1,
      markerCopies ? "no read" : "one read: c's record (the sequence is free)",
    );
  });
}

Deno.test("nats kv fence: skipping a dead head releases the next message without a sequence", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const k = "fence-skip";
  const [a, b, c] = [keyed(k), keyed(k), keyed(k)];
  await outbox.enqueueMany([a, b, c]);
  const t0 = new Date();
  const claimA = await claimOnly(outbox, a.id, t0);
  assert.equal(await outbox.markDispatched(claimA, t0, undefined, { sequence: 10 }), true);
  const claimB = await claimOnly(outbox, b.id, at(t0, 1));
  assert.equal(claimB.keySequence, 10);
  assert.equal(await outbox.markDead(claimB, { error: "key_fence", now: at(t0, 2) }), true);
  assert.equal(await outbox.unblockKey(k, { action: "skip", now: at(t0, 3) }), true);
  const claimC = await claimOnly(outbox, c.id, at(t0, 4));
  assert.equal("keySequence" in claimC, false);
});
