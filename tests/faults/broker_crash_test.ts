/**
 * Scenario 2, broker crash: a private nats-server is killed with SIGKILL while a dispatcher
 * process drains a Postgres outbox into it, stays down for a few seconds, and is restarted on
 * the same port and store. The dispatcher must pause, recover by itself, lose nothing and store
 * nothing twice; the attempts the outage costs stay within the stated bound.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, NatsServer, sleep, uniqueName } from "../kit/mod.ts";
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

const total = 10_000;
const limit = 100;
/** How long the broker stays down. The scenario, not a wait for a condition. */
const outageMs = 3_000;

Deno.test("broker crash: NATS killed (-9) mid-dispatch and restarted on the same port and store; the dispatcher recovers by itself", async () => {
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

  await using child = Child.dispatcher({
    name: "broker-crash",
    store: { kind: "postgres", url: db.url },
    natsUrl: server.url,
    dispatchers: 1,
    limit,
    maxInFlight: limit,
    leaseMs: 10_000,
    publishTimeoutMs: 1_000,
    probeIntervalMs: 100,
    probeMaxIntervalMs: 500,
  });
  await child.waitFor(
    (e) => e.event === "progress" && e.totals.dispatched >= 2_000,
    120_000,
    "2,000 dispatched",
  );
  const atKill = await tableSnapshot(executor);
  await server.kill("SIGKILL");
  const killedAt = Date.now();
  const paused = await child.waitForEvent("paused");
  await sleep(outageMs);
  const beforeRestart = await tableSnapshot(executor);
  assert.ok(
    (beforeRestart.states.dispatched ?? 0) < total,
    "the outage happened mid-dispatch",
  );
  await server.restart();
  const restartedAt = Date.now();
  const recovering = performance.now();
  const resumed = await child.waitForEvent("resumed", 60_000);
  const table = await waitDispatched(() => tableSnapshot(executor), total);
  const drainAfterRestartMs = since(recovering);
  const totals = await child.stop();

  const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream));
  const extraAttempts = table.attempts - total;
  figures("broker-crash", {
    ...deliveryFigures(delivery),
    dispatchedAtKill: atKill.states.dispatched ?? 0,
    pausedAfterMs: paused.at - killedAt,
    pauseCode: paused.code,
    outageMs: restartedAt - killedAt,
    attemptsDuringOutage: beforeRestart.attempts - atKill.attempts,
    extraAttempts,
    maxAttempts: table.maxAttempts,
    unavailableOutcomes: totals.unavailable,
    duplicateAcks: totals.duplicates,
    resumedAfterRestartMs: resumed.at - restartedAt,
    drainAfterRestartMs,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  // The bound (README, "Reliability"): no claim while the breaker is open, so the outage costs
  // one attempt for each message claimed when it opened (at most two batches: the one being
  // delivered and the one claimed ahead), plus one per failed half-open trial.
  assert.ok(
    extraAttempts <= 2 * limit + 2,
    `the outage cost ${extraAttempts} attempts, bound ${2 * limit + 2}`,
  );
  assert.ok(table.maxAttempts <= 3, `max attempts ${table.maxAttempts}`);
  assert.equal(totals.dead, 0);
});
