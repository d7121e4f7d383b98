/**
 * Ordering keys on the NATS KV outbox under interleavings a conformance case cannot produce, on a
 * real bucket with two store instances (two connections, two in-process indexes): an enqueue of
 * a key racing the hand-over of its head (both ways round), writes whose reply is lost after
 * they applied, two concurrent skips, and two producers and four dispatchers on shared keys.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import type { OutboxMessage, OutboxRecord } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { countingKv, intercept, isKeyEntry, newCounts, openKvFixture } from "./nats_kv_fixture.ts";

const keyed = (orderingKey: string): OutboxRecord => keyedRecord("kr", orderingKey);

function headIn(data: unknown): string | undefined {
  const text = typeof data === "string" ? data : new TextDecoder().decode(data as Uint8Array);
  return JSON.parse(text).head;
}

async function markerExists(kv: KV, id: string): Promise<boolean> {
  const entry = await kv.get(markerKeyOf(await outboxRecordKey(id)));
  return entry?.operation === "PUT";
}

/** A write that applied on the server and whose reply was then lost. */
class LostReplyError extends Error {
  constructor() {
    super("reply lost (simulated)");
    this.name = "LostReplyError";
  }
}

Deno.test("nats kv ordering: an enqueue landing while another instance hands its key over is the next head", async () => {
  await using fixture = await openKvFixture();
  const k = "race-key-a";
  const [m1, m2] = [keyed(k), keyed(k)];
  const producer = fixture.outbox({ kv: fixture.peerKv });
  let raced = false;
  // The dispatching instance has read the key entry and found no next message; before its write
  // reaches the server, the other instance enqueues m2 (record, marker, join) completely.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    if (isKeyEntry(key) && !raced && headIn(data) === undefined) {
      raced = true;
      await producer.enqueue(m2);
    }
    return await update(key, data, revision);
  });
  const dispatcher = fixture.outbox({ kv });
  await dispatcher.enqueue(m1);
  const [claim] = await dispatcher.claimDue(10, new Date());
  assert.equal(claim.id, m1.id);
  assert.equal(await dispatcher.markDispatched(claim, new Date()), true);
  assert.ok(raced, "the enqueue ran inside the hand-over");
  const [next, ...others] = await producer.claimDue(10, new Date());
  assert.equal(next?.id, m2.id, "m2 heads the key: not stranded");
  assert.deepEqual(others, []);
  assert.deepEqual(await dispatcher.claimDue(10, new Date()), [], "one head");
});

Deno.test("nats kv ordering: a hand-over landing between an enqueue's marker and its join", async () => {
  await using fixture = await openKvFixture();
  for (const [round, later] of [[0, 0], [1, 1]] as const) {
    // later = 1: a third message waits too, so the hand-over finds a next message.
    const k = `race-key-b${round}`;
    const m1 = keyed(k);
    const waiting = later ? [keyed(k)] : [];
    const m2 = keyed(k);
    const dispatcher = fixture.outbox({ kv: fixture.peerKv });
    await dispatcher.enqueueMany([m1, ...waiting]);
    const [claim] = await dispatcher.claimDue(10, new Date());
    assert.equal(claim.id, m1.id);
    let raced = false;
    // The producer stored m2 and its marker and read the key entry; before its join's write
    // lands, the other instance dispatches m1 and hands the key over.
    const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
      if (isKeyEntry(key) && !raced) {
        raced = true;
        assert.equal(await dispatcher.markDispatched(claim, new Date()), true);
      }
      return await update(key, data, revision);
    });
    const producer = fixture.outbox({ kv });
    await producer.claimDue(1, new Date()); // starts its index: its join writes over what it knows
    await producer.enqueue(m2);
    assert.ok(raced, "the hand-over ran inside the join");
    const order: string[] = [];
    for (let step = 0; step < 3; step++) {
      const claims = [
        ...await producer.claimDue(10, new Date()),
        ...await dispatcher.claimDue(10, new Date()),
      ];
      assert.ok(claims.length <= 1, `one head at a time, got ${claims.map((c) => c.id)}`);
      if (claims.length === 0) break;
      order.push(claims[0].id);
      assert.equal(await producer.markDispatched(claims[0], new Date()), true);
    }
    assert.deepEqual(order, [...waiting.map((r) => r.id), m2.id], "nothing stranded, in order");
  }
});

