/**
 * NATS KV ordering keys whose head has no marker in any index: a dispatched message named its
 * key's head by a hand-over whose index still held its marker while the marker's delete was on
 * its way (late) or lost (the dispatching process forgets the marker as it sends the delete).
 * No claim reads a head through a marker that is gone, so claims must read such a head's record
 * and hand the key over; a dead head keeps blocking its key, and idle claims do not read it again.
 */

import assert from "node:assert/strict";
import type { NatsKvOutboxRepository, OutboxMessage, OutboxRecord } from "../mod.ts";
import { keyedRecord } from "./conformance/records.ts";
import { sleep } from "./kit/mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import {
  claimEach,
  countingKv,
  intercept,
  type KvFixture,
  newCounts,
  openKvFixture,
  twoInstancesOverKey,
} from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("st", orderingKey);

/** Up to three rounds of claims by every repository, until one claims something. */
async function claimRounds(repositories: NatsKvOutboxRepository[]): Promise<OutboxMessage[]> {
  for (let round = 0; round < 3; round++) {
    const got = await claimEach(repositories);
    if (got.length > 0) return got;
  }
  return [];
}

/**
 * d, e and f enqueued on `k` over two instances (a, b); a claims d and dispatches it while its
 * delete of d's marker is held (sent, not yet applied) until `release`.
 */
async function dispatchWithHeldDelete(fixture: KvFixture, k: string): Promise<{
  a: NatsKvOutboxRepository;
  b: NatsKvOutboxRepository;
  e: OutboxRecord;
  f: OutboxRecord;
  sent(): boolean;
  release(): Promise<void>;
}> {
  const [d, e, f] = [keyed(k), keyed(k), keyed(k)];
  let release: (() => Promise<void>) | undefined;
  const { a, b } = await twoInstancesOverKey(fixture, [d, e, f], (send) => {
    release = send;
    return Promise.resolve();
  });
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await a.markDispatched(claimD, new Date(), undefined, { sequence: 5 }), true);
  return { a, b, e, f, sent: () => release !== undefined, release: () => release!() };
}

Deno.test("nats kv stalled key: a marker delete that lands after the peer's hand-over named its dispatched message head does not stop the key", async () => {
  await using fixture = await openKvFixture();
  const { a, b, e, f, sent, release } = await dispatchWithHeldDelete(fixture, "late-delete");
  assert.ok(sent(), "a sent d's marker delete");
  const [claimE] = await claimEach([b, a]);
  assert.equal(claimE?.id, e.id);
  // b's index still holds d's marker: its hand-over from e names d (dispatched) head.
  assert.equal(await b.markDispatched(claimE, new Date(), undefined, { sequence: 6 }), true);
  await release(); // the delete lands: no index holds d's marker any more
  const c = fixture.outbox();
  const next = await claimRounds([a, b, c]);
  assert.deepEqual(next.map((m) => m.id), [f.id], "f is claimed: the key did not stall");
  assert.equal(next[0].keySequence, 6, "f's key sequence is e's PubAck");
});

Deno.test("nats kv stalled key: a lost marker delete does not stop the key once the peer that named the dispatched message head is gone", async () => {
  await using fixture = await openKvFixture();
  const k = "lost-delete";
  const [d, e, f] = [keyed(k), keyed(k), keyed(k)];
  // a's delete of d's marker is lost (never applied); a forgets the marker as it sends it.
  const { a, b } = await twoInstancesOverKey(fixture, [d, e, f], () => Promise.resolve());
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await a.markDispatched(claimD, new Date(), undefined, { sequence: 5 }), true);
  const [claimE] = await claimEach([b, a]);
  assert.equal(claimE?.id, e.id);
  assert.equal(await b.markDispatched(claimE, new Date(), undefined, { sequence: 6 }), true);
  await b.close(); // the only index that holds d's marker stops
  const next = await claimRounds([a]);
  assert.deepEqual(next.map((m) => m.id), [f.id], "a claims f: the key did not stall");
  assert.equal(next[0].keySequence, 6, "f's key sequence is e's PubAck");
  assert.equal(await a.markDispatched(next[0], new Date(), undefined, { sequence: 7 }), true);
  assert.deepEqual(await claimRounds([a]), [], "nothing else of the key is claimable");
});

