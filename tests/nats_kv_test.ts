/**
 * NATS KV store tests beyond the conformance suite: concurrency on two connections, id
 * round-trips, duplicate and crash-recovery paths, wake-ups, retention, and the cost of a claim
 * in a bucket full of dispatched messages (measured as KV work, not time).
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import {
  createInboxBucket,
  createOutboxBucket,
  NatsKvInboxRepository,
  type NatsKvWork,
  type OutboxRecord,
} from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { isWrongLastSequence } from "../src/stores/nats_kv/errors.ts";
import { KvRequests } from "../src/stores/nats_kv/kv_requests.ts";
import { connectNats, eventually, uniqueName } from "./kit/mod.ts";
import {
  countingKv,
  newCounts,
  openKvFixture,
  operations,
  withoutStreamAccess,
} from "./nats_kv_fixture.ts";

let counter = 0;
function record(overrides: Partial<OutboxRecord> = {}): OutboxRecord {
  counter += 1;
  return {
    id: `kv-${counter}-${crypto.randomUUID()}`,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ n: counter }),
    headers: {},
    ...overrides,
  };
}

function ids(messages: ReadonlyArray<{ id: string }>): string[] {
  return messages.map((message) => message.id);
}

Deno.test("nats kv: claimers on two connections receive every message exactly once", async () => {
  await using fixture = await openKvFixture();
  const stores = [fixture.outbox(), fixture.outbox({ kv: fixture.peerKv })];
  const total = 300;
  const records = Array.from({ length: total }, () => record());
  for (let i = 0; i < total; i += 100) await stores[0].enqueueMany(records.slice(i, i + 100));
  const seen: string[] = [];
  const now = new Date();
  await Promise.all(Array.from({ length: 8 }, async (_, worker) => {
    const store = stores[worker % 2];
    while (true) {
      const batch = await store.claimDue(9, now);
      if (batch.length === 0) break;
      seen.push(...ids(batch));
      // Settle half of them concurrently with the other claimers.
      await store.markMany(batch.map((claim) => ({ claim, state: "dispatched" as const })), now);
    }
  }));
  assert.equal(seen.length, total);
  assert.equal(new Set(seen).size, total);
  const stats = await stores[1].stats(now);
  assert.equal(stats.dispatched, total);
  assert.equal(stats.due, 0);
});

Deno.test("nats kv: concurrent marks of one claim: one outcome wins, marks to that state are true", async () => {
  await using fixture = await openKvFixture();
  const local = fixture.outbox();
  const peer = fixture.outbox({ kv: fixture.peerKv });
  const rounds = 15;
  await local.enqueueMany(Array.from({ length: rounds }, () => record()));
  const claims = await local.claimDue(rounds, new Date());
  assert.equal(claims.length, rounds);
  for (const claim of claims) {
    const now = new Date();
    // The claimer (fast path from its claim cache), itself again, and a peer that must read.
    const results = await Promise.all([
      local.markDispatched(claim, now),
      local.markDispatched({ ...claim }, now),
      peer.markDispatched({ ...claim }, now),
      peer.markDead({ ...claim }, { error: "x", now }),
    ]);
    // One write wins; the others find the claim settled: true when it was settled to their
    // own state (the same claim applied it), false otherwise.
    const final = (await local.get(claim.id))?.state;
    assert.deepEqual(
      results,
      ["dispatched", "dispatched", "dispatched", "dead"].map((state) => state === final),
      `${final}: ${JSON.stringify(results)}`,
    );
  }
  const stats = await local.stats();
  assert.equal(stats.dispatched + stats.dead, rounds);
});

Deno.test("nats kv: any message id round-trips (hashed above 768 bytes, up to 2048)", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const peer = fixture.outbox({ kv: fixture.peerKv });
  const inbox = fixture.inbox();
  const hostile = [
    "a:b:c",
    "with space",
    "star*and>gt",
    "*",
    ">",
    ".",
    "..",
    "dots.in.the.id",
    "trailing.",
    "$KV.other.key",
    "slash/and\\back",
    "percent%2F=",
    "tab\there",
    "unicode-ünïcødé-日本語-🚀",
    "\u{10FFFF}",
    "x".repeat(767),
    "x".repeat(768),
    "x".repeat(1000),
    "é".repeat(1000),
    "🚀".repeat(512), // 2048 bytes: the longest valid id
    "y".repeat(2048),
  ];
  const messages = await outbox.enqueueMany(hostile.map((id) => record({ id })));
  assert.deepEqual(ids(messages), hostile);
  for (const id of hostile) assert.equal((await peer.get(id))?.id, id);
  const claimed = await peer.claimDue(100, new Date());
  assert.deepEqual(ids(claimed), hostile, "FIFO by enqueue order, whatever the key encoding");
  const marks = await outbox.markMany(
    claimed.map((claim) => ({ claim, state: "dispatched" as const })),
    new Date(),
  );
  assert.deepEqual(marks, hostile.map(() => true));
  for (const id of hostile) assert.equal((await outbox.get(id))?.state, "dispatched");
  for (const id of hostile) {
    assert.equal(await inbox.record(id, { consumer: id }), true, id);
    assert.equal(await inbox.record(id, { consumer: id }), false, id);
  }
  await assert.rejects(outbox.enqueue(record({ id: "z".repeat(2049) })), {
    name: "OutboxValidationError",
  });
});

Deno.test("nats kv: duplicate enqueue paths", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const peer = fixture.outbox({ kv: fixture.peerKv });
  const r = record({ headers: { "X-A": "1" } });
  const first = await outbox.enqueue(r);
  // Concurrent duplicates from two connections: all return the one stored message.
  const racers = await Promise.all([
    outbox.enqueue(r),
    peer.enqueue(r),
    peer.enqueue({ ...r, headers: { "X-A": "1" } }),
  ]);
  for (const message of racers) assert.equal(message.createdAt, first.createdAt);
  await assert.rejects(peer.enqueue({ ...r, payload: "{}" }), {
    name: "OutboxDuplicateIdentityError",
  });
  // A batch with a conflicting id stores nothing (checked before any write).
  const fresh = record();
  await assert.rejects(outbox.enqueueMany([fresh, { ...r, subject: "orders.other" }]), {
    name: "OutboxDuplicateIdentityError",
  });
  assert.equal(await outbox.get(fresh.id), undefined);
  await assert.rejects(outbox.enqueueMany([fresh, { ...fresh, payload: "[]" }]), {
    name: "OutboxDuplicateIdentityError",
  });
  // Duplicate of a dispatched message: returned as stored, and it is not indexed again.
  const [claim] = await outbox.claimDue(1, new Date());
  assert.equal(await outbox.markDispatched(claim, new Date()), true);
  const again = await peer.enqueue(r);
  assert.equal(again.state, "dispatched");
  const marker = await fixture.kv.get(markerKeyOf(await outboxRecordKey(r.id)));
  assert.notEqual(marker?.operation, "PUT", "no live marker for a dispatched message");
  assert.deepEqual(await peer.claimDue(10, new Date(Date.now() + 86_400_000)), []);
  // A corrupt stored entry makes a duplicate a storage conflict, not a silent success.
  await fixture.corrupt(r.id);
  await assert.rejects(outbox.enqueue(r), { name: "OutboxStorageConflictError" });
});

Deno.test("nats kv: a dispatched message's marker is deleted without waiting for the acknowledgement; a peer's index sees it go", async () => {
  await using fixture = await openKvFixture();
  assert.equal(new KvRequests(fixture.kv).pipelined, true, "the pipelined path");
  const outbox = fixture.outbox();
  const counts = newCounts();
  const peer = fixture.outbox({ kv: countingKv(fixture.peerKv, counts) });
  const r = record();
  await outbox.enqueue(r);
  await (await peer.watch(() => {}))(); // the peer's index holds the marker
  const [claim] = await outbox.claimDue(1, new Date());
  assert.equal(await outbox.markDispatched(claim, new Date()), true);
  const markerKey = markerKeyOf(await outboxRecordKey(r.id));
  await eventually(async () => assert.equal((await fixture.kv.get(markerKey))?.operation, "DEL"));
  // The peer's index saw the delete (a sync, then its claim): it reads no record for it.
  await peer.stats();
  counts.calls = {};
  assert.deepEqual(await peer.claimDue(10, new Date(Date.now() + 86_400_000)), []);
  assert.equal(counts.calls.get ?? 0, 0, "no read of the dispatched record");
  assert.equal((await outbox.get(r.id))?.state, "dispatched");
  // Nor does this process's own index offer it again.
  assert.deepEqual(await outbox.claimDue(10, new Date(Date.now() + 86_400_000)), []);
});

Deno.test("nats kv: crash states between record and marker heal themselves", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox({ orphanGraceMs: 0 });
  const kv = fixture.kv;
  const now = new Date();

  // 1. Record written, marker lost: invisible to claims until a duplicate enqueue re-indexes it.
  const lost = record();
  await outbox.enqueue(lost);
  const lostMarker = markerKeyOf(await outboxRecordKey(lost.id));
  await kv.delete(lostMarker);
  assert.deepEqual(await outbox.claimDue(10, now), []);
  await outbox.enqueue(lost);
  assert.deepEqual(ids(await outbox.claimDue(10, now)), [lost.id]);

  // 2. Same, healed by the repair scan instead.
  const lost2 = record();
  await outbox.enqueue(lost2);
  await kv.delete(markerKeyOf(await outboxRecordKey(lost2.id)));
  assert.deepEqual(await outbox.claimDue(10, now), []);
  const repaired = await outbox.repair();
  assert.equal(repaired.markersCreated, 1);
  assert.deepEqual(ids(await outbox.claimDue(10, now)), [lost2.id]);

  // 3. Record settled, marker left behind: the next claim drops it.
  const settled = record();
  await outbox.enqueue(settled);
  const [claim] = await outbox.claimDue(1, now);
  await outbox.markDispatched(claim, now);
  const settledMarker = markerKeyOf(await outboxRecordKey(settled.id));
  await kv.put(settledMarker, JSON.stringify({ v: 1, id: settled.id }));
  await eventually(async () => {
    assert.deepEqual(await outbox.claimDue(10, now), []);
    assert.notEqual((await kv.get(settledMarker))?.operation, "PUT");
  });

  // 4. Marker written, record never stored (its write failed): dropped after the grace period.
  const orphanMarker = markerKeyOf(await outboxRecordKey("never-stored"));
  await kv.put(orphanMarker, JSON.stringify({ v: 1, id: "never-stored" }));
  await eventually(async () => {
    assert.deepEqual(await outbox.claimDue(10, now), []);
    assert.notEqual((await kv.get(orphanMarker))?.operation, "PUT");
  });

  // 5. A damaged marker still leads to its record (the id is in the key).
  const damaged = record();
  await outbox.enqueue(damaged);
  await kv.put(markerKeyOf(await outboxRecordKey(damaged.id)), "garbage");
  assert.deepEqual(ids(await outbox.claimDue(10, now)), [damaged.id]);

  // 6. An orphan younger than the grace period is kept: its record may still be in flight.
  const patient = fixture.outbox({ orphanGraceMs: 3_600_000 });
  const youngOrphan = markerKeyOf(await outboxRecordKey("in-flight"));
  await kv.put(youngOrphan, JSON.stringify({ v: 1, id: "in-flight" }));
  assert.deepEqual(await patient.claimDue(10, now), []);
  assert.equal((await kv.get(youngOrphan))?.operation, "PUT");
  await kv.put(
    await outboxRecordKey("in-flight"),
    JSON.stringify({
      v: 1,
      id: "in-flight",
      kind: "event.publish",
      name: "n",
      subject: "s.a",
      payload: "{}",
      headers: {},
      state: "pending",
      attempts: 0,
      createdAt: now.toISOString(),
      updatedAt: now.toISOString(),
    }),
  );
  assert.deepEqual(ids(await patient.claimDue(10, now)), ["in-flight"]);

  // 7. A requeue that crashed after the record write: requeueing again re-indexes it.
  const requeued = record();
  await outbox.enqueue(requeued);
  const [doomed] = await outbox.claimDue(1, now);
  assert.equal(doomed.id, requeued.id);
  assert.equal(await outbox.markDead(doomed, { error: "no stream", now }), true);
  assert.equal(await outbox.requeue([requeued.id], now), 1);
  await kv.delete(markerKeyOf(await outboxRecordKey(requeued.id)));
  // A repository started now sees the bucket as the crash left it (the first one's index may
  // not have received the marker's deletion from its watch yet).
  const restarted = fixture.outbox();
  assert.deepEqual(await restarted.claimDue(10, now), []);
  assert.equal(await restarted.requeue([requeued.id], now), 0, "nothing was dead");
  assert.deepEqual(ids(await restarted.claimDue(10, now)), [requeued.id]);
});

Deno.test("nats kv: corrupt entries are dead, listed, and never break a claim", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox();
  const [a, b, c, d] = [record(), record(), record(), record({ id: "é".repeat(600) })];
  await outbox.enqueueMany([a, b, c, d]);
  await fixture.corrupt(b.id);
  // Valid JSON that breaks the schema: a claimed record without a lease.
  const key = await outboxRecordKey(d.id);
  const stored = (await fixture.kv.get(key))!.json<Record<string, unknown>>();
  await fixture.kv.put(key, JSON.stringify({ ...stored, state: "claimed", attempts: "one" }));
  assert.deepEqual(ids(await outbox.claimDue(10, new Date())), [a.id, c.id]);
  const dead = await outbox.listDead();
  assert.deepEqual(ids(dead).sort(), [b.id, d.id].sort());
  for (const message of dead) {
    assert.equal(message.state, "dead");
    assert.match(message.lastError ?? "", /^Corrupt outbox record/);
  }
  const got = await outbox.get(b.id);
  assert.equal(got?.state, "dead");
  assert.match(got?.lastError ?? "", /Corrupt/);
  assert.equal(await outbox.requeue([b.id]), 0, "a corrupt entry cannot be requeued");
  const stats = await outbox.stats();
  assert.equal(stats.dead, 2);
  assert.equal(stats.claimed, 2);
  assert.equal((await outbox.prune({ deadBefore: new Date(Date.now() + 60_000) })).dead, 2);
  assert.deepEqual(await outbox.listDead(), []);
});

Deno.test("nats kv: watch wakes a dispatcher in another process", async () => {
  await using fixture = await openKvFixture();
  const dispatcher = fixture.outbox();
  const producer = fixture.outbox({ kv: fixture.peerKv });
  const seen: NatsKvWork[] = [];
  const claimed: string[] = [];
  const claims: Promise<void>[] = [];
  let wake: () => void = () => {};
  let woken = new Promise<void>((resolve) => wake = resolve);
  const unwatch = await dispatcher.watch((work) => {
    seen.push(work);
    // Claiming from inside the callback sees the message: the index already has it.
    claims.push(
      dispatcher.claimDue(10, new Date()).then((batch) => {
        claimed.push(...ids(batch));
        if (batch.length > 0) wake();
      }),
    );
  });
  const r = record();
  await producer.enqueue(r);
  await woken;
  assert.deepEqual(claimed, [r.id]);
  assert.equal(seen[0].id, r.id);
  assert.equal(seen[0].dueAt, undefined);

  // A failure reschedules the message: listeners learn when it is due.
  seen.length = 0;
  woken = new Promise<void>((resolve) => wake = resolve);
  const [claim] = [(await dispatcher.get(r.id))!];
  const retryAt = new Date(Date.now() + 3_600_000);
  assert.equal(
    await dispatcher.markFailed(claim, { error: "later", now: new Date(), nextAttemptAt: retryAt }),
    true,
  );
  await eventually(() => {
    assert.equal(seen.at(-1)?.dueAt, retryAt.toISOString());
    return Promise.resolve();
  });
  await unwatch();
  await Promise.all(claims);
  assert.deepEqual(claimed, [r.id], "the rescheduled message was not due");
});

Deno.test("nats kv: a claim sees messages enqueued by another process just before it", async () => {
  await using fixture = await openKvFixture();
  const claimer = fixture.outbox();
  const producer = fixture.outbox({ kv: fixture.peerKv });
  assert.deepEqual(await claimer.claimDue(10, new Date()), []); // index is live now
  for (let round = 0; round < 20; round++) {
    const r = record();
    await producer.enqueue(r);
    // No waiting: when its index cannot fill the claim, the claimer syncs with the bucket.
    assert.deepEqual(ids(await claimer.claimDue(10, new Date())), [r.id]);
  }
});

Deno.test("nats kv: markMany issues its writes concurrently", async () => {
  await using fixture = await openKvFixture();
  let inFlight = 0;
  let peak = 0;
  const tracked = new Proxy(fixture.kv, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      if (property !== "update" || typeof value !== "function") {
        return typeof value === "function" ? value.bind(target) : value;
      }
      return async (...args: unknown[]) => {
        inFlight += 1;
        peak = Math.max(peak, inFlight);
        try {
          return await value.apply(target, args);
        } finally {
          inFlight -= 1;
        }
      };
    },
  });
  const outbox = fixture.outbox({ kv: tracked });
  await outbox.enqueueMany(Array.from({ length: 20 }, () => record()));
  const claims = await outbox.claimDue(20, new Date());
  peak = 0;
  const results = await outbox.markMany(
    claims.map((claim, i) =>
      i % 2 === 0 ? { claim, state: "dispatched" as const } : {
        claim,
        state: "failed" as const,
        error: "retry",
        nextAttemptAt: new Date(Date.now() + 60_000),
      }
    ),
    new Date(),
  );
  assert.deepEqual(results, claims.map(() => true));
  assert.equal(peak, 20, "all 20 record writes were in flight together");
});

Deno.test("nats kv: stats, listDead and prune finish while another process keeps writing", async () => {
  // Before: the scan followed the writes (nats.js history() ends only when it has caught up),
  // so stats() on a bucket another process kept writing ran until the writes paused.
  await using fixture = await openKvFixture();
  const reader = fixture.outbox();
  const writer = fixture.outbox({ kv: fixture.peerKv });
  await writer.enqueueMany(Array.from({ length: 200 }, () => record()));
  const limit = 5_000;
  let written = 0;
  let scansDone = false;
  const writing = (async () => {
    // A dispatcher's churn: enqueue, claim, settle.
    while (!scansDone && written < limit) {
      await writer.enqueue(record());
      const claims = await writer.claimDue(5, new Date());
      await writer.markMany(
        claims.map((claim) => ({ claim, state: "dispatched" as const })),
        new Date(),
      );
      written += 1;
    }
  })();
  try {
    for (let i = 0; i < 3; i++) {
      await reader.stats();
      await reader.listDead();
      await reader.prune({ dispatchedBefore: new Date(0) });
    }
    assert.ok(
      written < limit,
      `the scans returned while the writer was still writing (${written})`,
    );
  } finally {
    scansDone = true;
    await writing;
  }
});

for (const markerCopies of [false, true]) {
  const copies = markerCopies ? " (marker copies)" : "";
  Deno.test(`nats kv${copies}: claim work does not grow with dispatched messages kept in the bucket`, async () => {
    await using fixture = await openKvFixture({ markerCopies });
    const filler = fixture.outbox();
    const dispatched = 10_000;
    const now = new Date();
    for (let done = 0; done < dispatched; done += 500) {
      await filler.enqueueMany(Array.from({ length: 500 }, () => record()));
      const claims = await filler.claimDue(500, now);
      assert.equal(claims.length, 500);
      await filler.markMany(claims.map((claim) => ({ claim, state: "dispatched" as const })), now);
    }
    await using empty = await openKvFixture({ markerCopies });

    async function measure(kv: typeof fixture.kv) {
      const counts = newCounts();
      const outbox = (kv === fixture.kv ? fixture : empty).outbox({ kv: countingKv(kv, counts) });
      await outbox.enqueueMany(Array.from({ length: 10 }, () => record()));
      const startup = { ...counts, calls: { ...counts.calls } };
      // First claim: starts the watch (its snapshot replays marker tombstones not yet pruned).
      const first = await outbox.claimDue(5, now);
      const afterFirst = {
        ops: operations(counts),
        watched: counts.watched,
        calls: { ...counts.calls },
      };
      // Steady state: the next claim.
      const second = await outbox.claimDue(5, now);
      const steadyOps = operations(counts) - afterFirst.ops;
      const steadyGets = (counts.calls.get ?? 0) - (afterFirst.calls.get ?? 0);
      assert.equal(first.length, 5);
      assert.equal(second.length, 5);
      return {
        enqueueOps: operations(startup),
        firstClaimOps: afterFirst.ops - operations(startup),
        firstClaimWatched: afterFirst.watched,
        steadyOps,
        steadyGets,
      };
    }

    const big = await measure(fixture.kv);
    const small = await measure(empty.kv);
    console.log(`claim work, 0 dispatched: ${JSON.stringify(small)}`);
    console.log(`claim work, ${dispatched} dispatched: ${JSON.stringify(big)}`);
    // With copies, their markers carry the records: a claim of 5 fresh messages reads none of them.
    assert.equal(big.steadyGets, markerCopies ? 0 : 5, "a claim of 5 reads 5 records, or none");
    assert.equal(big.steadyOps, small.steadyOps);
    assert.equal(big.firstClaimOps, small.firstClaimOps);

    // Retention removes the records and their marker tombstones: a new claimer's snapshot is small.
    const pruned = await filler.prune({ dispatchedBefore: new Date(Date.now() + 60_000) });
    assert.equal(pruned.dispatched, dispatched);
    const after = await measure(fixture.kv);
    console.log(`claim work after prune: ${JSON.stringify(after)}`);
    assert.ok(after.firstClaimWatched < 50, `snapshot replayed ${after.firstClaimWatched} entries`);
  });

  Deno.test(`nats kv${copies}: a starting claimer learns other claimers' leases once`, async () => {
    await using fixture = await openKvFixture({ markerCopies });
    const busy = fixture.outbox();
    await busy.enqueueMany(Array.from({ length: 200 }, () => record()));
    const now = new Date();
    assert.equal((await busy.claimDue(200, now, { leaseMs: 600_000 })).length, 200);
    const fresh = Array.from({ length: 10 }, () => record());
    await busy.enqueueMany(fresh);
    const counts = newCounts();
    const starting = fixture.outbox({ kv: countingKv(fixture.peerKv, counts) });
    // Its index cannot know the 200 leases yet: it reads them once (a few rounds, read-ahead).
    assert.deepEqual(ids(await starting.claimDue(5, now)), ids(fresh.slice(0, 5)));
    console.log(`first claim next to 200 foreign leases: ${counts.calls.get} reads`);
    assert.ok((counts.calls.get ?? 0) <= 210, `first claim read ${counts.calls.get} records`);
    const before = counts.calls.get ?? 0;
    assert.deepEqual(ids(await starting.claimDue(5, now)), ids(fresh.slice(5)));
    // Then only what it claims; with copies nothing: those markers carry their records.
    assert.equal(
      (counts.calls.get ?? 0) - before,
      markerCopies ? 0 : 5,
      "then only what it claims (with copies, nothing)",
    );
  });
}

Deno.test("nats kv: prune on a KV object without stream access leaves tombstones only", async () => {
  await using fixture = await openKvFixture();
  // A KV that exposes only the KV interface (no JetStream manager): deletes leave tombstones
  // (revision-checked deletes, not purges: see tests/nats_kv_prune_strand_test.ts).
  const outbox = fixture.outbox({ kv: withoutStreamAccess(fixture.kv) });
  const [a, b] = [record(), record()];
  await outbox.enqueueMany([a, b]);
  const claims = await outbox.claimDue(2, new Date());
  await outbox.markDispatched(claims[0], new Date());
  const result = await outbox.prune({ dispatchedBefore: new Date(Date.now() + 60_000) });
  assert.deepEqual({ ...result }, { dispatched: 1, dead: 0 });
  assert.equal(await outbox.get(a.id), undefined);
  assert.equal((await fixture.kv.get(await outboxRecordKey(a.id)))?.operation, "DEL");
  assert.equal((await outbox.get(b.id))?.state, "claimed");
  // The id can be enqueued again over the tombstone.
  assert.equal((await outbox.enqueue(a)).state, "pending");
  const inbox = fixture.inbox({ kv: withoutStreamAccess(fixture.inboxKv) });
  assert.equal(await inbox.record("old", new Date(Date.now() - 60_000)), true);
  assert.equal(await inbox.prune({ receivedBefore: new Date(Date.now() - 1_000) }), 1);
  assert.equal(await inbox.record("old"), true);
});

Deno.test("nats kv: inbox retention by bucket max_age on this server, or by expire()", async () => {
  const nc = await connectNats();
  const kvm = new Kvm(nc);
  const names = [uniqueName("kvi"), uniqueName("kvi")];
  try {
    const aged = await createInboxBucket(kvm, names[0], { retentionMs: 1_000 });
    const byAge = new NatsKvInboxRepository(aged, { retentionMs: 1_000 });
    assert.deepEqual(await byAge.retention(), { mode: "bucket-max-age", windowMs: 1_000 });
    assert.equal(await byAge.record("evt-1"), true);
    assert.equal(await byAge.record("evt-1"), false);
    // The server forgets it after max_age: recording it again then succeeds.
    await eventually(async () => assert.equal(await byAge.record("evt-1"), true));

    const plain = await createInboxBucket(kvm, names[1], { retentionMs: 0 });
    const byPrune = new NatsKvInboxRepository(plain, { retentionMs: 60_000 });
    assert.deepEqual(await byPrune.retention(), { mode: "prune", windowMs: 60_000 });
    const t0 = new Date();
    assert.equal(await byPrune.record("old", new Date(t0.getTime() - 120_000)), true);
    assert.equal(await byPrune.record("new", t0), true);
    assert.equal(await byPrune.expire(t0), 1);
    assert.equal(await byPrune.record("old", t0), true);
    assert.equal(await byPrune.record("new", t0), false);
  } finally {
    for (const name of names) await (await kvm.open(name)).destroy().catch(() => {});
    await nc.close();
  }
});

Deno.test("nats kv: bucket helpers", async () => {
  const nc = await connectNats();
  const kvm = new Kvm(nc);
  const outboxName = uniqueName("kvo");
  const agedName = uniqueName("kvo");
  try {
    const kv = await createOutboxBucket(kvm, outboxName);
    const config = (await kv.status()).streamInfo.config;
    assert.equal(config.max_msgs_per_subject, 1);
    assert.equal(config.storage, "file");
    assert.equal(config.max_age, 0);
    assert.equal(config.num_replicas, 1);
    // Opening it again works; an expiring bucket is refused as an outbox.
    await createOutboxBucket(kvm, outboxName);
    await kvm.create(agedName, { ttl: 60_000 });
    await assert.rejects(createOutboxBucket(kvm, agedName), { name: "OutboxValidationError" });
    await assert.rejects(createOutboxBucket(kvm, uniqueName("kvo"), { replicas: 2 }), {
      name: "OutboxValidationError",
    });
    // A lost CAS is recognised by its JetStream error code.
    await kv.create("k", "1");
    const error = await kv.create("k", "2").catch((e) => e);
    assert.equal(isWrongLastSequence(error), true);
    assert.equal(isWrongLastSequence(new Error("wrong last sequence: 1")), false);
  } finally {
    for (const name of [outboxName, agedName]) {
      await (await kvm.open(name)).destroy().catch(() => {});
    }
    await nc.close();
  }
});

Deno.test("nats kv: key tokens are valid KV tokens and reversible below the hash limit", async () => {
  const { decodeToken, encodeToken, maxDirectTokenChars } = await import(
    "../src/stores/nats_kv/keys.ts"
  );
  const samples = ["", "a", ".", "*", ">", "a.b", "é", "🚀", "\u{10FFFF}", "x".repeat(767)];
  for (const text of samples) {
    const token = await encodeToken(text);
    assert.match(token, /^b[A-Za-z0-9_-]*$/);
    assert.equal(decodeToken(token), text);
  }
  const long = await encodeToken("x".repeat(768));
  assert.match(long, /^h[A-Za-z0-9_-]{43}$/);
  assert.equal(decodeToken(long), undefined);
  assert.notEqual(long, await encodeToken("x".repeat(769)));
  assert.ok((await encodeToken("x".repeat(767))).length <= maxDirectTokenChars);
  assert.equal(decodeToken("b!!"), undefined);
  assert.equal(decodeToken("b_w"), undefined, "0xFF is not UTF-8");
});