Deno.test("nats kv ordering: a join whose reply is lost after it applied; the retried enqueue", async () => {
  await using fixture = await openKvFixture();
  const k = "lost-join";
  const [m1, m2] = [keyed(k), keyed(k)];
  let lost = 0;
  const kv = intercept(fixture.kv, "create", (create) => async (key, data, ...rest) => {
    const written = await create(key, data, ...rest);
    if (isKeyEntry(key) && lost === 0) {
      lost += 1;
      throw new LostReplyError();
    }
    return written;
  });
  const outbox = fixture.outbox({ kv });
  await assert.rejects(outbox.enqueue(m1), { name: "LostReplyError" });
  assert.equal((await outbox.enqueue(m1)).state, "pending", "the retry returns the stored message");
  await outbox.enqueue(m2);
  const [head, ...rest] = await outbox.claimDue(10, new Date());
  assert.equal(head?.id, m1.id);
  assert.deepEqual(rest, [], "m2 waits: one head");
  assert.equal(await outbox.markDispatched(head, new Date()), true);
  assert.deepEqual((await outbox.claimDue(10, new Date())).map((m) => m.id), [m2.id]);
});

Deno.test("nats kv ordering: a dispatched mark whose reply is lost hands over when retried", async () => {
  await using fixture = await openKvFixture();
  const k = "lost-mark";
  const [m1, m2] = [keyed(k), keyed(k)];
  const recordKey = await outboxRecordKey(m1.id);
  let lost = false;
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    const written = await update(key, data, revision);
    const text = new TextDecoder().decode(data as Uint8Array);
    if (key === recordKey && !lost && JSON.parse(text).state === "dispatched") {
      lost = true;
      throw new LostReplyError();
    }
    return written;
  });
  const outbox = fixture.outbox({ kv, claimCacheSize: 0 });
  await outbox.enqueueMany([m1, m2]);
  const [claim] = await outbox.claimDue(10, new Date(), { leaseMs: 60_000 });
  await assert.rejects(outbox.markDispatched(claim, new Date()), { name: "LostReplyError" });
  assert.equal(
    await outbox.markDispatched(claim, new Date()),
    true,
    "the retry reports it applied",
  );
  // Long before m1's lease would expire, m2 heads the key.
  const claims = await outbox.claimDue(10, new Date());
  assert.deepEqual(claims.map((m) => m.id), [m2.id]);
  assert.equal(await markerExists(fixture.kv, m1.id), false);
});

Deno.test("nats kv ordering: a hand-over whose reply is lost after it applied", async () => {
  await using fixture = await openKvFixture();
  const k = "lost-hand-over";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  let lost = false;
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    const written = await update(key, data, revision);
    if (isKeyEntry(key) && !lost && headIn(data) === m2.id) {
      lost = true;
      throw new LostReplyError();
    }
    return written;
  });
  const outbox = fixture.outbox({ kv });
  const peer = fixture.outbox({ kv: fixture.peerKv });
  await outbox.enqueueMany([m1, m2, m3]);
  const [claim] = await outbox.claimDue(10, new Date());
  assert.equal(await outbox.markDispatched(claim, new Date()), true, "the record is dispatched");
  assert.ok(lost);
  assert.equal(await markerExists(fixture.kv, m1.id), false, "the key entry says it moved on");
  const claims = [...await peer.claimDue(10, new Date()), ...await outbox.claimDue(10, new Date())];
  assert.deepEqual(claims.map((m) => m.id), [m2.id], "m2 alone heads the key");
  assert.equal(await peer.markDispatched(claims[0], new Date()), true);
  assert.deepEqual((await outbox.claimDue(10, new Date())).map((m) => m.id), [m3.id]);
});

