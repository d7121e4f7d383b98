/**
 * Scenario 5, a broker slower than the lease: the private nats-server is frozen (SIGSTOP) while
 * dispatcher A's publishes are on the wire. A's deliveries give up at their lease budget and
 * the messages become due; dispatcher B (another process) claims them again and publishes them
 * a second time into the same frozen server. When the server resumes (SIGCONT) it processes
 * both publishes of those messages: the stream must hold each message once.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, eventually, NatsServer, uniqueName } from "../kit/mod.ts";
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
  sumTotals,
  tableSnapshot,
  waitDispatched,
} from "./harness.ts";

const total = 5_000;
const leaseMs = 1_500;

Deno.test("slow broker: publishes outlive their lease on a frozen server (SIGSTOP), a second dispatcher re-publishes; no duplicate, no loss", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await using server = await NatsServer.start();
  await using nats = await natsConnection(server.url);
  const stream = uniqueName("stream");
  const prefix = uniqueName("subj");
  await (await jetstreamManager(nats.nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });
  const committed: string[] = [];
  for (let from = 0; from < total; from += 1_000) {
    const batch = records(prefix, "ok", from, 1_000);
    await pg.sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
    );
    committed.push(...batch.map((r) => r.id));
  }
  const base = {
    store: { kind: "postgres" as const, url: db.url },
    natsUrl: server.url,
    dispatchers: 1,
    limit: 100,
    leaseMs,
    idleRetryMs: 50,
    // The runtime's own PubAck timeout is above the lease: the dispatcher's lease budget
    // (0.8 x lease) is what ends a delivery. The probes' API timeout is 500 ms.
    publishTimeoutMs: 5_000,
    apiTimeoutMs: 500,
    probeIntervalMs: 100,
    probeMaxIntervalMs: 300,
  };
  await using a = Child.dispatcher({ ...base, name: "slow-a" });
  await using b = Child.dispatcher({ ...base, name: "slow-b", startOnSignal: true });
  await Promise.all([a.waitForEvent("ready"), b.waitForEvent("ready")]);
  await a.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched >= 1_000,
    120_000,
    "1,000 dispatched",
  );
  let frozenMs = 0;
  server.pause();
  const frozenAt = performance.now();
  const frozenAtEpoch = Date.now();
  try {
    const pausedA = await a.waitForEvent("paused");
    // A gave up on its in-flight publishes; the messages are due again. B claims them.
    b.kill("SIGUSR2");
    const pausedB = await b.waitForEvent("paused");
    // Observable in the table: messages whose first publish is still inside the frozen server
    // were claimed a second time.
    const twice = await eventually(async () => {
      const [{ n }] = await pg.sql`
        SELECT count(*)::int AS n FROM trellis_outbox WHERE attempts >= 2 AND state <> 'dispatched'`;
      assert.ok(n > 0, "messages claimed a second time while the server is frozen");
      return n as number;
    }, { timeoutMs: 30_000, intervalMs: 100 });
    frozenMs = since(frozenAt);
    figures("slow-broker/frozen", {
      pausedCodes: [pausedA.code, pausedB.code],
      pausedAfterFreezeMs: [pausedA.at - frozenAtEpoch, pausedB.at - frozenAtEpoch],
      claimedTwiceWhileFrozen: twice,
    });
  } finally {
    server.resume();
  }
  const resumedAt = performance.now();
  const table = await waitDispatched(() => tableSnapshot(executor), total);
  const drainMs = since(resumedAt);
  const totals = sumTotals(await Promise.all([a.stop(), b.stop()]));

  const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream));
  figures("slow-broker", {
    ...deliveryFigures(delivery),
    frozenMs,
    leaseMs,
    duplicateAcks: totals.duplicates,
    unavailableOutcomes: totals.unavailable,
    extraAttempts: table.attempts - total,
    maxAttempts: table.maxAttempts,
    drainAfterResumeMs: drainMs,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  assert.ok(totals.duplicates > 0, "the second publishes were answered as duplicates");
});
