/**
 * A marker's copy of its record (`Marker.r`, at the record revision `rev` names), written by
 * repositories with `markerCopies` on: the first claim of a message compares-and-sets the record
 * without reading it. With `"deferred"` (the default) enqueue writes record and marker together
 * and then rewrites the marker with the copy (nats_kv_deferred_copy_test.ts); with `false` no
 * marker carries a copy; repositories with different settings share a bucket. Every way the copy can be stale
 * or unusable ends in the usual read: another claimer took the record, a settle whose marker
 * delete has not reached this index, a marker written by the previous version (no copy), a
 * record too large to copy, a copy that fails the record schema. On a real bucket, two store
 * instances where it matters.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import type { OutboxMessage, OutboxRecord } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { countingOutbox, entryOf, intercept, markerOf, openKvFixture } from "./nats_kv_fixture.ts";

const fresh = (overrides: Partial<OutboxRecord> = {}): OutboxRecord =>
  keyedRecord("mc", undefined, overrides);

function later(ms: number): Date {
  return new Date(Date.now() + ms);
}

Deno.test("nats kv marker copy: an enqueued message's marker carries its record, and its first claim reads none", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const producer = fixture.outbox();
  const message = fresh();
  await producer.enqueue(message);
  const recordEntry = await entryOf(fixture.kv, await outboxRecordKey(message.id));
  const marker = await markerOf(fixture.kv, message.id);
  assert.equal(marker?.rev, recordEntry?.revision, "the marker names the record's revision");
  assert.deepEqual(marker?.r, recordEntry?.json(), "and carries the record as stored there");

  const relay = countingOutbox(fixture);
  const [claimed] = await relay.outbox.claimDue(10, new Date());
  assert.equal(claimed?.id, message.id);
  assert.equal(claimed.attempts, 1);
  assert.equal(relay.gets(), 0, "no record read");
  assert.equal(await relay.outbox.markDispatched(claimed, new Date()), true);
  assert.equal((await producer.get(message.id))?.state, "dispatched");
});

Deno.test("nats kv marker copy: a record another instance claimed since is read, then claimed as it is", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const message = fresh();
  await fixture.outbox().enqueue(message);
  const relay = countingOutbox(fixture);
  await (await relay.outbox.watch(() => {}))(); // its index holds the marker and its copy
  // Another instance claims it with a short lease (no marker is written for a claim).
  const other = fixture.outbox();
  const [theirs] = await other.claimDue(10, new Date(), { leaseMs: 1 });
  assert.equal(theirs?.id, message.id);

  // The lease has expired: the copy (pending, 0 attempts) is stale, its compare-and-set fails,
  // the record is read and claimed as stored (its second attempt, fencing the other claim).
  const [ours] = await relay.outbox.claimDue(10, later(1_000));
  assert.equal(ours?.id, message.id, "claimed after reading the record");
  assert.equal(ours.attempts, 2);
  assert.notEqual(ours.claimToken, theirs.claimToken);
  assert.equal(relay.gets(), 1, "one read, after the failed compare-and-set");
  assert.equal(
    await other.markDispatched(theirs, new Date()),
    false,
    "the earlier claim is fenced",
  );
  assert.equal(await relay.outbox.markDispatched(ours, new Date()), true);
});

Deno.test("nats kv marker copy: a record settled since (its marker delete not seen) is read and its marker dropped", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const message = fresh();
  await fixture.outbox().enqueue(message);
  const relay = countingOutbox(fixture);
  await (await relay.outbox.watch(() => {}))();
  // Another instance dispatches it, but its marker delete never happens.
  const settler = fixture.outbox({
    kv: intercept(fixture.kv, "delete", () => () => Promise.resolve()),
  });
  const [claimed] = await settler.claimDue(10, new Date());
  assert.equal(await settler.markDispatched(claimed, new Date()), true);
  assert.ok(await markerOf(fixture.kv, message.id), "the marker outlived the settle");

  // The copy says pending: its compare-and-set fails, the read finds the record dispatched.
  assert.deepEqual(await relay.outbox.claimDue(10, new Date()), []);
  assert.equal(relay.gets(), 1);
  assert.equal(await markerOf(fixture.kv, message.id), undefined, "the stale marker is dropped");
  assert.equal((await relay.outbox.get(message.id))?.state, "dispatched", "not revived");
});

Deno.test("nats kv marker copy: markers written by the previous version (no copy) still work", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  // As the previous version enqueued: record and marker `{ v, id }` written together; and a
  // failed message's marker with its due time and record revision, but no copy.
  const enqueued = fresh();
  const failed = fresh();
  const now = new Date();
  const stored = (record: OutboxRecord, extra: Record<string, unknown> = {}) => ({
    v: 1,
    ...record,
    state: "pending",
    attempts: 0,
    createdAt: now.toISOString(),
    updatedAt: now.toISOString(),
    ...extra,
  });
  const enqueuedKey = await outboxRecordKey(enqueued.id);
  await fixture.kv.create(enqueuedKey, JSON.stringify(stored(enqueued)));
  await fixture.kv.create(markerKeyOf(enqueuedKey), JSON.stringify({ v: 1, id: enqueued.id }));
  const failedKey = await outboxRecordKey(failed.id);
  const due = new Date(now.getTime() - 1_000).toISOString();
  const revision = await fixture.kv.create(
    failedKey,
    JSON.stringify(
      stored(failed, { state: "failed", attempts: 1, nextAttemptAt: due, lastError: "x", seq: 1 }),
    ),
  );
  await fixture.kv.create(
    markerKeyOf(failedKey),
    JSON.stringify({ v: 1, id: failed.id, seq: 1, due, rev: revision }),
  );

  const relay = countingOutbox(fixture);
  const claimed = await relay.outbox.claimDue(10, now);
  assert.deepEqual(
    claimed.map((m) => [m.id, m.attempts]).sort(),
    [
      [enqueued.id, 1],
      [failed.id, 2],
    ].sort(),
  );
  assert.equal(relay.gets(), 2, "both records read");
  assert.deepEqual(
    await relay.outbox.markMany(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      now,
    ),
    [true, true],
  );
});

Deno.test("nats kv marker copy: a record too large to copy, or a copy that fails the record schema, is read", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const producer = fixture.outbox();
  const large = fresh({ payload: JSON.stringify({ pad: "x".repeat(10_000) }) });
  const damaged = fresh();
  await producer.enqueueMany([large, damaged]);
  assert.equal((await markerOf(fixture.kv, large.id))?.r, undefined, "no copy of a large record");
  // A copy that does not pass the schema (here: another id) is not trusted.
  const damagedMarker = markerKeyOf(await outboxRecordKey(damaged.id));
  const marker = await markerOf(fixture.kv, damaged.id);
  assert.ok(marker?.r !== undefined);
  await fixture.kv.put(
    damagedMarker,
    JSON.stringify({ ...marker, r: { ...(marker.r as object), id: "someone-else" } }),
  );

  const relay = countingOutbox(fixture);
  const claimed: OutboxMessage[] = await relay.outbox.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.id).sort(), [large.id, damaged.id].sort());
  assert.equal(relay.gets(), 2, "both records read");
  const byId = new Map(claimed.map((m) => [m.id, m]));
  assert.equal(byId.get(large.id)?.payload, large.payload);
  assert.equal(byId.get(damaged.id)?.payload, damaged.payload, "the record's, not the copy's");
});

Deno.test("nats kv marker copy: failed and requeued messages' markers carry copies too", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const producer = fixture.outbox();
  const retried = fresh();
  const requeued = fresh();
  await producer.enqueueMany([retried, requeued]);
  const t0 = new Date();
  const first = await producer.claimDue(10, t0);
  assert.equal(first.length, 2);
  const byId = new Map(first.map((m) => [m.id, m]));
  assert.equal(
    await producer.markFailed(byId.get(retried.id)!, {
      error: "try again",
      now: t0,
      nextAttemptAt: t0,
    }),
    true,
  );
  assert.equal(await producer.markDead(byId.get(requeued.id)!, { error: "dead", now: t0 }), true);
  assert.equal(await producer.requeue([requeued.id], t0), 1);

  const relay = countingOutbox(fixture);
  const claimed = await relay.outbox.claimDue(10, new Date(t0.getTime() + 1));
  assert.deepEqual(
    claimed.map((m) => [m.id, m.attempts]).sort(),
    [
      [retried.id, 2],
      [requeued.id, 1],
    ].sort(),
  );
  assert.equal(relay.gets(), 0, "no record read");
  const retry = claimed.find((m) => m.id === retried.id)!;
  assert.equal(retry.lastError, "try again");
});

Deno.test("nats kv marker copy: a marker the bucket refuses with its copy (max_msg_size lowered since read) is written without it", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const producer = fixture.outbox();
  // A long id: a marker's copy carries it twice (the marker's and the record's), the record once.
  const longId = (tag: string) => `${tag}-${"i".repeat(700)}`;
  const twin = fresh({ id: longId("twin") });
  await producer.enqueue(twin); // the repository reads the bucket's limit (none) here
  const size = (await entryOf(fixture.kv, await outboxRecordKey(twin.id)))!.length;
  const jsm = await jetstreamManager(fixture.nc);
  const stream = `KV_${fixture.outboxBucket}`;
  const { config } = await jsm.streams.info(stream);
  // Room for the record and its rewrites, not for a marker with a copy.
  await jsm.streams.update(stream, { ...config, max_msg_size: size + 400 });

  const message = fresh({ id: longId("mesg") });
  await producer.enqueue(message);
  const marker = await markerOf(fixture.kv, message.id);
  assert.ok(marker !== undefined, "indexed");
  assert.equal(marker.r, undefined, "without a copy");
  const claimed = (await producer.claimDue(10, new Date())).find((m) => m.id === message.id);
  assert.ok(claimed !== undefined);
  const t0 = new Date();
  assert.equal(
    await producer.markFailed(claimed, { error: "x", now: t0, nextAttemptAt: t0 }),
    true,
  );
  const failed = await markerOf(fixture.kv, message.id);
  assert.equal(failed?.due, t0.toISOString(), "the failed mark's marker was written");
  assert.equal(failed?.r, undefined, "without a copy");
  const relay = countingOutbox(fixture);
  const again = (await relay.outbox.claimDue(10, new Date(t0.getTime() + 1)))
    .find((m) => m.id === message.id);
  assert.equal(again?.attempts, 2);
});

Deno.test("nats kv marker copy: an enqueue whose record write lost its reply leaves a marker without copy, and the record is claimed", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const message = fresh();
  const recordKey = await outboxRecordKey(message.id);
  // The record write applies, its reply is lost.
  const kv = intercept(fixture.kv, "create", (create) => async (key, value, ttl) => {
    const revision = await create(key, value, ttl);
    if (key === recordKey) throw new Error("reply lost (simulated)");
    return revision;
  });
  await assert.rejects(fixture.outbox({ kv }).enqueue(message), /reply lost/);
  const marker = await markerOf(fixture.kv, message.id);
  assert.deepEqual(marker, { v: 1, id: message.id }, "a marker without revision or copy");
  const relay = countingOutbox(fixture);
  const [claimed] = await relay.outbox.claimDue(10, new Date());
  assert.equal(claimed?.id, message.id);
  assert.equal(relay.gets(), 1, "its record read");
});

Deno.test("nats kv marker copy: an enqueue stopped between its record and its marker is indexed by its retry, with a copy", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const message = fresh();
  const markerKey = markerKeyOf(await outboxRecordKey(message.id));
  // Every marker write fails (as if the process stopped after the record write).
  const kv = intercept(
    fixture.kv,
    "create",
    (create) => (key, value, ttl) =>
      key === markerKey
        ? Promise.reject(new Error("connection lost (simulated)"))
        : create(key, value, ttl),
  );
  await assert.rejects(fixture.outbox({ kv }).enqueue(message), /connection lost/);
  assert.equal(await markerOf(fixture.kv, message.id), undefined, "the record has no marker");
  assert.equal((await fixture.outbox().get(message.id))?.state, "pending");

  // The caller's retry finds the record and writes its marker, with the record's copy.
  await fixture.outbox().enqueue(message);
  const marker = await markerOf(fixture.kv, message.id);
  assert.equal(
    marker?.rev,
    (await entryOf(fixture.kv, await outboxRecordKey(message.id)))?.revision,
  );
  assert.ok(marker?.r !== undefined);
  const relay = countingOutbox(fixture);
  const [claimed] = await relay.outbox.claimDue(10, new Date());
  assert.equal(claimed?.id, message.id);
  assert.equal(relay.gets(), 0);
});

/** Marker of `id` without its copy fields: what both configurations write alike. */
async function markerFields(kv: KV, id: string): Promise<string[]> {
  return Object.keys(await markerOf(kv, id) ?? {}).sort();
}