Deno.test("nats kv ordering: two instances skipping one blocked key: one skip applies", async () => {
  await using fixture = await openKvFixture();
  const k = "double-skip";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const a = fixture.outbox();
  const b = fixture.outbox({ kv: fixture.peerKv });
  await a.enqueueMany([m1, m2, m3]);
  const [claim] = await a.claimDue(10, new Date());
  assert.equal(await a.markDead(claim, { error: "poison", now: new Date() }), true);
  await b.claimDue(1, new Date()); // both indexes know the blocked key
  const results = await Promise.all([
    a.unblockKey(k, { action: "skip" }),
    b.unblockKey(k, { action: "skip" }),
  ]);
  assert.deepEqual(results.filter(Boolean).length, 1, `one skip applies: ${results}`);
  const claims = [...await a.claimDue(10, new Date()), ...await b.claimDue(10, new Date())];
  assert.deepEqual(claims.map((m) => m.id), [m2.id], "m2 heads the key, m3 waits");
});

Deno.test("nats kv ordering: a skip that reads the head after another skip's record write and before its hand-over does not apply too", async () => {
  await using fixture = await openKvFixture();
  const k = "skip-between";
  const [m1, m2, m3] = [keyed(k), keyed(k), keyed(k)];
  const b = fixture.outbox({ kv: fixture.peerKv });
  let second: boolean | undefined;
  // a's hand-over (its key-entry write) runs only after b's whole skip.
  const kv = intercept(fixture.kv, "update", (update) => async (key, data, revision) => {
    if (isKeyEntry(key) && second === undefined) {
      second = false;
      second = await b.unblockKey(k, { action: "skip" });
    }
    return await update(key, data, revision);
  });
  const a = fixture.outbox({ kv });
  await a.enqueueMany([m1, m2, m3]);
  const [claim] = await a.claimDue(10, new Date());
  assert.equal(await a.markDead(claim, { error: "poison", now: new Date() }), true);
  await b.claimDue(1, new Date()); // b's index knows the blocked key
  second = undefined;
  assert.equal(await a.unblockKey(k, { action: "skip" }), true);
  assert.equal(second, false, "the second skip found the head skipped: it did not apply");
  const claims = [...await a.claimDue(10, new Date()), ...await b.claimDue(10, new Date())];
  assert.deepEqual(claims.map((m) => m.id), [m2.id], "m2 heads the key, m3 waits");
});

Deno.test("nats kv ordering: two producers and four dispatchers in two instances keep every key's order", async () => {
  await using fixture = await openKvFixture();
  const a = fixture.outbox();
  const b = fixture.outbox({ kv: fixture.peerKv });
  const keys = Array.from({ length: 6 }, (_, i) => `shared-${i}`);
  const perProducer = 12;
  // Each producer enqueues its own messages of every key in order; the two interleave freely.
  const produced = new Map<string, string[]>(); // `${producer}/${key}` -> ids in enqueue order
  const produce = async (name: string, store: typeof a) => {
    for (let i = 0; i < perProducer; i++) {
      const batch = keys.map((key) => keyed(key));
      for (const record of batch) {
        const list = produced.get(`${name}/${record.orderingKey}`) ?? [];
        list.push(record.id);
        produced.set(`${name}/${record.orderingKey}`, list);
      }
      if (i % 2 === 0) await store.enqueueMany(batch);
      else for (const record of batch) await store.enqueue(record);
    }
  };
  const total = keys.length * perProducer * 2;
  const published = new Map<string, string[]>(keys.map((key) => [key, []]));
  const inFlight = new Map<string, string>();
  let done = 0;
  let producing = true;
  const dispatch = async (store: typeof a) => {
    let idle = 0;
    while (producing || idle < 20) {
      const batch: OutboxMessage[] = await store.claimDue(4, new Date());
      if (batch.length === 0) {
        idle += 1;
        await new Promise((resolve) => setTimeout(resolve, 10));
        continue;
      }
      idle = 0;
      for (const message of batch) {
        const key = message.orderingKey!;
        assert.equal(inFlight.get(key), undefined, `two messages of ${key} in flight`);
        inFlight.set(key, message.id);
        published.get(key)!.push(message.id);
      }
      await new Promise((resolve) => setTimeout(resolve, 1));
      for (const message of batch) {
        inFlight.delete(message.orderingKey!);
        assert.equal(await store.markDispatched(message, new Date()), true);
        done += 1;
      }
    }
  };
  const dispatchers = [dispatch(a), dispatch(a), dispatch(b), dispatch(b)];
  await Promise.all([produce("a", a), produce("b", b)]);
  producing = false;
  await Promise.all(dispatchers);
  assert.equal(done, total, "every message dispatched once: none stranded");
  for (const key of keys) {
    const out = published.get(key)!;
    assert.equal(new Set(out).size, out.length, `no duplicates for ${key}`);
    for (const producer of ["a", "b"]) {
      const mine = produced.get(`${producer}/${key}`)!;
      assert.deepEqual(
        out.filter((id) => mine.includes(id)),
        mine,
        `${producer}'s ${key} in order`,
      );
    }
  }
  assert.deepEqual(await a.blockedKeys(), []);
  const stats = await b.stats();
  assert.equal(stats.pending + stats.claimed + stats.failed, 0);
});

