/**
 * Same-flush copies (`markerCopies: "same-flush"`, the default): an enqueue sends an unkeyed
 * record's marker, with a copy of the record and no revision (`Marker.n`), just before the record,
 * in one flush, and claims take the record's revision to be the marker's plus one. On a real
 * bucket, with the relay on its own connection: the first claim reads no record; a guess that
 * another write made wrong costs a failed compare-and-set and the usual read, and claims the
 * record as stored; after a round of mostly wrong guesses a repository reads first for a while;
 * a duplicate enqueue of a settled id (whose marker briefly exists) never brings back the record
 * or its new content; keyed records and `markerCopies: false` get no copy.
 */

import assert from "node:assert/strict";
import type { KV, KvEntry } from "@nats-io/kv";
import type { NatsKvOutboxOptions, OutboxRecord } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { countingKv, intercept, newCounts, openKvFixture } from "./nats_kv_fixture.ts";

type Fixture = Awaited<ReturnType<typeof openKvFixture>>;

const fresh = (overrides: Partial<OutboxRecord> = {}): OutboxRecord =>
  keyedRecord("sf", undefined, overrides);

async function entryOf(kv: KV, key: string): Promise<KvEntry | null> {
  const entry = await kv.get(key);
  return entry?.operation === "PUT" ? entry : null;
}

/** A relay on the peer connection counting its record reads and writes. */
function countingRelay(fixture: Fixture, options: NatsKvOutboxOptions = {}) {
  const counts = newCounts();
  const outbox = fixture.outbox({ ...options, kv: countingKv(fixture.peerKv, counts) });
  return { outbox, gets: () => counts.calls.get ?? 0, updates: () => counts.calls.update ?? 0 };
}

/** A producer whose bucket limit is known (copies need it), having enqueued nothing claimable. */
async function producerOf(fixture: Fixture, options: NatsKvOutboxOptions = {}) {
  const producer = fixture.outbox(options);
  const first = fresh();
  await producer.enqueue(first);
  const [claimed] = await producer.claimDue(1, new Date());
  assert.equal(claimed?.id, first.id);
  assert.equal(await producer.markDispatched(claimed, new Date()), true);
  return producer;
}

/**
 * Enqueues `n` messages, then rewrites each one's marker and record with a foreign write in
 * between (as another producer's message landing between the two would): the marker's copy is
 * still the record as stored, but at the marker's revision plus two.
 */
async function interleaved(fixture: Fixture, n: number): Promise<string[]> {
  const producer = await producerOf(fixture);
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const message = fresh();
    await producer.enqueue(message);
    const recordKey = await outboxRecordKey(message.id);
    const markerKey = markerKeyOf(recordKey);
    const record = await entryOf(fixture.kv, recordKey);
    const marker = await entryOf(fixture.kv, markerKey);
    assert.equal(marker?.json<{ n?: true }>().n, true);
    const markerAt = await fixture.kv.put(markerKey, marker!.value);
    await fixture.kv.put(`zz.${i}`, "foreign");
    const recordAt = await fixture.kv.put(recordKey, record!.value);
    assert.equal(recordAt, markerAt + 2);
    ids.push(message.id);
  }
  return ids;
}

Deno.test("nats kv same-flush copy: the marker goes first with the record's copy, and the first claim reads no record", async () => {
  await using fixture = await openKvFixture();
  const producer = await producerOf(fixture);
  const messages = Array.from({ length: 20 }, () => fresh());
  await producer.enqueueMany(messages);
  for (const message of messages) {
    const recordKey = await outboxRecordKey(message.id);
    const record = await entryOf(fixture.kv, recordKey);
    const marker = await entryOf(fixture.kv, markerKeyOf(recordKey));
    assert.equal(record?.revision, marker!.revision + 1, "the record right after its marker");
    assert.deepEqual(marker?.json(), { v: 1, id: message.id, r: record?.json(), n: true });
  }
  const relay = countingRelay(fixture);
  const claimed = await relay.outbox.claimDue(20, new Date());
  assert.deepEqual(claimed.map((m) => m.id), messages.map((m) => m.id));
  assert.ok(claimed.every((m) => m.attempts === 1 && m.state === "claimed"));
  assert.equal(relay.gets(), 0, "no record read");
  assert.equal(relay.updates(), 20, "one compare-and-set each");
  for (const [i, message] of claimed.entries()) {
    assert.equal(message.payload, messages[i].payload);
    assert.equal(await relay.outbox.markDispatched(message, new Date()), true);
  }
  assert.equal((await producer.stats()).dispatched, 21);
});