Deno.test("nats kv marker copy: by default enqueue sends record and marker together, then the marker's copy; false: no copy; true: record first", async () => {
  for (const markerCopies of [undefined, "deferred" as const, false, true]) {
    await using fixture = await openKvFixture();
    const message = fresh();
    const recordKey = await outboxRecordKey(message.id);
    const markerKey = markerKeyOf(recordKey);
    // The order in which the two writes are issued and acknowledged.
    const events: string[] = [];
    const kv = intercept(fixture.kv, "create", (create) => async (key, value, ttl) => {
      const name = key === recordKey ? "record" : key === markerKey ? "marker" : key;
      events.push(`send ${name}`);
      const revision = await create(key, value, ttl);
      events.push(`ack ${name}`);
      return revision;
    });
    const producer = fixture.outbox({ kv, markerCopies });
    await producer.enqueue(fresh()); // reads the bucket's limit (copies need it)
    events.length = 0;
    await producer.enqueue(message);
    const marker = await markerOf(fixture.kv, message.id);
    if (markerCopies === true) {
      assert.deepEqual(events, ["send record", "ack record", "send marker", "ack marker"]);
      assert.ok(marker?.r !== undefined && marker.rev !== undefined, "a copy and its revision");
    } else if (markerCopies === false) {
      assert.deepEqual(events.slice(0, 2), ["send record", "send marker"], `${markerCopies}`);
      assert.deepEqual(marker, { v: 1, id: message.id }, "as before copies");
    } else {
      assert.deepEqual(events.slice(0, 2), ["send record", "send marker"], `${markerCopies}`);
      // Then the marker is rewritten with the copy, keeping its first revision as its order.
      const record = await entryOf(fixture.kv, recordKey);
      let entry = await entryOf(fixture.kv, markerKey);
      for (let i = 0; i < 100 && entry?.json<{ r?: unknown }>().r === undefined; i++) {
        await new Promise((resolve) => setTimeout(resolve, 10));
        entry = await entryOf(fixture.kv, markerKey);
      }
      assert.deepEqual(
        entry?.json(),
        {
          v: 1,
          id: message.id,
          rev: record?.revision,
          seq: record!.revision + 1,
          r: record?.json(),
        },
        "the copy, the record's revision, the first marker's revision as order",
      );
    }
    // Failed marks and requeues: a copy only with `true` (deferred copies are enqueue's).
    const [claimed] = await producer.claimDue(10, new Date());
    const t0 = new Date();
    assert.equal(
      await producer.markFailed(claimed, { error: "x", now: t0, nextAttemptAt: t0 }),
      true,
    );
    assert.equal((await markerOf(fixture.kv, claimed.id))?.r !== undefined, markerCopies === true);
    const [again] = await producer.claimDue(10, new Date(t0.getTime() + 1));
    assert.equal(await producer.markDead(again, { error: "y", now: t0 }), true);
    assert.equal(await producer.requeue([again.id], t0), 1);
    assert.equal((await markerOf(fixture.kv, again.id))?.r !== undefined, markerCopies === true);
    assert.deepEqual(
      (await markerFields(fixture.kv, again.id)).filter((field) => field !== "r"),
      ["id", "rev", "seq", "v"],
    );
  }
});

