/**
 * Postgres prune batches: any batchSize the options accept, and batches against a concurrent
 * writer: a batch whose rows another transaction deletes
 * (a second pruner) or changes (a requeue) while the batch waits for their locks deletes fewer
 * than `batchSize` rows. The batch was still full, so the loop must go on: stopping there left
 * every later eligible row behind (three concurrent pruners with batch sizes 1000, 10 and 37
 * left 19,000 of 20,000 prunable rows in two rounds of five).
 *
 * @module
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, postgresJsExecutor, SqlInboxRepository, SqlOutboxRepository } from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";

type Sql = ReturnType<typeof postgres>;

/** Waits until a backend runs a statement on `table` while waiting for a lock. */
async function waitForLockWait(admin: Sql, table: string): Promise<void> {
  for (let wait = 0; wait < 200; wait++) {
    const rows = await admin.unsafe(
      `SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`,
      [table],
    );
    if (rows.length > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error("the prune never waited for the other transaction's locks");
}

Deno.test("postgres: an outbox prune whose batch lost rows to a concurrent pruner goes on to the rows after it", async () => {
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
    let pruning: Promise<unknown> | undefined;
    await other.begin(async (tx) => {
      // Another pruner's batch: the 5 oldest rows, deleted but not yet committed.
      await tx.unsafe(`DELETE FROM ${o} WHERE id IN ('d-1', 'd-2', 'd-3', 'd-4', 'd-5')`);
      pruning = job.prune({ dispatchedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      await waitForLockWait(admin, o);
    });
    const pruned = await pruning as { dispatched: number };
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

Deno.test("postgres: an outbox prune whose batch lost a dead row to a concurrent requeue goes on to the rows after it", async () => {
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
    let pruning: Promise<unknown> | undefined;
    await other.begin(async (tx) => {
      const inTx = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
      assert.equal(await inTx.requeue(["x-1"]), 1);
      pruning = job.prune({ deadBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      await waitForLockWait(admin, o);
    });
    const pruned = await pruning as { dead: number };
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

Deno.test("postgres: an inbox prune whose batch lost rows to a concurrent pruner goes on to the rows after it", async () => {
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
    let pruning: Promise<number> | undefined;
    await other.begin(async (tx) => {
      await tx.unsafe(
        `DELETE FROM ${inbox} WHERE message_id IN ('m-001', 'm-002', 'm-003', 'm-004', 'm-005')`,
      );
      pruning = job.prune({ receivedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 });
      await waitForLockWait(admin, inbox);
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