Deno.test("nats kv same-flush copy: a guess another write made wrong fails its compare-and-set, and the claim reads the record", async () => {
  await using fixture = await openKvFixture();
  const ids = await interleaved(fixture, 3);
  const relay = countingRelay(fixture);
  const claimed = await relay.outbox.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.id), ids);
  assert.ok(claimed.every((m) => m.attempts === 1));
  assert.equal(relay.gets(), 3, "each record read after its guess failed");
  assert.equal(relay.updates(), 6, "a failed compare-and-set, then the claim");
  for (const message of claimed) {
    assert.equal(await relay.outbox.markDispatched(message, new Date()), true);
  }
});

Deno.test("nats kv same-flush copy: after a round of mostly wrong guesses, a repository reads first for a while", async () => {
  await using fixture = await openKvFixture();
  const ids = await interleaved(fixture, 64 + 10);
  const relay = countingRelay(fixture);
  const first = await relay.outbox.claimDue(64, new Date());
  assert.deepEqual(first.map((m) => m.id), ids.slice(0, 64));
  assert.equal(relay.updates(), 128, "64 wrong guesses, then 64 claims");
  const [gets, updates] = [relay.gets(), relay.updates()];
  const rest = await relay.outbox.claimDue(64, new Date());
  assert.deepEqual(rest.map((m) => m.id), ids.slice(64));
  assert.equal(relay.gets() - gets, 10, "read first");
  assert.equal(relay.updates() - updates, 10, "no compare-and-set from a copy");
});

Deno.test("nats kv same-flush copy: a duplicate enqueue of a settled id never brings it back, whatever its content", async () => {
  for (const sameContent of [true, false]) {
    await using fixture = await openKvFixture();
    const producer = await producerOf(fixture);
    const message = fresh();
    await producer.enqueue(message);
    const [claimed] = await producer.claimDue(1, new Date());
    assert.equal(await producer.markDispatched(claimed, new Date()), true);
    const recordKey = await outboxRecordKey(message.id);
    const markerKey = markerKeyOf(recordKey);
    const settled = await entryOf(fixture.kv, recordKey);

    // The duplicate's marker exists until the enqueue sees the id taken and deletes it: hold
    // that delete until a relay on another connection has claimed meanwhile.
    let release!: () => void;
    const held = new Promise<void>((resolve) => release = resolve);
    let deleting!: () => void;
    const reachedDelete = new Promise<void>((resolve) => deleting = resolve);
    const kv = intercept(fixture.kv, "delete", (del) => async (key, options) => {
      if (key === markerKey) {
        deleting();
        await held;
      }
      return await del(key, options);
    });
    const duplicateProducer = fixture.outbox({ kv });
    const duplicate = sameContent ? message : { ...message, payload: '{"other":true}' };
    const enqueued = duplicateProducer.enqueue(duplicate);
    await reachedDelete;
    const marker = await entryOf(fixture.kv, markerKey);
    assert.equal(marker?.json<{ n?: true }>().n, true, "the duplicate's marker, with its copy");

    const relay = countingRelay(fixture);
    assert.deepEqual(await relay.outbox.claimDue(10, new Date()), [], "nothing to claim");
    release();
    if (sameContent) assert.equal((await enqueued).state, "dispatched");
    else await assert.rejects(enqueued, { name: "OutboxDuplicateIdentityError" });
    const after = await entryOf(fixture.kv, recordKey);
    assert.equal(after?.revision, settled?.revision, "the record was not written");
    assert.equal((await producer.get(message.id))?.payload, message.payload);
    assert.equal(await entryOf(fixture.kv, markerKey), null, "the marker is gone");
  }
});

Deno.test("nats kv same-flush copy: none for a keyed record or with markerCopies false", async () => {
  await using fixture = await openKvFixture();
  const producer = await producerOf(fixture);
  const plainProducer = await producerOf(fixture, { markerCopies: false });
  const keyed = keyedRecord("sf", "key-1");
  const unkeyed = fresh();
  await producer.enqueue(keyed);
  await plainProducer.enqueue(unkeyed);
  for (const id of [keyed.id, unkeyed.id]) {
    const recordKey = await outboxRecordKey(id);
    const marker = await entryOf(fixture.kv, markerKeyOf(recordKey));
    assert.equal(marker?.json<{ r?: unknown }>().r, undefined, id);
  }
  const relay = countingRelay(fixture);
  const claimed = await relay.outbox.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.id).sort(), [keyed.id, unkeyed.id].sort());
  assert.equal(relay.gets(), 2, "both records read");
});