Deno.test("nats kv stalled key: a dead head keeps blocking its key and idle claims read it once", async () => {
  await using fixture = await openKvFixture();
  const k = "dead-head";
  const [d, e] = [keyed(k), keyed(k)];
  const counts = newCounts();
  const a = fixture.outbox({ kv: countingKv(fixture.kv, counts) });
  await a.enqueueMany([d, e]);
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await a.markDead(claimD, { error: "boom", now: new Date() }), true);
  assert.deepEqual(await claimRounds([a]), [], "the dead head blocks e");
  const before = counts.calls.get ?? 0;
  for (let i = 0; i < 5; i++) assert.deepEqual(await a.claimDue(10, new Date()), []);
  assert.equal((counts.calls.get ?? 0) - before, 0, "idle claims do not read the dead head again");
  const blocked = await fixture.outbox().blockedKeys();
  assert.deepEqual(blocked.map((item) => [item.key, item.headId]), [[k, d.id]]);
});

Deno.test("nats kv stalled key: a dispatched head left without a marker by a late delete is handed over while every claim is full (a backlog)", async () => {
  await using fixture = await openKvFixture();
  const { a, b, e, f, release } = await dispatchWithHeldDelete(fixture, "busy");
  const [claimE] = await claimEach([b, a]);
  assert.equal(claimE?.id, e.id);
  // b's index still holds d's marker: its hand-over from e names d (dispatched) head.
  assert.equal(await b.markDispatched(claimE, new Date(), undefined, { sequence: 6 }), true);
  await release(); // no index holds d's marker any more: only a read of d's record moves the key
  // A backlog of unkeyed messages: every claim below is full, none runs out of due messages.
  const backlog = Array.from({ length: 40 }, () => keyedRecord("bl", undefined));
  await a.enqueueMany(backlog);
  await sleep(1_100); // longer than the index needs to see its own writes
  const order: string[] = [];
  for (let round = 0; round < 6; round++) {
    const claimed = await a.claimDue(5, new Date());
    assert.equal(claimed.length, 5, "a full claim: the backlog is not drained");
    for (const message of claimed) {
      order.push(message.id);
      assert.equal(await a.markDispatched(message, new Date()), true);
    }
  }
  assert.ok(order.includes(f.id), "f is claimed while the backlog lasts: the key did not stall");
});

Deno.test("nats kv stalled key: a dead head retried by a peer whose marker write failed is claimed by a claimer that had read it dead", async () => {
  await using fixture = await openKvFixture();
  const k = "retry-unmarked";
  const [d, e] = [keyed(k), keyed(k)];
  const a = fixture.outbox({ orphanGraceMs: 300 });
  await a.enqueueMany([d, e]);
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await a.markDead(claimD, { error: "boom", now: new Date() }), true);
  assert.deepEqual(await claimRounds([a]), [], "the dead head blocks e (a has read it dead)");
  // b retries d: its record is pending again, but the marker write fails (as a crash would).
  const dMarker = markerKeyOf(await outboxRecordKey(d.id));
  const failing = intercept(fixture.kv, "put", (put) => (key, ...rest) => {
    if (key === dMarker) return Promise.reject(new Error("injected: marker write failed"));
    return put(key, ...rest);
  });
  const b = fixture.outbox({ kv: failing });
  await assert.rejects(b.unblockKey(k, { action: "retry" }), /marker write failed/);
  assert.equal((await a.get(d.id))?.state, "pending");
  // a's claims (idle, the key entry unchanged) must read d again: nothing else would take it.
  let claimed: OutboxMessage[] = [];
  for (let round = 0; round < 20 && claimed.length === 0; round++) {
    claimed = await a.claimDue(10, new Date());
    if (claimed.length === 0) await sleep(100);
  }
  assert.deepEqual(claimed.map((m) => m.id), [d.id], "d is claimed again: its key did not stall");
});

Deno.test("nats kv stalled key: a dead head whose marker delete failed is listed by another process's blockedKeys()", async () => {
  await using fixture = await openKvFixture();
  const k = "dead-marker-left";
  const [d, e] = [keyed(k), keyed(k)];
  const dMarker = markerKeyOf(await outboxRecordKey(d.id));
  let failures = 1; // the relay's marker delete after its dead mark times out (nothing applied)
  const kv = intercept(fixture.kv, "delete", (del) => (key, ...rest) => {
    if (key === dMarker && failures-- > 0) {
      return Promise.reject(new Error("injected: delete timed out"));
    }
    return del(key, ...rest);
  });
  const relay = fixture.outbox({ kv });
  await relay.enqueueMany([d, e]);
  const [claimD] = await relay.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await relay.markDead(claimD, { error: "poison", now: new Date() }), true);
  assert.deepEqual(await claimRounds([relay]), [], "the dead head blocks e");
  // An operator's process (its index starts now: it sees whatever markers are left).
  const admin = fixture.outbox({ kv: fixture.peerKv });
  const blocked = await admin.blockedKeys();
  assert.deepEqual(blocked.map((item) => [item.key, item.headId]), [[k, d.id]]);
});
