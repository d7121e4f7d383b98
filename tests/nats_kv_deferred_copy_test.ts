/**
 * Deferred copies (`markerCopies: "deferred"`, the default): an enqueue writes an unkeyed record
 * and its marker together, returns, and then rewrites the marker with a copy of the record and
 * the revision it was stored at, by compare-and-set on the marker, keeping the message's enqueue
 * order. On a real bucket, with the relay on its own connection: the first claim reads no record
 * and claims in enqueue order; `enqueue` does not wait for the rewrite, `close()` does; a rewrite
 * that comes after a claim leaves a stale copy that costs a failed compare-and-set and a read,
 * never a wrong write; a rewrite after a settle or a requeue writes nothing; a duplicate enqueue
 * of a settled id writes no copy; keyed records and `markerCopies: false` get none.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import type { OutboxRecord } from "../mod.ts";
import { outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { countingOutbox, entryOf, intercept, markerOf, openKvFixture } from "./nats_kv_fixture.ts";

type Fixture = Awaited<ReturnType<typeof openKvFixture>>;

const fresh = (overrides: Partial<OutboxRecord> = {}): OutboxRecord =>
  keyedRecord("dc", undefined, overrides);

/** A producer (on `kv`) whose bucket limit is known (copies need it), with nothing to claim. */
async function producerOf(fixture: Fixture, options: Parameters<Fixture["outbox"]>[0] = {}) {
  const producer = fixture.outbox(options);
  const first = fresh();
  await producer.enqueue(first);
  const [claimed] = await producer.claimDue(1, new Date());
  assert.equal(claimed?.id, first.id);
  assert.equal(await producer.markDispatched(claimed, new Date()), true);
  return producer;
}

/** `kv` whose marker rewrites (`update` or `put` of a `q.` key) wait for `release()`. */
function holdingRewrites(kv: KV) {
  let release!: () => void;
  const released = new Promise<void>((resolve) => release = resolve);
  let held = 0;
  const hold = async (key: string) => {
    if (!/^q\.[bh]/.test(key)) return; // markers, not q._sync or key entries
    held += 1;
    await released;
  };
  const updating = intercept(kv, "update", (update) => async (key, value, revision) => {
    await hold(key);
    return await update(key, value, revision);
  });
  const wrapped = intercept(updating, "put", (put) => async (key, value, options) => {
    await hold(key);
    return await put(key, value, options);
  });
  return { kv: wrapped, release, held: () => held };
}

Deno.test("nats kv deferred copy: markers get their record's copy after the enqueue, and the first claim reads no record, in enqueue order", async () => {
  await using fixture = await openKvFixture();
  const producer = await producerOf(fixture);
  const messages = Array.from({ length: 20 }, () => fresh());
  await producer.enqueueMany(messages);
  await producer.close(); // waits for the rewrites
  for (const message of messages) {
    const recordKey = await outboxRecordKey(message.id);
    const record = await entryOf(fixture.kv, recordKey);
    const marker = await markerOf(fixture.kv, message.id);
    assert.equal(marker?.rev, record?.revision);
    assert.deepEqual(marker?.r, record?.json());
    assert.equal(typeof marker?.seq, "number", "the first marker's revision: its order");
  }
  const relay = countingOutbox(fixture);
  const claimed = await relay.outbox.claimDue(20, new Date());
  assert.deepEqual(claimed.map((m) => m.id), messages.map((m) => m.id), "enqueue order");
  assert.ok(claimed.every((m) => m.attempts === 1 && m.state === "claimed"));
  assert.equal(relay.gets(), 0, "no record read");
  assert.equal(relay.updates(), 20, "one compare-and-set each");
  for (const message of claimed) {
    assert.equal(await relay.outbox.markDispatched(message, new Date()), true);
  }
  assert.equal((await relay.outbox.stats()).dispatched, 21);
});

Deno.test("nats kv deferred copy: enqueue does not wait for the rewrite, close() does", async () => {
  await using fixture = await openKvFixture();
  const holding = holdingRewrites(fixture.kv);
  const producer = await producerOf(fixture, { kv: holding.kv });
  const message = fresh();
  await producer.enqueue(message);
  assert.ok(holding.held() >= 1, "the rewrite is waiting");
  assert.equal((await markerOf(fixture.kv, message.id))?.r, undefined, "no copy yet");
  let closed = false;
  const closing = producer.close().then(() => closed = true);
  await new Promise((resolve) => setTimeout(resolve, 50));
  assert.equal(closed, false, "close() waits for the rewrite");
  holding.release();
  await closing;
  assert.ok((await markerOf(fixture.kv, message.id))?.r !== undefined);
});

