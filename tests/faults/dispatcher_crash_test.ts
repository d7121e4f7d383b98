/**
 * Scenario 3, dispatcher crash: a dispatcher process is killed with SIGKILL in the middle of a
 * batch, after JetStream acknowledged some of its messages but before it could record them. A
 * new process takes the work over once the (short) lease expired: nothing lost, and the
 * re-published messages are absorbed by the stream's duplicate window.
 */

import assert from "node:assert/strict";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, createTestStream, natsUrl } from "../kit/mod.ts";
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
const leaseMs = 2_000;

Deno.test("dispatcher crash: SIGKILL mid-batch, a new process completes the work after the lease; no loss, no duplicate in the stream", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const committed: string[] = [];
  for (let from = 0; from < total; from += 1_000) {
    const batch = records(stream.prefix, "ok", from, 1_000);
    await pg.sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
    );
    committed.push(...batch.map((r) => r.id));
  }
  const base = {
    store: { kind: "postgres" as const, url: db.url },
    natsUrl: await natsUrl(),
    dispatchers: 1,
    limit: 100,
    leaseMs,
  };

  // The first process hangs after its 1,250th PubAck (the middle of its 13th batch): the rest of
  // that batch is published and acknowledged, nothing of it recorded. Then it is killed.
  await using first = Child.dispatcher({ ...base, name: "crash-first", hangAfterPublishes: 1_250 });
  await first.waitForEvent("hung", 120_000);
  await first.crash();
  const crashedAt = performance.now();
  const atCrash = await tableSnapshot(executor);
  const unrecorded = atCrash.states.claimed ?? 0;
  assert.ok(unrecorded > 0, "the crash left claimed rows behind");

  await using second = Child.dispatcher({ ...base, name: "crash-second" });
  const table = await waitDispatched(() => tableSnapshot(executor), total);
  const recoveryMs = since(crashedAt);
  const totals = await second.stop();

  const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream.name));
  figures("dispatcher-crash", {
    ...deliveryFigures(delivery),
    dispatchedAtCrash: atCrash.states.dispatched ?? 0,
    claimedAtCrash: unrecorded,
    republishedAbsorbed: totals.duplicates,
    extraAttempts: table.attempts - total,
    maxAttempts: table.maxAttempts,
    leaseMs,
    recoveryMs,
  });
  assertExactlyOnce(delivery);
  assert.deepEqual(table.states, { dispatched: total });
  assert.ok(
    totals.duplicates > 0,
    "messages acknowledged before the crash were published again and absorbed as duplicates",
  );
  assert.ok(table.maxAttempts <= 2);
});
