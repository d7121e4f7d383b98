/**
 * Postgres prune batches: any batchSize the options accept, and batches against concurrent
 * writers. A batch takes only rows no other transaction holds (FOR UPDATE SKIP LOCKED) and never
 * waits for one: rows another pruner is deleting, or a requeue is changing, are skipped, and the
 * loop goes on to every row after them (stopping on a batch that deleted fewer rows than
 * `batchSize` once left 19,000 of 20,000 prunable rows behind: three concurrent pruners with batch
 * sizes 1000, 10 and 37, two rounds of five). Concurrent pruners together delete exactly the
 * prunable rows, never a held head. (A prune that waited for row locks closed lock cycles with
 * keyed producers: tests/sql_prune_deadlock_test.ts.)
 *
 * @module
 */

import assert from "node:assert/strict";
import type postgres from "postgres";
import { postgresJsExecutor, SqlInboxRepository, SqlOutboxRepository } from "../mod.ts";
import { backendPid, settledOrWaiting } from "./sql/lock_waits.ts";
import { openPostgresTables } from "./sql/postgres_tables.ts";

/** Inserts 30 outbox rows `<prefix>-1` to `<prefix>-30` in `state`, two days old, 1 ms apart. */
async function insertOldRows(
  admin: postgres.Sql,
  outbox: string,
  prefix: string,
  state: "dispatched" | "dead",
  attempts: number,
): Promise<void> {
  await admin.unsafe(
    `INSERT INTO ${outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     SELECT '${prefix}-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, '${state}', ${attempts},
            now() - interval '2 days', now() - interval '2 days' + g * interval '1 ms'
     FROM generate_series(1, 30) AS g`,
  );
}

/**
 * Runs `hold` in a transaction of `other`, then, while that transaction is open (the rows it
 * deleted or changed stay locked), starts `prune` on `jobSql`: asserts the prune finished without
 * waiting for a lock (`waited` otherwise), and returns what it returned.
 */
async function pruneBesideHeldRows<T>(
  { admin, other, jobSql }: { admin: postgres.Sql; other: postgres.Sql; jobSql: postgres.Sql },
  hold: (tx: postgres.TransactionSql) => Promise<void>,
  prune: () => Promise<T>,
  waited: string,
): Promise<T> {
  const jobPid = await backendPid(jobSql);
  let pruning: Promise<T> | undefined;
  await other.begin(async (tx) => {
    await hold(tx);
    pruning = prune();
    assert.equal(await settledOrWaiting(admin, jobPid, pruning), false, waited);
  });
  return await pruning!;
}

Deno.test("postgres: an outbox prune skips the rows a concurrent pruner holds, without waiting, and goes on to the rows after them", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const other = pg.connect();
  const jobSql = pg.connect();
  const o = tables.outbox;
  await insertOldRows(admin, o, "d", "dispatched", 1);
  const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const pruned = await pruneBesideHeldRows(
    { admin, other, jobSql },
    async (tx) => {
      // Another pruner's batch: the 5 oldest rows, deleted but not yet committed.
      await tx.unsafe(`DELETE FROM ${o} WHERE id IN ('d-1', 'd-2', 'd-3', 'd-4', 'd-5')`);
    },
    () => job.prune({ dispatchedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 }),
    "the prune waited for the other pruner's rows",
  );
  const [left] = await admin.unsafe(`SELECT count(*)::int AS n FROM ${o}`);
  assert.equal(left.n, 0, `prune returned after ${pruned.dispatched} rows and left ${left.n}`);
  assert.equal(pruned.dispatched, 25);
});

Deno.test("postgres: an outbox prune skips a dead row a concurrent requeue holds, without waiting, and goes on to the rows after it", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const other = pg.connect();
  const jobSql = pg.connect();
  const o = tables.outbox;
  await insertOldRows(admin, o, "x", "dead", 5);
  const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const operator = new SqlOutboxRepository(postgresJsExecutor(other), "postgres", tables);
  const pruned = await pruneBesideHeldRows(
    { admin, other, jobSql },
    async (tx) => {
      const inTx = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
      assert.equal(await inTx.requeue(["x-1"]), 1);
    },
    () => job.prune({ deadBefore: new Date(Date.now() - 3_600_000), batchSize: 10 }),
    "the prune waited for the requeue's row",
  );
  assert.equal(pruned.dead, 29, "every dead row but the requeued one");
  assert.equal((await operator.stats()).dead, 0);
  assert.equal((await operator.stats()).pending, 1);
});

Deno.test("postgres: an inbox prune skips the rows a concurrent pruner holds, without waiting, and goes on to the rows after them", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const other = pg.connect();
  const jobSql = pg.connect();
  const inbox = tables.inbox;
  await admin.unsafe(
    `INSERT INTO ${inbox} (consumer, message_id, received_at)
     SELECT 'c', 'm-' || lpad(g::text, 3, '0'), now() - interval '2 days' + g * interval '1 ms'
     FROM generate_series(1, 30) AS g`,
  );
  const job = new SqlInboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const removed = await pruneBesideHeldRows(
    { admin, other, jobSql },
    async (tx) => {
      await tx.unsafe(
        `DELETE FROM ${inbox} WHERE message_id IN ('m-001', 'm-002', 'm-003', 'm-004', 'm-005')`,
      );
    },
    () => job.prune({ receivedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 }),
    "the prune waited for the other pruner's rows",
  );
  const [left] = await admin.unsafe(`SELECT count(*)::int AS n FROM ${inbox}`);
  assert.equal(left.n, 0, `prune returned after ${removed} ids and left ${left.n}`);
  assert.equal(removed, 25);
});