Deno.test("nats kv deferred copy: a rewrite after a claim leaves a stale copy: a failed compare-and-set and a read, then the record as it is", async () => {
  await using fixture = await openKvFixture();
  const holding = holdingRewrites(fixture.kv);
  const producer = await producerOf(fixture, { kv: holding.kv });
  const message = fresh();
  await producer.enqueue(message);

  // A first relay claims before the copy is written, and lets its lease run out.
  const first = countingOutbox(fixture);
  const t0 = new Date();
  const [claimed] = await first.outbox.claimDue(10, t0, { leaseMs: 1_000 });
  assert.equal(claimed?.id, message.id);
  assert.equal(first.gets(), 1, "no copy yet: read");
  holding.release();
  await producer.close();
  const marker = await markerOf(fixture.kv, message.id);
  assert.ok(marker?.r !== undefined, "the rewrite went through (the marker was unchanged)");
  assert.equal((marker.r as { state: string }).state, "pending", "a copy older than the claim");

  // A relay that starts now holds only the stale copy: its compare-and-set fails, it reads.
  const second = countingOutbox(fixture);
  const [again] = await second.outbox.claimDue(10, new Date(t0.getTime() + 2_000));
  assert.equal(again?.id, message.id);
  assert.equal(again.attempts, 2, "claimed on top of the first claim");
  assert.equal(second.gets(), 1);
  assert.equal(second.updates(), 2, "the stale copy's failed compare-and-set, then the claim");
  assert.equal(await first.outbox.markDispatched(claimed, new Date()), false, "fenced");
  assert.equal(await second.outbox.markDispatched(again, new Date()), true);
});

Deno.test("nats kv deferred copy: a rewrite after the marker changed (settled, requeued) writes nothing", async () => {
  await using fixture = await openKvFixture();
  const holding = holdingRewrites(fixture.kv);
  const producer = await producerOf(fixture, { kv: holding.kv });
  const settledOne = fresh();
  const deadOne = fresh();
  await producer.enqueue(settledOne);
  await producer.enqueue(deadOne);
  const relay = fixture.outbox({ kv: fixture.peerKv });
  const claimed = await relay.claimDue(10, new Date());
  const byId = new Map(claimed.map((m) => [m.id, m]));
  assert.equal(await relay.markDispatched(byId.get(settledOne.id)!, new Date()), true);
  assert.equal(await relay.markDead(byId.get(deadOne.id)!, { error: "x", now: new Date() }), true);
  assert.equal(await relay.requeue([deadOne.id]), 1);
  const requeuedMarker = await markerOf(fixture.kv, deadOne.id);
  holding.release();
  await producer.close();
  assert.equal(await markerOf(fixture.kv, settledOne.id), undefined, "no marker brought back");
  assert.deepEqual(await markerOf(fixture.kv, deadOne.id), requeuedMarker, "the requeue's marker");
  assert.equal((await relay.get(settledOne.id))?.state, "dispatched");
  const [requeued] = await relay.claimDue(10, new Date());
  assert.equal(requeued?.id, deadOne.id);
  assert.equal(requeued.lastError, "x");
});

Deno.test("nats kv deferred copy: a duplicate enqueue of a settled id writes no copy and brings nothing back", async () => {
  for (const sameContent of [true, false]) {
    await using fixture = await openKvFixture();
    const producer = await producerOf(fixture);
    const message = fresh();
    await producer.enqueue(message);
    const [claimed] = await producer.claimDue(1, new Date());
    assert.equal(await producer.markDispatched(claimed, new Date()), true);
    const recordKey = await outboxRecordKey(message.id);
    const settled = await entryOf(fixture.kv, recordKey);
    const duplicate = sameContent ? message : { ...message, payload: '{"other":true}' };
    const enqueued = producer.enqueue(duplicate);
    if (sameContent) assert.equal((await enqueued).state, "dispatched");
    else await assert.rejects(enqueued, { name: "OutboxDuplicateIdentityError" });
    await producer.close();
    assert.equal(await markerOf(fixture.kv, message.id), undefined, "no marker left");
    const relay = countingOutbox(fixture);
    assert.deepEqual(await relay.outbox.claimDue(10, new Date()), []);
    assert.equal((await entryOf(fixture.kv, recordKey))?.revision, settled?.revision);
  }
});

Deno.test("nats kv deferred copy: none for a keyed record or with markerCopies false", async () => {
  await using fixture = await openKvFixture();
  const producer = await producerOf(fixture);
  const plainProducer = await producerOf(fixture, { markerCopies: false });
  const keyed = keyedRecord("dc", "key-1");
  const unkeyed = fresh();
  await producer.enqueue(keyed);
  await plainProducer.enqueue(unkeyed);
  await producer.close();
  await plainProducer.close();
  for (const id of [keyed.id, unkeyed.id]) {
    assert.equal((await markerOf(fixture.kv, id))?.r, undefined, id);
  }
  const relay = countingOutbox(fixture);
  const claimed = await relay.outbox.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.id).sort(), [keyed.id, unkeyed.id].sort());
  assert.equal(relay.gets(), 2, "both records read");
});
