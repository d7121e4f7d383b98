/**
 * NATS KV: adversarial interleavings of prune's key retirement (a tombstone) and tombstone sweep
 * with joins, on a real bucket with two store instances. Races are placed by intercepting the
 * producer's KV calls, so the interleaving is chosen, not timed.
 */

import assert from "node:assert/strict";
import type { OutboxRecord } from "../mod.ts";
import { keyEntryKey, markerPrefix } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import {
  dispatchBothAndRetire,
  intercept,
  isKeyEntry,
  type KvFixture,
  openKvFixture,
} from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("sr", orderingKey);
const old = () => new Date(Date.now() - 120_000);

/**
 * m1 is claimed by `dispatcher`; the producer enqueues m2, and once m2's marker is written (before
 * m2 joins its key) the dispatcher dispatches m1 and m2 and a prune retires the key with a
 * tombstone. With `producerIndex`, the producer's index runs and sees the tombstone before the
 * join reads it; without, the producer never claims (its index never starts). Checks that the
 * dispatched m2 is not named head of its retired key, then enqueues m3.
 */
async function lateJoinAfterRetirement(fixture: KvFixture, k: string, producerIndex: boolean) {
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, old());
  let raced = false;
  const kv = intercept(fixture.kv, "create", (create) => async (key, data, ttl) => {
    const seq = await create(key, data, ttl);
    if (key.startsWith(`${markerPrefix}.`) && !isKeyEntry(key) && !raced) {
      raced = true;
      await dispatchBothAndRetire(dispatcher, claim1, m2.id);
      if (producerIndex) await producer.blockedKeys(); // its index sees the tombstone
    }
    return seq;
  });
  const producer = fixture.outbox({ kv });
  if (producerIndex) await producer.blockedKeys(); // starts its index
  await producer.enqueue(m2);
  assert.ok(raced, "the dispatches and the prune ran inside the enqueue");
  const entry = await fixture.kv.get(await keyEntryKey(k));
  const head = entry?.operation === "PUT" ? entry.json<{ head?: string }>().head : undefined;
  assert.notEqual(head, m2.id, "the dispatched m2 is not named head of its retired key");
  await producer.enqueue(m3);
  return { dispatcher, producer, m3 };
}

Deno.test("nats kv sweep review: a late join whose index already saw its key's retirement tombstone does not name its settled message head", async () => {
  await using fixture = await openKvFixture();
  const { dispatcher, producer, m3 } = await lateJoinAfterRetirement(
    fixture,
    "late-join-saw-tombstone",
    true,
  );
  const claims = [
    ...await dispatcher.claimDue(10, new Date()),
    ...await producer.claimDue(10, new Date()),
  ];
  assert.deepEqual(claims.map((m) => m.id), [m3.id], "m3 heads the key: not stranded");
  assert.equal(claims[0].keySequence, undefined, "the retired key starts over");
});

Deno.test("nats kv sweep review: a late join of a producer that runs no index does not name its settled message head of the retired key", async () => {
  await using fixture = await openKvFixture();
  const { dispatcher, m3 } = await lateJoinAfterRetirement(fixture, "late-join-no-index", false);
  const [claim3] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim3?.id, m3.id, "m3 heads the key: not stranded");
});
