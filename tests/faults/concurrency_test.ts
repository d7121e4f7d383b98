/**
 * Scenario 1, concurrency: several dispatchers in separate OS processes on one store while the
 * test keeps committing (and rolling back) work. Every committed message must be in the stream
 * exactly once, every row `dispatched`, and nothing of the rolled-back work published.
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import {
  createOutboxBucket,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  OutboxValidationError,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../../mod.ts";
import { openSqlite } from "../sql/harness.ts";
import { createTestDatabase, createTestStream, natsUrl, uniqueName } from "../kit/mod.ts";
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
  tempDir,
  waitChildrenDispatched,
} from "./harness.ts";

const total = Number(Deno.env.get("OUTBOX_FAULTS_CONCURRENCY_MESSAGES") ?? 20_000);
/** Committed transactions of this many messages, ... */
const perTransaction = 200;
/** ... and after every `rollbackEvery`-th one, a transaction of `rolledBackSize` that rolls back. */
const rollbackEvery = 10;
const rolledBackSize = 50;

class Rollback extends Error {}

/**
 * Runs the enqueue plan: `total` committed ids in transactions of `perTransaction`, with rolled
 * back transactions in between. `commit(batch)` and `rollback(batch)` do the store's part. The
 * first half is enqueued before `start()` (a backlog the dispatchers compete for), the second
 * half while they run.
 */
async function enqueuePlan(
  prefix: string,
  commit: (batch: ReturnType<typeof records>) => Promise<void>,
  rollback: (batch: ReturnType<typeof records>) => Promise<void>,
  start: () => void,
): Promise<{ committed: string[]; rolledBack: string[] }> {
  const committed: string[] = [];
  const rolledBack: string[] = [];
  let started = false;
  for (let from = 0, n = 0; from < total; from += perTransaction, n++) {
    if (!started && from >= total / 2) {
      start();
      started = true;
    }
    const batch = records(prefix, "ok", from, Math.min(perTransaction, total - from));
    await commit(batch);
    committed.push(...batch.map((r) => r.id));
    if (n % rollbackEvery === rollbackEvery - 1) {
      const doomed = records(prefix, "rolled-back", n * rolledBackSize, rolledBackSize);
      await rollback(doomed);
      rolledBack.push(...doomed.map((r) => r.id));
    }
  }
  if (!started) start();
  return { committed, rolledBack };
}

/** Starts dispatcher children that wait for SIGUSR2 (see `startOnSignal`). */
function startAll(...children: Child[]): () => void {
  return () => {
    for (const child of children) child.kill("SIGUSR2");
  };
}

Deno.test("concurrency: 4 dispatchers in 2 processes on one Postgres table, rolled-back transactions never published", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  await migrate(postgresJsExecutor(pg.sql), { dialect: "postgres" });
  const base = {
    store: { kind: "postgres" as const, url: db.url },
    natsUrl: await natsUrl(),
    dispatchers: 2,
    leaseMs: 10_000,
    idleRetryMs: 50,
    startOnSignal: true,
  };
  await using a = Child.dispatcher({ ...base, name: "pg-a" });
  await using b = Child.dispatcher({ ...base, name: "pg-b" });
  await Promise.all([a.waitForEvent("ready"), b.waitForEvent("ready")]);

  const started = performance.now();
  const { committed, rolledBack } = await enqueuePlan(stream.prefix, async (batch) => {
    await pg.sql.begin(async (tx) => {
      await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch);
    });
  }, async (batch) => {
    await assert.rejects(
      pg.sql.begin(async (tx) => {
        await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch);
        throw new Rollback("business rule failed after the enqueue");
      }),
      Rollback,
    );
  }, startAll(a, b));
  await waitChildrenDispatched([a, b], committed.length);
  const elapsedMs = since(started);
  const totals = sumTotals(await Promise.all([a.stop(), b.stop()]));

  const table = await tableSnapshot(postgresJsExecutor(pg.sql));
  assert.deepEqual(table.states, { dispatched: committed.length }, "every row dispatched");
  const [{ n: rolledBackRows }] = await pg.sql`
    SELECT count(*)::int AS n FROM trellis_outbox WHERE id LIKE 'rolled-back-%'`;
  assert.equal(rolledBackRows, 0, "rolled-back rows are not in the table");
  const delivery = compareDelivery(
    committed,
    await readStreamIds(nats.nc, stream.name),
    rolledBack,
  );
  figures("concurrency/postgres", {
    ...deliveryFigures(delivery),
    rolledBack: rolledBack.length,
    processes: 2,
    dispatchers: 4,
    attempts: table.attempts,
    duplicateAcks: totals.duplicates,
    superseded: totals.superseded,
    perProcess: [a.totals.dispatched, b.totals.dispatched],
    elapsedMs,
  });
  assertExactlyOnce(delivery);
  assert.ok(a.totals.dispatched > 0 && b.totals.dispatched > 0, "both processes dispatched");
});

