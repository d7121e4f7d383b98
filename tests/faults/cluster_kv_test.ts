/**
 * The NATS KV stores on R3 buckets of a 3-node cluster through a leader change: the leader of the
 * bucket's stream is killed (-9) while a dispatcher process relays the KV outbox into an R3
 * stream, or while two recorders race through the KV inbox. Zero lost, zero duplicate, nothing
 * stuck; the figures report the new leader's election time, the recovery, and attempts spent.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  createInboxBucket,
  createOutboxBucket,
  NatsKvInboxRepository,
  NatsKvOutboxRepository,
} from "../../mod.ts";
import { eventually, NatsCluster, sleep, uniqueName } from "../kit/mod.ts";
import {
  assertExactlyOnce,
  Child,
  compareDelivery,
  deliveryFigures,
  figures,
  natsConnection,
  readStreamIds,
  records,
  since,
} from "./harness.ts";

const total = 2_000;

Deno.test("R3 cluster: the NATS KV outbox on an R3 bucket keeps relaying through a kill (-9) of the bucket's leader, exactly once", async () => {
  await using cluster = await NatsCluster.start();
  await using nats = await natsConnection(cluster.url);
  const stream = uniqueName("stream");
  const prefix = uniqueName("subj");
  await (await jetstreamManager(nats.nc)).streams.add({
    name: stream,
    subjects: [`${prefix}.>`],
    num_replicas: 3,
  });
  const bucket = uniqueName("kvo");
  const kv = await createOutboxBucket(new Kvm(nats.nc), bucket, { replicas: 3 });
  const outbox = new NatsKvOutboxRepository(kv);
  try {
    const committed: string[] = [];
    for (let from = 0; from < total; from += 500) {
      const batch = records(prefix, "kv3", from, 500);
      await outbox.enqueueMany(batch);
      committed.push(...batch.map((r) => r.id));
    }
    const leader = (await cluster.waitForLeader(nats.nc, `KV_${bucket}`)).node;

    await using child = Child.dispatcher({
      name: "r3-kv-outbox",
      store: { kind: "kv", bucket },
      natsUrl: cluster.url,
      dispatchers: 1,
      limit: 100,
      maxInFlight: 100,
      leaseMs: 10_000,
      publishTimeoutMs: 2_000,
      probeIntervalMs: 100,
      probeMaxIntervalMs: 500,
    });
    await child.waitFor(
      (e) => e.event === "progress" && e.totals.dispatched >= 400,
      120_000,
      "400 dispatched",
    );
    const atKill = child.last("progress")?.totals.dispatched ?? 0;
    await cluster.kill(leader);
    const killed = performance.now();
    const next = await cluster.waitForLeader(nats.nc, `KV_${bucket}`, { notOn: leader.name });
    const newLeaderAfterMs = since(killed);
    await sleep(1_000);
    await cluster.restart(leader);
    const stats = await eventually(async () => {
      const stats = await outbox.stats();
      assert.equal(stats.dispatched, total);
      return stats;
    }, { timeoutMs: 120_000, intervalMs: 250 });
    const drainAfterKillMs = since(killed);
    const totals = await child.stop();

    const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream));
    let attempts = 0;
    let maxAttempts = 0;
    for (const id of committed) {
      const message = await outbox.get(id);
      attempts += message?.attempts ?? 0;
      maxAttempts = Math.max(maxAttempts, message?.attempts ?? 0);
    }
    figures("r3-kv-outbox-leader-kill", {
      ...deliveryFigures(delivery),
      oldLeader: leader.name,
      newLeader: next.node.name,
      dispatchedAtKill: atKill,
      newLeaderAfterMs,
      drainAfterKillMs,
      extraAttempts: attempts - total,
      maxAttempts,
      storeErrors: totals.errors,
      duplicateAcks: totals.duplicates,
      superseded: totals.superseded,
    });
    assertExactlyOnce(delivery);
    assert.deepEqual(
      { pending: stats.pending, claimed: stats.claimed, failed: stats.failed, dead: stats.dead },
      { pending: 0, claimed: 0, failed: 0, dead: 0 },
      "nothing stuck, nothing dead",
    );
    assert.equal(totals.dead, 0);
  } finally {
    await outbox.close();
    await kv.destroy().catch(() => {});
  }
});

Deno.test(
  "R3 cluster: two recorders race through the NATS KV inbox on an R3 bucket while its leader is killed (-9); each id is new exactly once, none is forgotten",
  async () => {
    await using cluster = await NatsCluster.start();
    await using a = await natsConnection(cluster.urls[0]);
    await using b = await natsConnection(cluster.urls[1]);
    const bucket = uniqueName("kvi");
    await createInboxBucket(new Kvm(a.nc), bucket, { replicas: 3 });
    const inboxes = [
      new NatsKvInboxRepository(await new Kvm(a.nc).open(bucket)),
      new NatsKvInboxRepository(await new Kvm(b.nc).open(bucket)),
    ];
    const consumer = "billing";
    const ids = Array.from({ length: total }, (_, i) => `inbox-${i}`);
    const news = new Map<string, number>();
    let errors = 0;
    let attempts = 0;
    const recorder = async (inbox: NatsKvInboxRepository) => {
      for (const id of ids) {
        // Retry until the write answers; a write that applied but whose reply was lost answers
        // false on the retry (the id is known), never true twice.
        const isNew = await eventually(async () => {
          attempts += 1;
          try {
            return await inbox.record(id, { consumer });
          } catch (error) {
            errors += 1;
            throw error;
          }
        }, { timeoutMs: 60_000, intervalMs: 50 });
        if (isNew) news.set(id, (news.get(id) ?? 0) + 1);
      }
    };
    const leader = (await cluster.waitForLeader(a.nc, `KV_${bucket}`)).node;
    const racing = Promise.all(inboxes.map(recorder));
    await eventually(() => assert.ok(news.size >= 400), { timeoutMs: 60_000 });
    const atKill = news.size;
    await cluster.kill(leader);
    const killed = performance.now();
    const next = await cluster.waitForLeader(a.nc, `KV_${bucket}`, { notOn: leader.name });
    const newLeaderAfterMs = since(killed);
    await racing;
    const doneAfterKillMs = since(killed);
    await cluster.restart(leader);

    const twice = [...news].filter(([, n]) => n > 1).map(([id]) => id);
    // Every id is remembered after the leader change (and the old leader's return).
    const forgotten: string[] = [];
    for (const id of ids) {
      if (await eventually(() => inboxes[0].record(id, { consumer }))) forgotten.push(id);
    }
    figures("r3-kv-inbox-leader-kill", {
      ids: total,
      recorders: 2,
      oldLeader: leader.name,
      newLeader: next.node.name,
      newAtKill: atKill,
      newLeaderAfterMs,
      doneAfterKillMs,
      recordedNewOnce: news.size,
      recordedNewTwice: twice.length,
      forgotten: forgotten.length,
      attempts,
      errors,
    });
    assert.deepEqual(twice, [], "no id was new twice");
    assert.deepEqual(forgotten, [], "no recorded id was forgotten");
    // An id whose first write applied but whose reply was lost is never reported new: count them.
    assert.ok(total - news.size <= errors, `${total - news.size} ids never new, ${errors} errors`);
  },
);
