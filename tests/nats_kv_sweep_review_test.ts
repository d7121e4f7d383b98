/**
 * NATS KV: adversarial interleavings of prune's key retirement (a tombstone) and tombstone sweep
 * with joins, on a real bucket with two store instances. Races are placed by intercepting the
 * producer's KV calls, so the interleaving is chosen, not timed.
 */

import assert from "node:assert/strict";
import type { OutboxRecord } from "../mod.ts";
import { keyEntryKey, markerPrefix } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { dispatchBothAndRetire, intercept, isKeyEntry, openKvFixture } from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("sr", orderingKey);
const old = () => new Date(Date.now() - 120_000);

Deno.test("nats kv sweep review: a late join whose index already saw its key's retirement tombstone does not name its settled message head", async () => {
  await using fixture = await openKvFixture();
  const k = "late-join-saw-tombstone";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, old());
  let raced = false;
  // m2's marker is written; before m2 joins its key, the other instance dispatches m1 (handing
  // over to m2), claims and dispatches m2 (no next: no head), and a prune retires the key with a
  // tombstone, which the producer's running index sees before the join reads it.
  const kv = intercept(fixture.kv, "create", (create) => async (key, data, ttl) => {
    const seq = await create(key, data, ttl);
    if (key.startsWith(`${markerPrefix}.`) && !isKeyEntry(key) && !raced) {
      raced = true;
      await dispatchBothAndRetire(dispatcher, claim1, m2.id);
      await producer.blockedKeys(); // its index sees the tombstone
    }
    return seq;
  });
  const producer = fixture.outbox({ kv });
  await producer.blockedKeys(); // starts its index
  await producer.enqueue(m2);
  assert.ok(raced, "the dispatches and the prune ran inside the enqueue");
  const entry = await fixture.kv.get(await keyEntryKey(k));
  const head = entry?.operation === "PUT" ? entry.json<{ head?: string }>().head : undefined;
  assert.notEqual(head, m2.id, "the dispatched m2 is not named head of its retired key");
  await producer.enqueue(m3);
  const claims = [
    ...await dispatcher.claimDue(10, new Date()),
    ...await producer.claimDue(10, new Date()),
  ];
  assert.deepEqual(claims.map((m) => m.id), [m3.id], "m3 heads the key: not stranded");
  assert.equal(claims[0].keySequence, undefined, "the retired key starts over");
});

Deno.test("nats kv sweep review: a late join of a producer that runs no index does not name its settled message head of the retired key", async () => {
  await using fixture = await openKvFixture();
  const k = "late-join-no-index";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const dispatcher = fixture.outbox({ kv: fixture.peerKv });
  await dispatcher.enqueue(m1);
  const [claim1] = await dispatcher.claimDue(10, old());
  let raced = false;
  // A pure producer (it never claims: its index never starts). m2's marker is written; before
  // m2 joins its key, the other instance dispatches m1 (handing over to m2), claims and
  // dispatches m2, and a prune retires the key.
  const kv = intercept(fixture.kv, "create", (create) => async (key, data, ttl) => {
    const seq = await create(key, data, ttl);
    if (key.startsWith(`${markerPrefix}.`) && !isKeyEntry(key) && !raced) {
      raced = true;
      await dispatchBothAndRetire(dispatcher, claim1, m2.id);
    }
    return seq;
  });
  const producer = fixture.outbox({ kv });
  await producer.enqueue(m2);
  assert.ok(raced, "the dispatches and the prune ran inside the enqueue");
  const entry = await fixture.kv.get(await keyEntryKey(k));
  const head = entry?.operation === "PUT" ? entry.json<{ head?: string }>().head : undefined;
  assert.notEqual(head, m2.id, "the dispatched m2 is not named head of its retired key");
  await producer.enqueue(m3);
  const [claim3] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim3?.id, m3.id, "m3 heads the key: not stranded");
});
