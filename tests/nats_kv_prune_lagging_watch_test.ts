/**
 * NATS KV prune and the claimers' watches, end to end. On nats-server 2.9.10 (the reference
 * server), a stream purge of one subject (how prune used to retire an idle key's entry
 * `q._k.<key>` and remove a pruned message's marker tombstone) moves every consumer whose
 * filter covers that subject past ALL the messages it has not been delivered yet, on any
 * subject. A claimer's index is such a consumer (`q.>`): one that lagged behind while another
 * process pruned never saw the markers written meanwhile, so it never claimed those messages,
 * and its hand-overs passed over keyed messages it did not know. Prune now deletes exactly the
 * stream messages it saw (tests/nats_kv_prune_strand_test.ts checks the consumer positions);
 * here a lagging claimer must still claim every message.
 *
 * The lag is placed, not timed: the claimer's watch is held (its iterator yields nothing, so
 * its pull consumer asks for nothing more) while messages are enqueued and another process
 * prunes.
 */

import assert from "node:assert/strict";
import { DeliverPolicy, jetstream } from "@nats-io/jetstream";
import type { Bucket, KV, KvWatchEntry } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/nats-core";
import type { NatsKvOutboxRepository, OutboxRecord } from "../mod.ts";
import { keyedRecord } from "./conformance/records.ts";
import { intercept, openKvFixture } from "./nats_kv_fixture.ts";

const old = () => new Date(Date.now() - 120_000);
const cutoff = () => new Date(Date.now() - 60_000);

function unkeyed(i: number): OutboxRecord {
  return {
    id: `lag-${i}`,
    kind: "event.publish",
    name: "n",
    subject: "s.lag",
    payload: "{}",
    headers: {},
  };
}

/**
 * `kv` whose watches are served by an ordered pull consumer of the same subjects (what the
 * bucket's own watch consumes, minus the push): while `held.value` is true it asks the server
 * for nothing more, so the consumer stays behind the stream as a busy watch does.
 */
function holdableWatch(
  kv: KV,
  nc: NatsConnection,
  held: { value: boolean; released: Promise<void> },
): KV {
  const bucket = kv as unknown as Bucket;
  return intercept(kv, "watch", () => async (options) => {
    const consumer = await jetstream(nc).consumers.get(bucket.stream, {
      filter_subjects: bucket.subjectForKey(String(options?.key ?? ">")),
      deliver_policy: DeliverPolicy.LastPerSubject,
    });
    let stopped = false;
    const entries = (async function* (): AsyncGenerator<KvWatchEntry> {
      while (!stopped) {
        if (held.value) await held.released;
        const message = await consumer.next({ expires: 1_000 });
        if (message) yield bucket.jmToWatchEntry(message, false);
      }
    })();
    return Object.assign(entries, { stop: () => void (stopped = true) }) as unknown as Awaited<
      ReturnType<KV["watch"]>
    >;
  });
}

const setups: Array<{
  name: string;
  /** Leaves something under `q.>` for the prune to purge. */
  prepare(admin: NatsKvOutboxRepository): Promise<void>;
}> = [
  {
    name: "retired an idle key (its `q._k` entry)",
    async prepare(admin) {
      // Its only message dispatched long ago: the key is left without a head, idle.
      await admin.enqueue(keyedRecord("lag", "idle-key"));
      const [claim] = await admin.claimDue(1, old());
      assert.equal(await admin.markDispatched(claim, old(), undefined, { sequence: 1 }), true);
    },
  },
  {
    name: "pruned a message and its marker tombstone",
    async prepare(admin) {
      await admin.enqueue({ ...unkeyed(-1), id: "lag-old" });
      const [claim] = await admin.claimDue(1, old());
      assert.equal(await admin.markDispatched(claim, old()), true);
    },
  },
];

for (const setup of setups) {
  Deno.test(`nats kv prune: a claimer whose watch lagged behind a prune that ${setup.name} still claims every message`, async () => {
    await using fixture = await openKvFixture();
    const admin = fixture.outbox();
    await setup.prepare(admin);

    const released = Promise.withResolvers<void>();
    const held = { value: false, released: released.promise };
    const relay = fixture.outbox({ kv: holdableWatch(fixture.peerKv, fixture.peerNc, held) });
    assert.deepEqual(await relay.claimDue(10, new Date()), [], "the relay's index is live");

    held.value = true; // from now on the relay's watch falls behind
    const records = Array.from({ length: 600 }, (_, i) => unkeyed(i));
    for (let i = 0; i < records.length; i += 100) {
      await admin.enqueueMany(records.slice(i, i + 100));
    }
    // Another process prunes meanwhile.
    const pruned = await admin.prune({ dispatchedBefore: cutoff() });
    assert.equal(pruned.dispatched, 1);
    held.value = false;
    released.resolve();

    const claimed = new Set<string>();
    for (let empty = 0; empty < 3;) {
      const got = await relay.claimDue(100, new Date());
      if (got.length === 0) empty += 1;
      for (const message of got) claimed.add(message.id);
    }
    const missed = records.filter((record) => !claimed.has(record.id)).map((record) => record.id);
    assert.deepEqual(
      missed.slice(0, 5),
      [],
      `${missed.length} messages never claimed by the relay`,
    );
  });
}
