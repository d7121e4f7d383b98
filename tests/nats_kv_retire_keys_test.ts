/**
 * NATS KV: prune retiring idle ordering keys (their `q._k` entries) racing joins, on a real
 * bucket with two store instances. The race is placed by intercepting the join's
 * compare-and-set on the key entry, so the interleaving is chosen, not timed.
 */

import assert from "node:assert/strict";
import type { OutboxRecord } from "../mod.ts";
import { ActiveIndex } from "../src/stores/nats_kv/active_index.ts";
import { keyEntryPrefix } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { dispatchBothAndRetire, intercept, isKeyEntry, openKvFixture } from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("rk", orderingKey);
const old = () => new Date(Date.now() - 120_000);
const cutoff = () => new Date(Date.now() - 60_000);

Deno.test("nats kv retire keys: a join whose compare-and-set loses to the retirement creates the head again; the message flows unfenced", async () => {
  await using fixture = await openKvFixture();
  const k = "join-vs-retire";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, old());
  assert.equal(await dispatcher.markDispatched(claim1, old(), undefined, { sequence: 7 }), true);
  let raced = false;
  // The producer's index knows the key's entry (no head); just before its join's write lands,
  // the other instance prunes and retires the key.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    if (isKeyEntry(key) && !raced) {
      raced = true;
      assert.equal((await dispatcher.prune({ dispatchedBefore: cutoff() })).dispatched, 1);
    }
    return await update(key, data, revision);
  });
  const producer = fixture.outbox({ kv });
  await producer.blockedKeys(); // syncs its index: it knows the entry
  await producer.enqueue(m2);
  assert.ok(raced, "the retirement ran inside the join");
  await producer.enqueue(m3);
  const [claim2] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim2?.id, m2.id, "m2 heads its key: not stranded");
  assert.equal(claim2.keySequence, undefined, "the retired key starts over");
  assert.deepEqual(await dispatcher.claimDue(10, new Date()), [], "m3 waits behind m2");
  assert.equal(
    await dispatcher.markDispatched(claim2, new Date(), undefined, { sequence: 8 }),
    true,
  );
  const [claim3] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim3?.id, m3.id);
  assert.equal(claim3.keySequence, 8);
});

Deno.test("nats kv retire keys: a join that lands after its message was settled and its key retired does not make it head again", async () => {
  await using fixture = await openKvFixture();
  const k = "late-join-retired";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, old());
  let raced = false;
  // The producer stored m2 and its marker; before its join lands, the other instance dispatches
  // m1 (handing over to m2), claims and dispatches m2 (no next: the key has no head), and a
  // prune retires the key.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    if (isKeyEntry(key) && !raced) {
      raced = true;
      await dispatchBothAndRetire(dispatcher, claim1, m2.id);
    }
    return await update(key, data, revision);
  });
  const producer = fixture.outbox({ kv });
  await producer.blockedKeys();
  await producer.enqueue(m2);
  assert.ok(raced, "the dispatches and the prune ran inside the join");
  await producer.enqueue(m3);
  const claims = [
    ...await dispatcher.claimDue(10, new Date()),
    ...await producer.claimDue(10, new Date()),
  ];
  assert.deepEqual(claims.map((m) => m.id), [m3.id], "m3 heads the key: not stranded");
});

Deno.test("nats kv retire keys: a key joined before the prune keeps its entry and sequence", async () => {
  await using fixture = await openKvFixture();
  const k = "joined-first";
  const [m1, m2] = [keyed(k), keyed(k)];
  const a = fixture.outbox();
  const b = fixture.outbox({ kv: fixture.peerKv });
  await a.enqueue(m1);
  const [claim1] = await a.claimDue(10, old());
  assert.equal(await a.markDispatched(claim1, old(), undefined, { sequence: 5 }), true);
  await a.enqueue(m2);
  // Two pruners at once: the key has a head (m2), so neither retires it.
  const [p1, p2] = await Promise.all([
    a.prune({ dispatchedBefore: cutoff() }),
    b.prune({ dispatchedBefore: cutoff(), batchSize: 1 }),
  ]);
  assert.equal(p1.dispatched + p2.dispatched, 1);
  const [claim2] = await b.claimDue(10, new Date());
  assert.equal(claim2?.id, m2.id);
  assert.equal(claim2.keySequence, 5);
});

Deno.test("nats kv retire keys: a running claimer's index forgets the keys prune retired, and the next prune leaves none of their entries in the bucket", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  // A claimer's index that runs through the prunes (on the other connection).
  const index = new ActiveIndex(fixture.peerKv, 5_000);
  try {
    await index.ready();
    const keys = Array.from({ length: 20 }, (_, i) => `retired-${i}`);
    await outbox.enqueueMany(keys.map(keyed));
    const claims = await outbox.claimDue(100, old());
    assert.equal(claims.length, keys.length);
    for (const claim of claims) assert.equal(await outbox.markDispatched(claim, old()), true);
    await index.sync();
    assert.equal(index.keyStates().length, keys.length, "the index saw the keys' entries");
    const future = new Date(Date.now() + 60_000);
    assert.equal((await outbox.prune({ dispatchedBefore: future })).dispatched, keys.length);
    await index.sync();
    // A key entry removed without the index hearing of it stayed in its memory until a restart:
    // one state per ordering key ever used, in every running relay.
    assert.deepEqual(index.keyStates().map((state) => state.value.key), []);
    // The next prune removes what the retirement left (its tombstones): a new claimer's watch
    // does not replay the retired keys.
    await outbox.prune({ dispatchedBefore: future });
    const left: string[] = [];
    const iterator = await fixture.kv.history({ key: `${keyEntryPrefix}.>` });
    for await (const entry of iterator) left.push(`${entry.key} ${entry.operation}`);
    assert.deepEqual(left, []);
  } finally {
    await index.close();
  }
});