Deno.test("postgres: prune takes any batchSize checkedBatchSize accepts (a safe integer >= 1)", async () => {
  await using pg = await openPostgresTables();
  const { admin: sql, tables } = pg;
  await sql.unsafe(
    `INSERT INTO ${tables.outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     VALUES ('d-1', 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dispatched', 1, now() - interval '2 days', now() - interval '2 days')`,
  );
  await sql.unsafe(
    `INSERT INTO ${tables.inbox} (consumer, message_id, received_at) VALUES ('c', 'm', now() - interval '2 days')`,
  );
  const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables);
  const inbox = new SqlInboxRepository(postgresJsExecutor(sql), "postgres", tables);
  const before = new Date(Date.now() - 3_600_000);
  for (const batchSize of [2 ** 31, Number.MAX_SAFE_INTEGER]) {
    assert.deepEqual(
      await outbox.prune({ dispatchedBefore: before, deadBefore: before, batchSize }),
      { dispatched: batchSize === 2 ** 31 ? 1 : 0, dead: 0 },
    );
    assert.equal(
      await inbox.prune({ receivedBefore: before, batchSize }),
      batchSize === 2 ** 31 ? 1 : 0,
    );
  }
});

Deno.test("postgres: concurrent pruners delete exactly the prunable rows, never a dead head", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const pruners = [1_000, 10, 37].map((batchSize) => ({ sql: pg.connect(), batchSize }));
  const o = tables.outbox;
  for (let round = 0; round < 2; round++) {
    // 20,000 prunable rows (unkeyed, and keyed rows that are no longer their key's head;
    // updated_at shared by runs of 7 rows, as a mark batch's), old held heads of 500 keys
    // (dispatched heads still to hand over, dead heads blocking their key) and pending rows.
    await admin.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT '${round}-p-' || g, 'event.publish', 'old', 'orders.old', '{}', '{}'::jsonb,
              CASE WHEN g % 3 = 0 THEN 'dead' ELSE 'dispatched' END, 1, now() - interval '2 days',
              now() - interval '2 days' + (g / 7) * interval '1 ms',
              CASE WHEN g % 2 = 0 THEN 'k-' || (g % 500) END, g % 2 = 1
       FROM generate_series(1, 20000) AS g`,
    );
    await admin.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT '${round}-h-' || g, 'event.publish', 'old', 'orders.old', '{}', '{}'::jsonb,
              CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'dispatched' END, 1, now() - interval '2 days',
              now() - interval '2 days' + g * interval '3 ms', 'k-${round}-' || g, true
       FROM generate_series(1, 500) AS g`,
    );
    await admin.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT '${round}-w-' || g, 'event.publish', 'new', 'orders.new', '{}', '{}'::jsonb, 'pending', 0, now(), now()
       FROM generate_series(1, 300) AS g`,
    );
    const before = new Date(Date.now() - 3_600_000);
    const results = await Promise.all(
      pruners.map(({ sql, batchSize }) =>
        new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables).prune({
          dispatchedBefore: before,
          deadBefore: before,
          batchSize,
        })
      ),
    );
    // The 250 dispatched heads still to hand over have no next message: prune hands them over
    // first (retire_keys.ts), and they are pruned with the rest; the dead heads stay. A head
    // another pruner hands over after this one's batches ended is the next prune's: one more
    // prune, alone, takes what the concurrent ones left.
    const after = await new SqlOutboxRepository(postgresJsExecutor(admin), "postgres", tables)
      .prune({ dispatchedBefore: before, deadBefore: before, batchSize: 1_000 });
    const dispatched = [...results, after].reduce((sum, result) => sum + result.dispatched, 0);
    const dead = [...results, after].reduce((sum, result) => sum + result.dead, 0);
    assert.deepEqual(
      { dispatched, dead },
      { dispatched: 13_334 + 250, dead: 6_666 },
      `round ${round}`,
    );
    assert.ok(
      after.dispatched <= 250 && after.dead === 0,
      `round ${round}: ${JSON.stringify(after)}`,
    );
    const left = await admin.unsafe(
      `SELECT split_part(id, '-', 2) AS kind, count(*)::int AS n FROM ${o} GROUP BY 1 ORDER BY 1`,
    );
    assert.deepEqual(
      left.map((row) => `${row.kind}:${row.n}`),
      [`h:${250 * (round + 1)}`, `w:${300 * (round + 1)}`],
      `round ${round}: every prunable row deleted, every dead head and pending row kept`,
    );
  }
});
