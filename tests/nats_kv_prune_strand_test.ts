/**
 * NATS KV prune versus watches that have not delivered everything yet. A claimer's index is a
 * push consumer on the markers (`q.>`) that delivers what was written a moment ago; an admin scan
 * is one on the records (`m.>`). A stream purge filtered on one subject (what prune used to remove
 * a record, its marker tombstone or an idle key's entry without a tombstone) moves, on
 * nats-server 2.9.10, every consumer whose filter covers that subject to the end of the stream:
 * the markers it had not delivered yet were never seen by that claimer. Under continuous keyed
 * enqueues, two relays and two pruners with a cutoff of now, tens of messages stayed pending
 * until a fresh process started (stress runs of 20 s, 3,000-4,500 messages: 21-190 stranded).
 *
 * The lagging watch is a push consumer without a subscriber (the server delivers nothing until
 * one subscribes): its position stays where the test leaves it, so the test does not race the
 * server.
 */

import assert from "node:assert/strict";
import { AckPolicy, DeliverPolicy, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsKvOutboxRepository } from "../mod.ts";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord, uniqueKey } from "./conformance/records.ts";
import { type KvFixture, openKvFixture, withoutStreamAccess } from "./nats_kv_fixture.ts";
import { uniqueName } from "./kit/mod.ts";

const future = () => new Date(Date.now() + 60_000);

/**
 * A push consumer on `filter` (`q.>`, `m.>`) of the outbox bucket created now, delivering from
 * the stream's start, with nobody subscribed yet. `deliver` subscribes and returns the KV keys it
 * delivers until every key of `expected` came (or 2 s without them).
 */
async function laggingWatch(fixture: KvFixture, filter: string) {
  const jsm = await jetstreamManager(fixture.nc);
  const stream = `KV_${fixture.outboxBucket}`;
  const prefix = `$KV.${fixture.outboxBucket}.`;
  const name = uniqueName("lag");
  const deliverSubject = `_lag.${name}`;
  await jsm.consumers.add(stream, {
    name,
    deliver_subject: deliverSubject,
    filter_subject: `${prefix}${filter}`,
    ack_policy: AckPolicy.None,
    deliver_policy: DeliverPolicy.All,
  });
  return {
    /** Messages the consumer has still to deliver, as the server counts them. */
    async pending(): Promise<number> {
      return (await jsm.consumers.info(stream, name)).num_pending;
    },
    async deliver(expected: string[]): Promise<string[]> {
      const seen: string[] = [];
      const missing = new Set(expected);
      let done: () => void = () => {};
      const complete = new Promise<void>((resolve) => done = resolve);
      const sub = fixture.nc.subscribe(deliverSubject, {
        callback: (_error, msg) => {
          if (!msg.subject.startsWith(prefix)) return; // flow control, heartbeats
          const key = msg.subject.slice(prefix.length);
          seen.push(key);
          missing.delete(key);
          if (missing.size === 0) done();
        },
      });
      const timer = setTimeout(done, 2_000);
      await complete;
      clearTimeout(timer);
      sub.unsubscribe();
      return seen;
    },
  };
}

async function markerOf(id: string): Promise<string> {
  return markerKeyOf(await outboxRecordKey(id));
}

/**
 * Dispatches one message on `outbox`, holds a consumer of `filter` (a watch or scan) behind,
 * enqueues two more, and prunes the dispatched one: the held consumer must still deliver the
 * two waiting messages' keys (`keyOf`) it had not delivered before the prune.
 */
async function pruneBehindLaggingConsumer(
  fixture: KvFixture,
  outbox: NatsKvOutboxRepository,
  filter: string,
  keyOf: (id: string) => Promise<string>,
  consumer: string,
  entry: string,
): Promise<void> {
  await outbox.enqueue(keyedRecord("ps", undefined));
  const [claim] = await outbox.claimDue(1, new Date());
  assert.equal(await outbox.markDispatched(claim, new Date()), true);
  const lagging = await laggingWatch(fixture, filter);
  const waiting = [keyedRecord("ps", undefined), keyedRecord("ps", undefined)];
  await outbox.enqueueMany(waiting);
  const expected = await Promise.all(waiting.map((record) => keyOf(record.id)));
  const before = await lagging.pending();
  assert.equal((await outbox.prune({ dispatchedBefore: future() })).dispatched, 1);
  const after = await lagging.pending();
  const delivered = await lagging.deliver(expected);
  for (const key of expected) {
    assert.ok(
      delivered.includes(key),
      `the ${consumer} skipped a pending message's ${entry} (pending ${before} before the prune, ${after} after)`,
    );
  }
}