Deno.test("nats kv ordering: a claim reads heads only, whatever a key's backlog; a hand-over costs two writes", async () => {
  await using fixture = await openKvFixture();
  const setup = fixture.outbox({ kv: fixture.peerKv });
  const heavy = Array.from({ length: 300 }, () => keyed("backlog"));
  const light = Array.from({ length: 4 }, (_, i) => keyed(`light-${i}`));
  await setup.enqueueMany([...heavy, ...light]);
  const counts = newCounts();
  const outbox = fixture.outbox({ kv: countingKv(fixture.kv, counts) });
  await (await outbox.watch(() => {}))(); // starts the index
  const before = { ...counts.calls };
  const claims = await outbox.claimDue(10, new Date());
  assert.deepEqual(claims.map((m) => m.id), [heavy[0].id, ...light.map((r) => r.id)]);
  const delta = (name: string) => (counts.calls[name] ?? 0) - (before[name] ?? 0);
  // 5 heads: 5 record reads and 5 claim writes (+ the sync barrier's write); none of the 299
  // messages waiting behind the first head is read.
  assert.ok(delta("get") <= 5, `claim reads: ${delta("get")}`);
  assert.ok(delta("update") <= 5, `claim writes: ${delta("update")}`);
  const settle = { ...counts.calls };
  assert.equal(await outbox.markDispatched(claims[0], new Date()), true);
  const marked = (name: string) => (counts.calls[name] ?? 0) - (settle[name] ?? 0);
  assert.equal(marked("get"), 0, "the hand-over reads the key entry from the index");
  assert.equal(marked("update"), 2, "the record and the key entry");
  assert.deepEqual((await outbox.claimDue(10, new Date())).map((m) => m.id), [heavy[1].id]);
});

