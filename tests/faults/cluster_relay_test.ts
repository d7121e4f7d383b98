/**
 * Scenarios on a 3-node JetStream cluster (the kit's `NatsCluster`): a dispatcher process relays
 * a Postgres outbox into an R3 stream while the stream's leader is killed with SIGKILL (and
 * restarted later), or frozen with SIGSTOP for longer than the lease. Leadership moves; nothing
 * may be lost, stored twice, or left undispatched, and no message is dead-lettered. The figures
 * report how long the cluster took to elect a new leader, how long the relay took to recover,
 * and the attempts the leader change cost.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, NatsCluster, sleep, uniqueName } from "../kit/mod.ts";
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
  waitDispatched,
} from "./harness.ts";

const total = 5_000;
const limit = 100;

async function setup(cluster: NatsCluster) {
  const db = await createTestDatabase();
  const pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  const nats = await natsConnection(cluster.url);
  const stream = uniqueName("stream");
  const prefix = uniqueName("subj");
  await (await jetstreamManager(nats.nc)).streams.add({
    name: stream,
    subjects: [`${prefix}.>`],
    num_replicas: 3,
  });
  const committed: string[] = [];
  for (let from = 0; from < total; from += 1_000) {
    const batch = records(prefix, "r3", from, 1_000);
    await pg.sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
    );
    committed.push(...batch.map((r) => r.id));
  }
  return {
    db,
    pg,
    executor,
    nats,
    stream,
    committed,
    async [Symbol.asyncDispose]() {
      await nats[Symbol.asyncDispose]();
      await pg[Symbol.asyncDispose]();
      await db[Symbol.asyncDispose]();
    },
  };
}

Deno.test("R3 cluster: the stream leader is killed (-9) mid-dispatch and restarted later; the relay moves to the new leader, exactly once", async () => {
  await using cluster = await NatsCluster.start();
  await using s = await setup(cluster);
  const first = await cluster.waitForLeader(s.nats.nc, s.stream);
  // The dispatcher is connected to the surviving nodes, so it sees what a leaderless R3 stream
  // answers (503 at once), not a lost connection (the single-server crash scenario).
  const others = cluster.nodes.filter((node) => node !== first.node).map((n) => n.server.url);

  await using child = Child.dispatcher({
    name: "r3-leader-kill",
    store: { kind: "postgres", url: s.db.url },
    natsUrl: others.join(","),
    dispatchers: 1,
    limit,
    maxInFlight: limit,
    leaseMs: 10_000,
    publishTimeoutMs: 2_000,
    probeIntervalMs: 100,
    probeMaxIntervalMs: 500,
  });
  await child.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched >= 1_000,
    120_000,
    "1,000 dispatched",
  );
  const atKill = await tableSnapshot(s.executor);
  await using observer = await natsConnection(others.join(","));
  await cluster.kill(first.node);
  const killed = performance.now();
  const second = await cluster.waitForLeader(observer.nc, s.stream, { notOn: first.node.name });
  const newLeaderAfterMs = since(killed);
  // The relay goes on through the new leader while the old one is still down.
  const progressed = await child.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched >= (atKill.states.dispatched ?? 0) + 500,
    60_000,
    "500 more dispatched with the old leader down",
  );
  const flowingAfterKillMs = since(killed);
  assert.ok(progressed);
  await sleep(1_000);
  const beforeRestart = await tableSnapshot(s.executor);
  await cluster.restart(first.node);
  const table = await waitDispatched(() => tableSnapshot(s.executor), total);
  const drainAfterKillMs = since(killed);
  const totals = await child.stop();

  const delivery = compareDelivery(s.committed, await readStreamIds(s.nats.nc, s.stream));
  figures("r3-leader-kill", {
    ...deliveryFigures(delivery),
    oldLeader: first.node.name,
    newLeader: second.node.name,
    dispatchedAtKill: atKill.states.dispatched ?? 0,
    newLeaderAfterMs,
    flowingAfterKillMs,
    dispatchedWithOldLeaderDown: (beforeRestart.states.dispatched ?? 0) -
      (atKill.states.dispatched ?? 0),
    drainAfterKillMs,
    extraAttempts: table.attempts - total,
    maxAttempts: table.maxAttempts,
    failedOutcomes: totals.failed,
    unavailableOutcomes: totals.unavailable,
    duplicateAcks: totals.duplicates,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  // Attempts are reported, not bounded: while the stream has no leader its publishes answer 503
  // at once, and the dispatcher retries the claimed messages until the new leader answers.
  assert.equal(totals.dead, 0, "nothing dead-lettered by a leader change");
});

Deno.test(
  "R3 cluster: the stream leader is frozen (SIGSTOP) for longer than the lease; a second dispatcher reclaims, the stream stores each message once",
  async () => {
    await using cluster = await NatsCluster.start();
    await using s = await setup(cluster);
    const leader = (await cluster.waitForLeader(s.nats.nc, s.stream)).node;
    // The dispatchers connect to the other two nodes: the freeze hits the stream, not their
    // client connection (a frozen node the client is connected to is the single-server
    // slow-broker scenario).
    const others = cluster.nodes.filter((node) => node !== leader).map((node) => node.server.url);
    const leaseMs = 2_000;
    const frozenMs = 3 * leaseMs;
    // The test watches the stream through the other nodes too.
    await using observer = await natsConnection(others.join(","));

    const config = {
      store: { kind: "postgres" as const, url: s.db.url },
      natsUrl: others.join(","),
      dispatchers: 1,
      limit,
      maxInFlight: limit,
      leaseMs,
      publishTimeoutMs: 1_000,
      probeIntervalMs: 100,
      probeMaxIntervalMs: 500,
    };
    await using a = Child.dispatcher({ ...config, name: "r3-freeze-a" });
    await using b = Child.dispatcher({ ...config, name: "r3-freeze-b" });
    await a.waitFor(
      (e) => e.event === "progress" && e.totals.dispatched >= 500,
      120_000,
      "500 dispatched by a",
    );
    const atFreeze = await tableSnapshot(s.executor);
    cluster.pause(leader);
    const frozen = performance.now();
    let newLeaderAfterMs = -1;
    let frozenFor = 0;
    try {
      const next = await cluster.waitForLeader(observer.nc, s.stream, { notOn: leader.name });
      newLeaderAfterMs = since(frozen);
      assert.notEqual(next.node.name, leader.name);
      const left = frozenMs - since(frozen);
      if (left > 0) await sleep(left);
    } finally {
      frozenFor = since(frozen);
      cluster.resume(leader);
    }
    const table = await waitDispatched(() => tableSnapshot(s.executor), total);
    const drainAfterFreezeMs = since(frozen);
    const totals = [await a.stop(), await b.stop()];

    const delivery = compareDelivery(s.committed, await readStreamIds(observer.nc, s.stream));
    figures("r3-leader-freeze", {
      ...deliveryFigures(delivery),
      frozenLeader: leader.name,
      frozenMs: frozenFor,
      leaseMs,
      dispatchedAtFreeze: atFreeze.states.dispatched ?? 0,
      newLeaderAfterMs,
      drainAfterFreezeMs,
      extraAttempts: table.attempts - total,
      maxAttempts: table.maxAttempts,
      superseded: totals[0].superseded + totals[1].superseded,
      duplicateAcks: totals[0].duplicates + totals[1].duplicates,
    });
    assertExactlyOnce(delivery);
    assert.deepEqual(table.states, { dispatched: total });
    assert.equal(totals[0].dead + totals[1].dead, 0, "nothing dead-lettered by a frozen leader");
  },
);
