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
import postgres from "postgres";
import { migrate, postgresJsExecutor, SqlInboxRepository, SqlOutboxRepository } from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";
import { backendPid, settledOrWaiting } from "./sql/lock_waits.ts";

Deno.test("postgres: an outbox prune skips the rows a concurrent pruner holds, without waiting, and goes on to the rows after them", async () => {
  const url = await postgresUrl();
  const admin = postgres(url, { max: 1, onnotice: () => {} });
  const other = postgres(url, { max: 1, onnotice: () => {} });
  const jobSql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const o = tables.outbox;
  try {
    await migrate(postgresJsExecutor(admin), { dialect: "postgres", tables });
    await admin.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'd-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dispatched', 1,
              now() - interval '2 days', now() - interval '2 days' + g * interval '1 ms'
       FROM generate_series(1, 30) AS g`,
    );
    const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
    const jobPid = await backendPid(jobSql);
    let pruning: Promise<{ dispatched: number }> | undefined;
    await other.begin(async (tx) => {
      // Another pruner's batch: the 5 oldest rows, deleted but not yet committed.
      await tx.unsafe(`DELETE FROM ${o} WHERE id IN ('d-1', 'd-2', 'd-3', 'd-4', 'd-5')`);
      pruning = job.prune({ dispatchedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      assert.equal(
        await settledOrWaiting(admin, jobPid, pruning),
        false,
        "the prune waited for the other pruner's rows",
      );
    });
    const pruned = await pruning!;
    const [left] = await admin.unsafe(`SELECT count(*)::int AS n FROM ${o}`);
    assert.equal(left.n, 0, `prune returned after ${pruned.dispatched} rows and left ${left.n}`);
    assert.equal(pruned.dispatched, 25);
  } finally {
    await jobSql.end();
    await other.end();
    await dropPostgresTables(postgresJsExecutor(admin), tables);
    await admin.end();
  }
});

Deno.test("postgres: an outbox prune skips a dead row a concurrent requeue holds, without waiting, and goes on to the rows after it", async () => {
  const url = await postgresUrl();
  const admin = postgres(url, { max: 1, onnotice: () => {} });
  const other = postgres(url, { max: 1, onnotice: () => {} });
  const jobSql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const o = tables.outbox;
  try {
    await migrate(postgresJsExecutor(admin), { dialect: "postgres", tables });
    await admin.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'x-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dead', 5,
              now() - interval '2 days', now() - interval '2 days' + g * interval '1 ms'
       FROM generate_series(1, 30) AS g`,
    );
    const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
    const operator = new SqlOutboxRepository(postgresJsExecutor(other), "postgres", tables);
    const jobPid = await backendPid(jobSql);
    let pruning: Promise<{ dead: number }> | undefined;
    await other.begin(async (tx) => {
      const inTx = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
      assert.equal(await inTx.requeue(["x-1"]), 1);
      pruning = job.prune({ deadBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      assert.equal(
        await settledOrWaiting(admin, jobPid, pruning),
        false,
        "the prune waited for the requeue's row",
      );
    });
    const pruned = await pruning!;
    assert.equal(pruned.dead, 29, "every dead row but the requeued one");
    assert.equal((await operator.stats()).dead, 0);
    assert.equal((await operator.stats()).pending, 1);
  } finally {
    await jobSql.end();
    await other.end();
    await dropPostgresTables(postgresJsExecutor(admin), tables);
    await admin.end();
  }
});

Deno.test("postgres: an inbox prune skips the rows a concurrent pruner holds, without waiting, and goes on to the rows after them", async () => {
  const url = await postgresUrl();
  const admin = postgres(url, { max: 1, onnotice: () => {} });
  const other = postgres(url, { max: 1, onnotice: () => {} });
  const jobSql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const inbox = tables.inbox;
  try {
    await migrate(postgresJsExecutor(admin), { dialect: "postgres", tables });
    await admin.unsafe(
      `INSERT INTO ${inbox} (consumer, message_id, received_at)
       SELECT 'c', 'm-' || lpad(g::text, 3, '0'), now() - interval '2 days' + g * interval '1 ms'
       FROM generate_series(1, 30) AS g`,
    );
    const job = new SqlInboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
    const jobPid = await backendPid(jobSql);
    let pruning: Promise<number> | undefined;
    await other.begin(async (tx) => {
      await tx.unsafe(
        `DELETE FROM ${inbox} WHERE message_id IN ('m-001', 'm-002', 'm-003', 'm-004', 'm-005')`,
      );
      pruning = job.prune({ receivedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      assert.equal(
        await settledOrWaiting(admin, jobPid, pruning),
        false,
        "the prune waited for the other pruner's rows",
      );
    });
    const removed = await pruning!;
    const [left] = await admin.unsafe(`SELECT count(*)::int AS n FROM ${inbox}`);
    assert.equal(left.n, 0, `prune returned after ${removed} ids and left ${left.n}`);
    assert.equal(removed, 25);
  } finally {
    await jobSql.end();
    await other.end();
    await dropPostgresTables(postgresJsExecutor(admin), tables);
    await admin.end();
  }
});

Deno.test("postgres: prune takes any batchSize checkedBatchSize accepts (a safe integer >= 1)", async () => {
  const url = await postgresUrl();
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
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
  } finally {
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.end();
  }
});

Deno.test("postgres: concurrent pruners delete exactly the prunable rows, never a dead head", async () => {
  const url = await postgresUrl();
  const admin = postgres(url, { max: 1, onnotice: () => {} });
  const pruners = [1_000, 10, 37].map((batchSize) => ({
    sql: postgres(url, { max: 1, onnotice: () => {} }),
    batchSize,
  }));
  const tables = uniqueTables();
  const o = tables.outbox;
  try {
    await migrate(postgresJsExecutor(admin), { dialect: "postgres", tables });
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
  } finally {
    await Promise.all(pruners.map(({ sql }) => sql.end()));
    await dropPostgresTables(postgresJsExecutor(admin), tables);
    await admin.end();
  }
});
