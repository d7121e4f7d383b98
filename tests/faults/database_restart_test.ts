/**
 * Scenario 4, the database goes away under a running dispatcher process: a private Postgres is
 * restarted mid-dispatch, and (on the shared server) the dispatcher's connections are killed
 * with `pg_terminate_backend`. The dispatcher must recover without a restart of its own process,
 * lose nothing and store nothing twice.
 */

import assert from "node:assert/strict";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import {
  createTestDatabase,
  createTestStream,
  eventually,
  natsUrl,
  PostgresServer,
  uniqueName,
} from "../kit/mod.ts";
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
import type postgres from "postgres";

const total = 20_000;

async function enqueueAll(sql: postgres.Sql, prefix: string): Promise<string[]> {
  const committed: string[] = [];
  for (let from = 0; from < total; from += 1_000) {
    const batch = records(prefix, "ok", from, 1_000);
    await sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
    );
    committed.push(...batch.map((r) => r.id));
  }
  return committed;
}

/** Resolves with the time the child first reports more than `dispatched` messages. */
async function progressBeyond(child: Child, dispatched: number): Promise<number> {
  await child.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched > dispatched,
    120_000,
    `progress beyond ${dispatched}`,
  );
  return performance.now();
}

Deno.test("database restart: a private Postgres restarted mid-dispatch; the dispatcher recovers in the same process", async () => {
  await using server = await PostgresServer.start();
  await using pg = pgPool(server.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const committed = await enqueueAll(pg.sql, stream.prefix);

  await using child = Child.dispatcher({
    name: "pg-restart",
    store: { kind: "postgres", url: server.url },
    natsUrl: await natsUrl(),
    dispatchers: 1,
    leaseMs: 5_000,
    probeIntervalMs: 50,
    probeMaxIntervalMs: 500,
  });
  await child.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched >= 3_000,
    120_000,
    "3,000 dispatched",
  );
  // Stop the database, wait until the dispatcher has met the outage (a claim or mark failed),
  // then start it again: with a plain restart, a fast dispatcher can slip between its queries
  // and reconnect without ever seeing an error, which would not test recovery.
  const restartStarted = performance.now();
  await server.kill("SIGINT"); // fast shutdown, as `pg_ctl stop -m fast`
  await child.waitFor((e) => e.event === "error", 60_000, "a store error during the outage");
  await server.start();
  const restartMs = since(restartStarted);
  const atRestart = child.totals;
  assert.ok(atRestart.dispatched < total, "the restart happened mid-dispatch");
  const recoveredAt = await progressBeyond(child, atRestart.dispatched);
  const snapshot = () => eventually(() => tableSnapshot(executor));
  const table = await waitDispatched(snapshot, total);
  const totals = await child.stop();

  const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream.name));
  figures("postgres-restart", {
    ...deliveryFigures(delivery),
    dispatchedAtRestart: atRestart.dispatched,
    restartMs,
    recoveredAfterRestartMs: Math.round(recoveredAt - restartStarted - restartMs),
    storeErrorsRecovered: totals.errors,
    extraAttempts: table.attempts - total,
    maxAttempts: table.maxAttempts,
    duplicateAcks: totals.duplicates,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  assert.ok(totals.errors > 0, "the dispatcher saw the database go away");
});

Deno.test("database connection killed: pg_terminate_backend on the dispatcher's connections, three times; it recovers in the same process", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const committed = await enqueueAll(pg.sql, stream.prefix);
  const applicationName = uniqueName("fault_dispatcher");

  await using child = Child.dispatcher({
    name: "pg-terminate",
    store: { kind: "postgres", url: db.url },
    natsUrl: await natsUrl(),
    dispatchers: 2,
    leaseMs: 5_000,
    probeIntervalMs: 50,
    probeMaxIntervalMs: 500,
    applicationName,
  });
  const kills: Array<{ at: number; terminated: number; recoveredMs: number }> = [];
  for (const threshold of [2_000, 7_000, 12_000]) {
    await child.waitFor(
      (e) => e.event === "progress" && e.totals.dispatched >= threshold,
      120_000,
      `${threshold} dispatched`,
    );
    const started = performance.now();
    const rows = await pg.sql`
      SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
      WHERE application_name = ${applicationName}`;
    const at = child.totals.dispatched;
    const recovered = await progressBeyond(child, at);
    kills.push({
      at,
      terminated: rows.filter((row) => row.killed).length,
      recoveredMs: Math.round(recovered - started),
    });
  }
  const table = await waitDispatched(() => tableSnapshot(executor), total);
  const totals = await child.stop();

  const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream.name));
  figures("postgres-terminate-backend", {
    ...deliveryFigures(delivery),
    kills,
    storeErrorsRecovered: totals.errors,
    extraAttempts: table.attempts - total,
    maxAttempts: table.maxAttempts,
    duplicateAcks: totals.duplicates,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  for (const kill of kills) {
    assert.ok(kill.terminated > 0, "the dispatcher had connections to kill");
    assert.ok(kill.at < total, "killed mid-dispatch");
  }
});
