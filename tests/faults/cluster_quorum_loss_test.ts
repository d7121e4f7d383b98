/**
 * Two of three nodes down: an R3 stream has no leader (its publishes answer 503 at once, the
 * account-info API times out) while an R1 stream placed on the surviving node still accepts
 * writes. One dispatcher relays one Postgres outbox to both streams. The R1 stream must keep
 * flowing during the outage, nothing of the stuck stream may be dead-lettered, and the stuck
 * stream's messages must be delivered within seconds of the nodes' return (before the per-stream
 * breaker, its retries backed off towards their 300 s cap during the outage: 98 s after a 20 s
 * outage).
 *
 * Relies on the per-stream breaker (issue #13): before it, the stuck stream was delivered 120 s
 * after the nodes returned in this scenario.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, eventually, NatsCluster, sleep, uniqueName } from "../kit/mod.ts";
import {
  assertExactlyOnce,
  Child,
  compareDelivery,
  deliveryFigures,
  figures,
  natsConnection,
  pgPool,
  readStreamIds,
  records,
  since,
  tableSnapshot,
} from "./harness.ts";

/** Messages for the stream that loses its quorum. */
const stuck = 300;
/** Messages for the R1 stream, enqueued during the outage. */
const flowing = 300;
/** How long two nodes stay down. The scenario, not a wait for a condition. */
const outageMs = 15_000;
/** "Within seconds" of the stream having a leader again after the nodes' return. */
const deliveredWithinMs = 10_000;

Deno.test({
  name:
    "R3 cluster: two of three nodes down; the R1 stream on the survivor keeps flowing, the leaderless R3 stream loses nothing to dead letters and is delivered within seconds of the nodes' return",
  async fn() {
    await using cluster = await NatsCluster.start();
    const [survivor, ...down] = cluster.nodes;
    await using db = await createTestDatabase();
    await using pg = pgPool(db.url);
    const executor = postgresJsExecutor(pg.sql);
    await migrate(executor, { dialect: "postgres" });
    await using nats = await natsConnection(survivor.server.url);
    const jsm = await jetstreamManager(nats.nc);
    const r3 = { stream: uniqueName("stream"), prefix: uniqueName("subj") };
    const r1 = { stream: uniqueName("stream"), prefix: uniqueName("subj") };
    await jsm.streams.add({ name: r3.stream, subjects: [`${r3.prefix}.>`], num_replicas: 3 });
    await jsm.streams.add({
      name: r1.stream,
      subjects: [`${r1.prefix}.>`],
      num_replicas: 1,
      placement: { cluster: cluster.name, tags: [`node:${survivor.name}`] },
    });
    await cluster.waitForLeader(nats.nc, r3.stream);
    const enqueue = async (prefix: string, tag: string, from: number, count: number) => {
      const batch = records(prefix, tag, from, count);
      await pg.sql.begin((tx) =>
        new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
      );
      return batch.map((r) => r.id);
    };
    const states = async (prefix: string) => {
      const rows = await pg.sql`
        SELECT state, count(*)::int AS n, max(attempts)::int AS max FROM trellis_outbox
        WHERE subject LIKE ${prefix + ".%"} GROUP BY state`;
      return Object.fromEntries(rows.map((row) => [row.state, row.n]));
    };

    await using child = Child.dispatcher({
      name: "r3-quorum-loss",
      store: { kind: "postgres", url: db.url },
      natsUrl: survivor.server.url,
      dispatchers: 1,
      limit: 100,
      maxInFlight: 100,
      leaseMs: 10_000,
      publishTimeoutMs: 2_000,
      probeIntervalMs: 100,
      probeMaxIntervalMs: 1_000,
    });
    await child.waitForEvent("ready");

    await Promise.all(down.map((node) => cluster.kill(node)));
    const killed = performance.now();
    const stuckIds = await enqueue(r3.prefix, "r3", 0, stuck);
    const flowingIds: string[] = [];
    for (let i = 0; i < 5; i++) {
      flowingIds.push(...await enqueue(r1.prefix, "r1", i * (flowing / 5), flowing / 5));
      await sleep(outageMs / 10);
    }
    const r1DuringOutage = await eventually(async () => {
      const s = await states(r1.prefix);
      assert.equal(
        s.dispatched,
        flowing,
        `the R1 stream flows during the outage: ${JSON.stringify(s)}`,
      );
      return s;
    }, { timeoutMs: outageMs, intervalMs: 200 });
    const r1FlowedAfterMs = since(killed);
    const left = outageMs - since(killed);
    if (left > 0) await sleep(left);
    const r3AtReturn = await states(r3.prefix);
    assert.equal(r3AtReturn.dead ?? 0, 0, "nothing of the stuck stream is dead-lettered");
    const attemptsAtReturn = (await tableSnapshot(executor)).attempts;

    await Promise.all(down.map((node) => cluster.restart(node)));
    const returned = performance.now();
    const delivered = eventually(async () => {
      const s = await states(r3.prefix);
      assert.equal(s.dispatched, stuck, JSON.stringify(s));
      return since(returned);
    }, { timeoutMs: 180_000, intervalMs: 100 });
    const leaderAfterReturnMs = (await cluster.waitForLeader(nats.nc, r3.stream, {
      timeoutMs: 60_000,
    })).waitedMs;
    const deliveredAfterReturnMs = await delivered;
    const totals = await child.stop();
    const table = await tableSnapshot(executor);

    const deliveryR3 = compareDelivery(stuckIds, await readStreamIds(nats.nc, r3.stream));
    const deliveryR1 = compareDelivery(flowingIds, await readStreamIds(nats.nc, r1.stream));
    figures("r3-quorum-loss", {
      r3: deliveryFigures(deliveryR3),
      r1: deliveryFigures(deliveryR1),
      outageMs: Math.round(returned - killed),
      r1FlowedAfterMs,
      r1DuringOutage,
      r3AtReturn,
      attemptsDuringOutage: attemptsAtReturn - flowing,
      leaderAfterReturnMs,
      deliveredAfterReturnMs,
      extraAttempts: table.attempts - stuck - flowing,
      maxAttempts: table.maxAttempts,
      dead: totals.dead,
    });
    assertExactlyOnce(deliveryR3);
    assertExactlyOnce(deliveryR1);
    assert.equal(totals.dead, 0);
    assert.deepEqual(table.states, { dispatched: stuck + flowing });
    assert.ok(
      deliveredAfterReturnMs - leaderAfterReturnMs <= deliveredWithinMs,
      `the stuck stream was delivered ${deliveredAfterReturnMs} ms after the nodes returned, ${leaderAfterReturnMs} ms after which it had a leader`,
    );
  },
});
