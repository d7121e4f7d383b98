/**
 * Races around an enqueue's two writes that a marker copy must survive (found by review of an
 * earlier design, 6d1b2a0, whose "same-flush" copies guessed the record's revision from the
 * marker's and published the wrong content in both): two producers enqueueing one new id with
 * different content, and a requeue of a dead record landing between a duplicate enqueue's
 * writes. The claim must publish the record as stored, whatever copies the markers carry.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { intercept, openKvFixture } from "./nats_kv_fixture.ts";

async function waitForMarker(kv: KV, markerKey: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if ((await kv.get(markerKey))?.operation === "PUT") return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`no marker ${markerKey}`);
}

Deno.test("nats kv marker copy race: two producers enqueueing one new id publish the accepted content, not the rejected one's", async () => {
  await using fixture = await openKvFixture();
  const base = keyedRecord("sfr", undefined);
  const recordKey = await outboxRecordKey(base.id);
  const markerKey = markerKeyOf(recordKey);
  // Stream order: P1's marker (copy of A) | P2's marker (refused: exists) | P2's record B |
  // P1's record (refused: exists). Both flushes leave at once; the server may interleave them.
  let p2Done!: () => void;
  const p2Finished = new Promise<void>((resolve) => p2Done = resolve);
  const p1 = fixture.outbox({
    kv: intercept(fixture.kv, "create", (create) => async (key, value, ttl) => {
      if (key === recordKey) await p2Finished;
      return await create(key, value, ttl);
    }),
  });
  const p2 = fixture.outbox({ kv: fixture.peerKv });
  await p1.stats();
  await p2.stats();
  const a = { ...base, payload: JSON.stringify({ from: "P1" }) };
  const b = { ...base, payload: JSON.stringify({ from: "P2" }) };
  const first = p1.enqueue(a);
  await waitForMarker(fixture.kv, markerKey);
  assert.equal((await p2.enqueue(b)).payload, b.payload, "P2's enqueue is accepted");
  p2Done();
  await assert.rejects(first, { name: "OutboxDuplicateIdentityError" });

  const relay = fixture.outbox({ kv: fixture.peerKv });
  const claimed = await relay.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.payload), [b.payload], "the accepted content is published");
  assert.equal((await p2.get(base.id))?.payload, b.payload);
});

Deno.test("nats kv marker copy race: a requeue landing after a duplicate's marker keeps the requeued record", async () => {
  await using fixture = await openKvFixture();
  const producer = fixture.outbox();
  const message = keyedRecord("sfr", undefined, { payload: JSON.stringify({ original: true }) });
  await producer.enqueue(message);
  const [claimed] = await producer.claimDue(1, new Date());
  assert.equal(await producer.markDead(claimed, { error: "boom", now: new Date() }), true);
  const recordKey = await outboxRecordKey(message.id);
  const markerKey = markerKeyOf(recordKey);

  // Stream order: the duplicate's marker (copy of its content) | the requeue's record write |
  // the duplicate's record create (refused: exists) | ... the requeue's marker put (slow).
  let requeueWritten!: () => void;
  const requeued = new Promise<void>((resolve) => requeueWritten = resolve);
  let releasePut!: () => void;
  const putReleased = new Promise<void>((resolve) => releasePut = resolve);
  const duplicateProducer = fixture.outbox({
    kv: intercept(fixture.kv, "create", (create) => async (key, value, ttl) => {
      if (key === recordKey) await requeued;
      return await create(key, value, ttl);
    }),
  });
  const requeuer = fixture.outbox({
    kv: intercept(fixture.peerKv, "put", (put) => async (key, value) => {
      if (key === markerKey) {
        requeueWritten();
        await putReleased;
      }
      return await put(key, value);
    }),
  });
  await duplicateProducer.stats();
  const duplicate = duplicateProducer.enqueue({
    ...message,
    payload: JSON.stringify({ dup: true }),
  });
  await waitForMarker(fixture.kv, markerKey);
  const requeue = requeuer.requeue([message.id]);
  await requeued;
  await assert.rejects(duplicate, { name: "OutboxDuplicateIdentityError" });

  const relay = fixture.outbox({ kv: fixture.peerKv });
  const got = await relay.claimDue(10, new Date());
  releasePut();
  assert.equal(await requeue, 1);
  assert.equal(got.length, 1);
  assert.equal(
    got[0].payload,
    message.payload,
    "the requeued record's content, not the duplicate's",
  );
  assert.equal(got[0].lastError, "boom", "the requeued record's lastError is kept");
});
