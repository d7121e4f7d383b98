/**
 * NATS KV ordering keys under interleavings found by an adversarial review, on a real bucket with
 * two store instances: a join that lands after its message was already settled, and a settled
 * message whose marker outlived its settlement (a crash or a failed delete after its hand-over)
 * picked as its key's next head by the other instance, and a skip racing a retry of one dead head.
 */

import assert from "node:assert/strict";
import type { OutboxRecord } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import {
  claimEach,
  intercept,
  isKeyEntry,
  openKvFixture,
  twoInstancesOverKey,
} from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("rv", orderingKey);

/** A delete of the bucket that fails. */
const failedDelete = (): Promise<void> => Promise.reject(new Error("delete failed (simulated)"));

Deno.test("nats kv ordering review: a join that lands after its message was claimed, dispatched and handed over does not make it head again", async () => {
  await using fixture = await openKvFixture();
  const k = "late-join";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim1.id, m1.id);
  let raced = false;
  // The producer stored m2 and its marker; before its join's write lands (a paused process),
  // the other instance dispatches m1, hands over to m2, claims and dispatches m2 too.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    if (isKeyEntry(key) && !raced) {
      raced = true;
      assert.equal(await dispatcher.markDispatched(claim1, new Date()), true);
      const [claim2] = await dispatcher.claimDue(10, new Date());
      assert.equal(claim2?.id, m2.id);
      assert.equal(await dispatcher.markDispatched(claim2, new Date()), true);
    }
    return await update(key, data, revision);
  });
  const producer = fixture.outbox({ kv });
  await producer.blockedKeys(); // its index knows m1 heads the key: the join is a touch
  await producer.enqueue(m2);
  assert.ok(raced, "the dispatches ran inside the join");
  await producer.enqueue(m3);
  const claims = [
    ...await dispatcher.claimDue(10, new Date()),
    ...await producer.claimDue(10, new Date()),
  ];
  assert.deepEqual(claims.map((m) => m.id), [m3.id], "m3 heads the key: not stranded");
});

Deno.test("nats kv ordering review: a dispatched message whose marker outlived its hand-over never heads its key again", async () => {
  await using fixture = await openKvFixture();
  const k = "stale-dispatched-marker";
  const [d, e, f] = [keyed(k), keyed(k), keyed(k)];
  // The instance dispatching d loses its marker delete (a crash right after the hand-over, or a
  // failed delete): the marker stays in the bucket and in the other instance's index.
  const { a, b } = await twoInstancesOverKey(fixture, [d, e, f], failedDelete);
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(claimD.id, d.id);
  assert.equal(await a.markDispatched(claimD, new Date(), undefined, { sequence: 5 }), true);
  const [claimE] = await claimEach([b, a]);
  assert.equal(claimE?.id, e.id);
  assert.equal(claimE.keySequence, 5);
  assert.equal(await b.markDispatched(claimE, new Date(), undefined, { sequence: 6 }), true);
  const claims = await claimEach([b, a]);
  const next = claims.length > 0 ? claims : await claimEach([b, a]);
  assert.deepEqual(next.map((m) => m.id), [f.id]);
  assert.equal(next[0].keySequence, 6, "f's key sequence is e's PubAck, not d's");
});

Deno.test("nats kv ordering review: a skipped message whose marker outlived its dead mark does not block its key again", async () => {
  await using fixture = await openKvFixture();
  const k = "stale-dead-marker";
  const [d, e, f] = [keyed(k), keyed(k), keyed(k)];
  const { a, b } = await twoInstancesOverKey(fixture, [d, e, f], failedDelete);
  const [claimD] = await a.claimDue(10, new Date());
  assert.equal(await a.markDead(claimD, { error: "poison", now: new Date() }), true);
  assert.equal(await b.unblockKey(k, { action: "skip" }), true);
  const [claimE] = await claimEach([b, a]);
  assert.equal(claimE?.id, e.id);
  assert.equal(await b.markDispatched(claimE, new Date()), true);
  const claimed: string[] = [];
  for (let round = 0; round < 2 && claimed.length === 0; round++) {
    claimed.push(...(await b.claimDue(10, new Date())).map((m) => m.id));
    claimed.push(...(await a.claimDue(10, new Date())).map((m) => m.id));
  }
  assert.deepEqual(claimed, [f.id], "f heads the key after e");
  assert.deepEqual(await b.blockedKeys(), [], "the skipped d does not block its key again");
  assert.equal(await b.unblockKey(k, { action: "retry" }), false);
});