for (const via of ["read", "large", "copy"] as const) {
  Deno.test(`nats kv ordering (${via}): a claim whose record read is newer than its index checks the head`, async () => {
    // "read": markers without copies (the default), the claim reads m2 (the race runs before the
    // read); "large": with marker copies, m2 is too large for its marker to carry one, so the
    // claim reads it too; "copy": with marker copies, the claim compares-and-sets m2 from its
    // marker's copy (the race runs before that write, which then fails, and the claim reads the
    // record).
    await using fixture = await openKvFixture({ markerCopies: via !== "read" });
    const k = "aba";
    const [m2, m3] = [
      via === "large"
        ? keyedRecord("kor", k, { payload: JSON.stringify({ pad: "x".repeat(10_000) }) })
        : keyed(k),
      keyed(k),
    ];
    const recordKey = await outboxRecordKey(m2.id);
    const b = fixture.outbox({ kv: fixture.peerKv });
    await b.enqueueMany([m2, m3]);
    let raced = false;
    // This instance's index knows m2 as the head. Before its read of m2's record, the other
    // instance claims m2, dead-letters it, skips it (m3 heads the key) and requeues it (m2 waits
    // behind m3): the record this claim reads is pending again, newer than what its index knew.
    // Its watch is held meanwhile (released shortly after the read), so its index is behind the
    // record it reads.
    const { kv: watched, hold, release } = holdableWatch(fixture.kv);
    const race = async () => {
      raced = true;
      hold();
      const [claim] = await b.claimDue(10, new Date());
      assert.equal(claim.id, m2.id);
      assert.equal(await b.markDead(claim, { error: "x", now: new Date() }), true);
      assert.equal(await b.unblockKey(k, { action: "skip" }), true);
      assert.equal(await b.requeue([m2.id]), 1);
      setTimeout(release, 100);
    };
    const kv = via !== "copy"
      ? intercept(watched, "get", (get) => async (key: string) => {
        if (key === recordKey && !raced) await race();
        return await get(key);
      })
      : intercept(watched, "update", (update) => async (key: string, value, revision) => {
        if (key === recordKey && !raced) await race();
        return await update(key, value, revision);
      });
    const a = fixture.outbox({ kv });
    await (await a.watch(() => {}))(); // starts the index: m2 heads the key
    const claims = await a.claimDue(10, new Date());
    assert.ok(raced);
    assert.ok(!claims.some((m) => m.id === m2.id), "m2 is no longer the head: not claimed");
    const all = [
      ...claims,
      ...await b.claimDue(10, new Date()),
      ...await a.claimDue(10, new Date()),
    ];
    assert.deepEqual(all.map((m) => m.id), [m3.id], "m3 alone heads the key");
  });
}

/** `kv` whose watches can be held (entries wait) and released, to keep an index behind. */
function holdableWatch(kv: KV): { kv: KV; hold(): void; release(): void } {
  let gate: Promise<void> | undefined;
  let open = () => {};
  const held = intercept(kv, "watch", (watch) => async (options) => {
    const iterator = await watch(options);
    const source = iterator[Symbol.asyncIterator]();
    return new Proxy(iterator, {
      get(target, property) {
        if (property === Symbol.asyncIterator) {
          return () => ({
            next: async () => {
              const item = await source.next();
              await gate;
              return item;
            },
            return: source.return?.bind(source),
          });
        }
        const value = Reflect.get(target, property, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  });
  return {
    kv: held,
    hold() {
      gate = new Promise<void>((resolve) => (open = resolve));
    },
    release() {
      gate = undefined;
      open();
    },
  };
}

Deno.test("nats kv ordering: a requeue of a skipped message by an instance whose index still names it head", async () => {
  await using fixture = await openKvFixture();
  const k = "stale-requeue";
  const [x, y] = [keyed(k), keyed(k)];
  const a = holdableWatch(fixture.kv);
  const b = holdableWatch(fixture.peerKv);
  const requeuer = fixture.outbox({ kv: a.kv });
  const dispatcher = fixture.outbox({ kv: b.kv });
  await requeuer.enqueueMany([x, y]);
  await (await requeuer.watch(() => {}))();
  await (await dispatcher.watch(() => {}))();
  await requeuer.blockedKeys(); // its index has caught up: x heads the key
  a.hold(); // from here the requeuer's index still says x heads the key
  const [claimX] = await dispatcher.claimDue(10, new Date());
  assert.equal(claimX.id, x.id);
  assert.equal(await dispatcher.markDead(claimX, { error: "x", now: new Date() }), true);
  assert.equal(await dispatcher.unblockKey(k, { action: "skip" }), true);
  const [claimY] = await dispatcher.claimDue(10, new Date());
  assert.equal(claimY.id, y.id);
  b.hold(); // the dispatcher's index will not see x come back before its hand-over
  assert.equal(await requeuer.requeue([x.id]), 1);
  setTimeout(() => b.release(), 300);
  assert.equal(await dispatcher.markDispatched(claimY, new Date()), true);
  a.release();
  b.release();
  const claims = [
    ...await dispatcher.claimDue(10, new Date()),
    ...await requeuer.claimDue(10, new Date()),
  ];
  assert.deepEqual(claims.map((m) => m.id), [x.id], "x, requeued behind y, heads the key next");
});