Deno.test("concurrency: 2 processes (2 dispatchers each) on one SQLite file in WAL mode", async () => {
  await using dir = await tempDir("outbox_faults_sqlite_");
  const path = `${dir.path}/outbox.db`;
  const db = openSqlite(path);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    // The transactions below are opened with raw BEGIN: enqueue inside them deliberately.
    const outbox = new SqlOutboxRepository(
      nodeSqliteExecutor(db, { openTransaction: "join" }),
      "sqlite",
    );
    await using nats = await natsConnection();
    await using stream = await createTestStream(nats.nc);
    const base = {
      store: { kind: "sqlite" as const, path },
      natsUrl: await natsUrl(),
      dispatchers: 2,
      leaseMs: 10_000,
      idleRetryMs: 50,
      startOnSignal: true,
    };
    await using a = Child.dispatcher({ ...base, name: "sqlite-a" });
    await using b = Child.dispatcher({ ...base, name: "sqlite-b" });
    await Promise.all([a.waitForEvent("ready"), b.waitForEvent("ready")]);

    const started = performance.now();
    const transaction = async (batch: ReturnType<typeof records>, fail: boolean) => {
      db.exec("BEGIN IMMEDIATE");
      try {
        await outbox.enqueueMany(batch);
        if (fail) throw new Rollback("business rule failed after the enqueue");
        db.exec("COMMIT");
      } catch (error) {
        db.exec("ROLLBACK");
        throw error;
      }
    };
    const { committed, rolledBack } = await enqueuePlan(
      stream.prefix,
      (batch) => transaction(batch, false),
      (batch) => assert.rejects(transaction(batch, true), Rollback),
      startAll(a, b),
    );
    await waitChildrenDispatched([a, b], committed.length);
    const elapsedMs = since(started);
    const totals = sumTotals(await Promise.all([a.stop(), b.stop()]));

    const table = await tableSnapshot(executor);
    assert.deepEqual(table.states, { dispatched: committed.length }, "every row dispatched");
    const [{ n }] = await executor.query(
      "SELECT count(*) AS n FROM trellis_outbox WHERE id LIKE 'rolled-back-%'",
      [],
    );
    assert.equal(Number(n), 0, "rolled-back rows are not in the table");
    const delivery = compareDelivery(
      committed,
      await readStreamIds(nats.nc, stream.name),
      rolledBack,
    );
    figures("concurrency/sqlite", {
      ...deliveryFigures(delivery),
      rolledBack: rolledBack.length,
      processes: 2,
      dispatchers: 4,
      attempts: table.attempts,
      duplicateAcks: totals.duplicates,
      superseded: totals.superseded,
      perProcess: [a.totals.dispatched, b.totals.dispatched],
      elapsedMs,
    });
    assertExactlyOnce(delivery);
    assert.ok(a.totals.dispatched > 0 && b.totals.dispatched > 0, "both processes dispatched");
  } finally {
    db.close();
  }
});

Deno.test("concurrency: 2 processes (2 dispatchers each) on one NATS KV bucket; rejected batches store nothing", async () => {
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const bucket = uniqueName("faults_kv");
  const kvm = new Kvm(nats.nc);
  const kv = await createOutboxBucket(kvm, bucket);
  const outbox = new NatsKvOutboxRepository(kv);
  try {
    const base = {
      store: { kind: "kv" as const, bucket },
      natsUrl: await natsUrl(),
      dispatchers: 2,
      leaseMs: 10_000,
      idleRetryMs: 50,
      startOnSignal: true,
    };
    await using a = Child.dispatcher({ ...base, name: "kv-a" });
    await using b = Child.dispatcher({ ...base, name: "kv-b" });
    await Promise.all([a.waitForEvent("ready"), b.waitForEvent("ready")]);

    const started = performance.now();
    // KV has no transactions; the counterpart of a rollback is a batch that fails validation
    // (one bad record): enqueueMany validates everything first and stores none of it.
    const { committed, rolledBack } = await enqueuePlan(
      stream.prefix,
      async (batch) => {
        await outbox.enqueueMany(batch);
      },
      async (batch) => {
        const poisoned = [...batch, { ...batch[0], id: `bad-${batch[0].id}`, subject: "a.*" }];
        await assert.rejects(outbox.enqueueMany(poisoned), OutboxValidationError);
      },
      startAll(a, b),
    );
    await waitChildrenDispatched([a, b], committed.length);
    const elapsedMs = since(started);
    const totals = sumTotals(await Promise.all([a.stop(), b.stop()]));

    const stats = await outbox.stats();
    assert.deepEqual(
      { ...stats, oldestDueAgeMs: undefined, oldestDueCreatedAt: undefined },
      {
        pending: 0,
        claimed: 0,
        failed: 0,
        dispatched: committed.length,
        dead: 0,
        due: 0,
        blockedKeys: 0,
        oldestDueAgeMs: undefined,
        oldestDueCreatedAt: undefined,
      },
    );
    for (const id of rolledBack.slice(0, 20)) {
      assert.equal(await outbox.get(id), undefined, "nothing of a rejected batch is stored");
    }
    const delivery = compareDelivery(
      committed,
      await readStreamIds(nats.nc, stream.name),
      rolledBack,
    );
    figures("concurrency/nats-kv", {
      ...deliveryFigures(delivery),
      rejected: rolledBack.length,
      processes: 2,
      dispatchers: 4,
      duplicateAcks: totals.duplicates,
      superseded: totals.superseded,
      perProcess: [a.totals.dispatched, b.totals.dispatched],
      elapsedMs,
    });
    assertExactlyOnce(delivery);
    assert.ok(a.totals.dispatched > 0 && b.totals.dispatched > 0, "both processes dispatched");
  } finally {
    await outbox.close();
    await kv.destroy().catch(() => {});
  }
});