Deno.test("nats kv ordering review: a skip racing a retry of the same dead head leaves one head", async () => {
  await using fixture = await openKvFixture();
  // "hand-over": the retry runs just before the skip's key entry write; "record": just before
  // the skip's first write of the dead record (the retry then wins and the skip does nothing).
  for (const moment of ["hand-over", "record"] as const) {
    const k = `skip-vs-retry-${moment}`;
    const [x, y] = [keyed(k), keyed(k)];
    const xKey = await outboxRecordKey(x.id);
    const admin = fixture.outbox({ kv: fixture.peerKv });
    const dispatcher = fixture.outbox();
    let raced = false;
    const claimedInside: string[] = [];
    // The skipping instance has read the key entry and found x dead; before its write lands,
    // another operator retries x and a dispatcher claims what heads the key.
    const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
      const hit = moment === "hand-over" ? isKeyEntry(key) : key === xKey;
      if (hit && !raced) {
        raced = true;
        assert.equal(await admin.unblockKey(k, { action: "retry" }), true);
        claimedInside.push(...(await dispatcher.claimDue(10, new Date())).map((m) => m.id));
      }
      return await update(key, data, revision);
    });
    const skipper = fixture.outbox({ kv });
    await dispatcher.enqueueMany([x, y]);
    const [claimX] = await dispatcher.claimDue(10, new Date());
    assert.equal(claimX.id, x.id);
    assert.equal(await dispatcher.markDead(claimX, { error: "poison", now: new Date() }), true);
    const skipped = await skipper.unblockKey(k, { action: "skip" });
    assert.ok(raced);
    const claimedAfter = [
      ...await dispatcher.claimDue(10, new Date()),
      ...await admin.claimDue(10, new Date()),
      ...await skipper.claimDue(10, new Date()),
    ].map((m) => m.id);
    const inFlight = [...claimedInside, ...claimedAfter];
    assert.equal(inFlight.length, 1, `one message of the key in flight at a time, got ${inFlight}`);
    // Retried first: the skip does not apply and x, retried, heads the key. Skipped first: the
    // retry finishes the skip's hand-over, y heads the key and x waits behind it.
    assert.deepEqual([skipped, inFlight[0]], moment === "record" ? [false, x.id] : [true, y.id]);
  }
});

Deno.test("nats kv ordering review: a retry of a blocked key whose marker write failed is healed by the next retry or blockedKeys()", async () => {
  await using fixture = await openKvFixture();
  for (const heal of ["retry again", "blockedKeys"] as const) {
    const k = `failed-retry-${heal === "blockedKeys" ? "b" : "r"}`;
    const [x, y] = [keyed(k), keyed(k)];
    const xMarker = markerKeyOf(await outboxRecordKey(x.id));
    let failed = false;
    // The retry's requeue wrote x pending; its marker write then failed (the key entry still
    // names x head, and x is no longer dead: not blocked, and without a marker never claimed).
    const kv = intercept(fixture.kv, "put", (put) => async (key, ...rest) => {
      if (key === xMarker && !failed) {
        failed = true;
        throw new Error("marker write failed (simulated)");
      }
      return await put(key, ...rest);
    });
    const admin = fixture.outbox({ kv });
    const dispatcher = fixture.outbox({ kv: fixture.peerKv });
    await dispatcher.enqueueMany([x, y]);
    const [claimX] = await dispatcher.claimDue(10, new Date());
    assert.equal(await dispatcher.markDead(claimX, { error: "poison", now: new Date() }), true);
    await assert.rejects(admin.unblockKey(k, { action: "retry" }), /marker write failed/);
    assert.deepEqual(await dispatcher.claimDue(10, new Date()), [], "x is stuck without a marker");
    if (heal === "retry again") await admin.unblockKey(k, { action: "retry" });
    else assert.deepEqual(await admin.blockedKeys(), [], "x is not dead: the key is not blocked");
    const claims = await dispatcher.claimDue(10, new Date());
    assert.deepEqual(claims.map((m) => m.id), [x.id], `${heal}: x heads its key and is claimed`);
  }
});

Deno.test("nats kv ordering review: a keyed enqueue that died between its marker and its join is claimed after the grace, before the key's next message", async () => {
  await using fixture = await openKvFixture();
  const k = "never-joined";
  const [x, y] = [keyed(k), keyed(k)];
  let killed = true;
  // The producer's process dies after record and marker, before the key entry write.
  const kv = intercept(fixture.kv, "create", (create) => async (key, ...rest) => {
    if (killed && isKeyEntry(key)) throw new Error("process killed (simulated)");
    return await create(key, ...rest);
  });
  const producer = fixture.outbox({ kv });
  await assert.rejects(producer.enqueue(x), /process killed/);
  killed = false;
  const dispatcher = fixture.outbox({ kv: fixture.peerKv, orphanGraceMs: 200 });
  const claimed: string[] = [];
  for (let round = 0; round < 50 && claimed.length === 0; round++) {
    claimed.push(...(await dispatcher.claimDue(10, new Date())).map((m) => m.id));
    if (claimed.length === 0) await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.deepEqual(claimed, [x.id], "x is not stranded");
  await producer.enqueue(y);
  assert.deepEqual(await dispatcher.claimDue(10, new Date()), [], "y waits behind x");
});