Deno.test("nats kv prune strand: removing a dispatched message's record and marker tombstone does not move a lagging watch on the markers past markers written before", async () => {
  await using fixture = await openKvFixture();
  // The dispatched message's marker is a tombstone: prune removes it with the record.
  await pruneBehindLaggingConsumer(fixture, fixture.outbox(), "q.>", markerOf, "watch", "marker");
});

for (const access of ["a Bucket", "a KV object without stream access"] as const) {
  const open = (fixture: KvFixture) =>
    fixture.outbox({ kv: access === "a Bucket" ? fixture.kv : withoutStreamAccess(fixture.kv) });

  Deno.test(`nats kv prune strand: retiring an idle ordering key does not move a lagging watch on the markers past markers written before (${access})`, async () => {
    await using fixture = await openKvFixture();
    const outbox = open(fixture);
    const key = uniqueKey("idle");
    // An idle key without a dispatched record: its dead head is skipped (the entry names no head,
    // the dead record and its marker tombstone stay), so the prune only retires the key's entry.
    const skipped = keyedRecord("ps", key);
    await outbox.enqueue(skipped);
    const [claim] = await outbox.claimDue(1, new Date());
    assert.equal(await outbox.markDead(claim, { error: "poison", now: new Date() }), true);
    assert.equal(await outbox.unblockKey(key, { action: "skip" }), true);
    const watch = await laggingWatch(fixture, "q.>");
    const waiting = [keyedRecord("ps", uniqueKey("other")), keyedRecord("ps", undefined)];
    await outbox.enqueueMany(waiting);
    const expected = await Promise.all(waiting.map((record) => markerOf(record.id)));
    const before = await watch.pending();
    assert.deepEqual({ ...await outbox.prune({ dispatchedBefore: future() }) }, {
      dispatched: 0,
      dead: 0,
    });
    const after = await watch.pending();
    const delivered = await watch.deliver(expected);
    for (const key of expected) {
      assert.ok(
        delivered.includes(key),
        `the watch skipped a pending message's marker (pending ${before} before the prune, ${after} after)`,
      );
    }
    // The key was retired all the same: its next message starts it over.
    const next = keyedRecord("ps", key);
    await outbox.enqueue(next);
    const claimed = await outbox.claimDue(10, new Date());
    assert.ok(
      claimed.some((message) => message.id === next.id && message.keySequence === undefined),
    );
  });

  Deno.test(`nats kv prune strand: removing a dispatched record does not move a lagging scan of the records past records written before (${access})`, async () => {
    await using fixture = await openKvFixture();
    await pruneBehindLaggingConsumer(
      fixture,
      open(fixture),
      "m.>",
      outboxRecordKey,
      "scan",
      "record",
    );
  });
}

Deno.test("nats kv prune strand: in a bucket that keeps history, prune deletes every revision of a pruned record and marker, so no older one comes back", async () => {
  await using fixture = await openKvFixture();
  const bucket = uniqueName("kvh");
  const kv = await new Kvm(fixture.nc).create(bucket, { history: 5 });
  try {
    const outbox = fixture.outbox({ kv });
    const [done, waiting] = [keyedRecord("ps", undefined), keyedRecord("ps", undefined)];
    await outbox.enqueue(done);
    const [claim] = await outbox.claimDue(1, new Date());
    assert.equal(await outbox.markDispatched(claim, new Date()), true); // three record revisions
    await outbox.enqueue(waiting);
    assert.equal((await outbox.prune({ dispatchedBefore: future() })).dispatched, 1);
    for (const key of [await outboxRecordKey(done.id), await markerOf(done.id)]) {
      // Every revision (a get alone can miss older ones left behind: 2.9.10 answers none).
      const left: number[] = [];
      for await (const entry of await kv.history({ key })) left.push(entry.revision);
      assert.deepEqual(left, [], `${key}: revisions left`);
    }
    const fresh = fixture.outbox({ kv });
    assert.deepEqual((await fresh.claimDue(10, new Date())).map((m) => m.id), [waiting.id]);
  } finally {
    await kv.destroy();
  }
});