Deno.test("nats kv marker copy: a producer with copies and a relay without (and the reverse) share a bucket", async () => {
  await using fixture = await openKvFixture();
  const withCopies = fixture.outbox({ markerCopies: true });
  const without = fixture.outbox({ markerCopies: false });
  const byCopier = fresh();
  const byPlain = fresh();
  await withCopies.enqueue(byCopier);
  await without.enqueue(byPlain);
  assert.ok((await markerOf(fixture.kv, byCopier.id))?.r !== undefined);
  assert.equal((await markerOf(fixture.kv, byPlain.id))?.r, undefined);

  // A relay without copies uses the copy it finds, and reads the record that has none.
  const plainRelay = countingOutbox(fixture, { markerCopies: false });
  const claimed = await plainRelay.outbox.claimDue(10, new Date());
  assert.deepEqual(claimed.map((m) => m.id).sort(), [byCopier.id, byPlain.id].sort());
  assert.equal(plainRelay.gets(), 1, "only the record whose marker has no copy is read");
  // Its failed marks write markers without copies...
  const t0 = new Date();
  for (const claim of claimed) {
    assert.equal(
      await plainRelay.outbox.markFailed(claim, { error: "x", now: t0, nextAttemptAt: t0 }),
      true,
    );
    assert.equal((await markerOf(fixture.kv, claim.id))?.r, undefined);
  }
  // ...which a relay with copies reads; its own failed marks write copies...
  const copyRelay = countingOutbox(fixture, { markerCopies: true });
  const retried = await copyRelay.outbox.claimDue(10, new Date(t0.getTime() + 1));
  assert.equal(retried.length, 2);
  assert.ok(retried.every((m) => m.attempts === 2));
  assert.equal(copyRelay.gets(), 2, "no copies: both records read");
  const t1 = new Date(t0.getTime() + 2);
  for (const claim of retried) {
    assert.equal(
      await copyRelay.outbox.markFailed(claim, { error: "y", now: t1, nextAttemptAt: t1 }),
      true,
    );
    assert.ok((await markerOf(fixture.kv, claim.id))?.r !== undefined);
  }
  // ...which the relay without copies claims without reading, and settles.
  const before = plainRelay.gets();
  const third = await plainRelay.outbox.claimDue(10, new Date(t1.getTime() + 1));
  assert.equal(third.length, 2);
  assert.ok(third.every((m) => m.attempts === 3 && m.lastError === "y"));
  assert.equal(plainRelay.gets() - before, 0, "copies used: no read");
  assert.deepEqual(
    await plainRelay.outbox.markMany(
      third.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(),
    ),
    [true, true],
  );
  assert.equal((await without.get(byCopier.id))?.state, "dispatched");
  assert.equal((await withCopies.get(byPlain.id))?.state, "dispatched");
});

Deno.test('nats kv marker copy: markerCopies must be true, false or "deferred"', async () => {
  await using fixture = await openKvFixture();
  assert.throws(
    () => fixture.outbox({ markerCopies: "yes" as unknown as boolean }),
    { name: "OutboxValidationError" },
  );
});
