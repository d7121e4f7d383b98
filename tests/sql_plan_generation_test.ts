/**
 * A relay whose connection prepared its statements while the outbox was empty must not keep
 * reading the whole table as the history grows. postgres.js prepares named statements, and
 * Postgres keeps the generic plan it made after five executions until the table is analyzed: on
 * an empty table that plan is a sequential scan. Autovacuum is off for the table here (so no
 * ANALYZE rescues it); asserted on the rows the table's sequential scans read (the server's
 * statistics, flushed when the relay's connection closes), never on time.
 */

import assert from "node:assert/strict";
import type postgres from "postgres";
import {
  type OutboxRecord,
  postgresJsExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { planGeneration } from "../src/stores/sql/plan_generations.ts";
import { retireKeyStatements } from "../src/stores/sql/retire_keys.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { explainPlan, planNodes, readsTable, rowsRead } from "./sql/plan.ts";
import { openPostgresTables } from "./sql/postgres_tables.ts";

const history = 50_000;

function records(from: number, count: number): OutboxRecord[] {
  return Array.from({ length: count }, (_, k) => ({
    id: `m-${from + k}`,
    kind: "event.publish" as const,
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ n: from + k, pad: "x".repeat(150) }),
    headers: {},
  }));
}

/**
 * Rows the table's sequential scans have read, plus with `indexFetches` the rows its index
 * scans fetched (flushed when the reading connection closed).
 */
async function scanReads(
  admin: postgres.Sql,
  table: string,
  { indexFetches = false } = {},
): Promise<number> {
  const counted = indexFetches
    ? "coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
    : "coalesce(seq_tup_read, 0)";
  let read = 0;
  for (let wait = 0; wait < 20; wait++) {
    await admin.unsafe("SELECT pg_stat_clear_snapshot()");
    const [row] = await admin.unsafe(
      `SELECT (${counted})::bigint AS n FROM pg_stat_user_tables WHERE relname = $1`,
      [table],
    );
    read = Number(row?.n ?? 0);
    if (read > 0) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return read;
}

Deno.test("postgres: a relay that started on an empty outbox plans its statements again as it claims", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  // ONE connection for the relay: its prepared statements are the ones that matter.
  const relaySql = pg.connect();
  const o = tables.outbox;
  await admin.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
  const producer = new SqlOutboxRepository(postgresJsExecutor(admin), "postgres", tables);
  const relay = new SqlOutboxRepository(postgresJsExecutor(relaySql), "postgres", tables);
  const drain = async (limit: number) => {
    let total = 0;
    while (true) {
      const claimed = await relay.claimDue(limit, new Date());
      if (claimed.length === 0) return total;
      total += claimed.length;
      const marks = await relay.markMany(
        claimed.map((claim, i) =>
          i % 10 === 9
            ? { claim, state: "failed" as const, error: "x", nextAttemptAt: new Date(0) }
            : { claim, state: "dispatched" as const }
        ),
        new Date(),
      );
      assert.ok(marks.every(Boolean));
    }
  };

  // A new deployment: a few messages, one at a time (the statements' plans are made now).
  let next = 0;
  for (let i = 0; i < 10; i++) {
    await producer.enqueue(records(next++, 1)[0]);
    await drain(1);
  }
  // Then traffic: 5,000 messages, relayed in batches of 100 (history kept).
  await producer.enqueueMany(records(next, 5_000));
  next += 5_000;
  assert.ok((await drain(100)) >= 5_000);
  // A long history (as months of traffic would leave), then steady traffic again.
  await admin.unsafe(
    `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', repeat('x', 160), '{}'::jsonb, 'dispatched', 1, now(), now()
     FROM generate_series(1, ${history}) AS g`,
  );
  for (let i = 0; i < 30; i++) {
    await producer.enqueueMany(records(next, 5));
    next += 5;
    await drain(100);
  }
  // Closing the relay's connection flushes its backend's statistics.
  await relaySql.end();
  const read = await scanReads(admin, o);
  // With the plans made on the empty table, each of the last 30 rounds' statements reads all
  // 55,000 rows (millions in all); planned again on the grown table, they probe indexes. What
  // the first 5,000 messages cost while the table was still small is well under the bound.
  assert.ok(
    read < 1_500_000,
    `the table's sequential scans read ${read} rows: the relay kept plans made on an empty table`,
  );
});

/** Events as small as a producer's usual ones (a small table in few pages at first). */
function smallRecords(from: number, count: number, keyed: boolean): OutboxRecord[] {
  return records(from, count).map((record, k) =>
    keyed
      ? { ...record, payload: "{}", orderingKey: `key-${(from + k) % 7}` }
      : { ...record, payload: "{}" }
  );
}

for (
  const [perTransaction, keyed] of [[false, false], [true, false], [false, true]] as const
) {
  Deno.test(
    `postgres: a producer's enqueueMany prepared on an empty outbox does not read the whole table later (${
      perTransaction ? "a repository per transaction" : "one repository"
    }${keyed ? ", ordering keys" : ""})`,
    async () => {
      // A producer never claims, so plan generations never reach its statements. Its enqueueMany
      // (batches of 50, each sent twice as a retrying producer does), prepared on the empty table,
      // kept generic plans that read the whole outbox on every call: getMany (ids already stored)
      // and insertMany's key heads each hashed a sequential scan (seq_tup_read 1.5M per statement).
      await using pg = await openPostgresTables();
      const { admin, tables } = pg;
      const appSql = pg.connect();
      const o = tables.outbox;
      await admin.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
      const shared = new SqlOutboxRepository(postgresJsExecutor(appSql), "postgres", tables);
      const enqueueMany = (batch: OutboxRecord[]) =>
        perTransaction
          ? appSql.begin((tx) =>
            new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables).enqueueMany(batch)
          )
          : shared.enqueueMany(batch);
      let next = 0;
      for (let i = 0; i < 10; i++) {
        await enqueueMany(smallRecords(next, 50, keyed));
        await enqueueMany(smallRecords(next, 50, keyed));
        next += 50;
      }
      await admin.unsafe(
        `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', repeat('x', 160), '{}'::jsonb, 'dispatched', 1, now(), now()
       FROM generate_series(1, ${history}) AS g`,
      );
      for (let i = 0; i < 30; i++) {
        // Each batch twice, as a producer that retries (or a handler run again) sends it.
        await enqueueMany(smallRecords(next, 50, keyed));
        await enqueueMany(smallRecords(next, 50, keyed));
        next += 50;
      }
      await appSql.end();
      const read = await scanReads(admin, o);
      assert.ok(
        read < 500_000,
        `the table's sequential scans read ${read} rows: the producer kept plans made on an empty table`,
      );
    },
  );
}

Deno.test("plan generations: the statements are planned again at 64, 256, ... 65,536 claimed", () => {
  assert.deepEqual(
    [0, 63, 64, 255, 256, 1_023, 1_024, 4_096, 16_384, 65_535, 65_536, 10_000_000].map(
      planGeneration,
    ),
    [0, 0, 1, 1, 2, 2, 3, 4, 5, 5, 6, 6],
  );
});

Deno.test("postgres: an inbox retention job whose prune was planned on an empty inbox plans it again as it prunes", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  // ONE connection for the retention job: its prepared statements are the ones that matter.
  const jobSql = pg.connect();
  const table = tables.inbox;
  await admin.unsafe(`ALTER TABLE ${table} SET (autovacuum_enabled = false)`);
  const inbox = new SqlInboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const base = Date.now() - 86_400_000;
  // A new deployment: the job runs while the inbox is still empty (its plan is made now).
  for (let i = 0; i < 8; i++) {
    assert.equal(await inbox.prune({ receivedBefore: new Date(), batchSize: 1_000 }), 0);
  }
  // A day of messages later: 100,000 recorded ids, the oldest 20,000 past the retention.
  await admin.unsafe(
    `INSERT INTO ${table} (consumer, message_id, received_at)
     SELECT 'c', 'm-' || g, to_timestamp(${base / 1000}) + g * interval '1 ms'
     FROM generate_series(1, 100000) AS g`,
  );
  const removed = await inbox.prune({
    receivedBefore: new Date(base + 20_001),
    batchSize: 1_000,
  });
  assert.equal(removed, 20_000);
  await jobSql.end();
  const read = await scanReads(admin, table);
  // With the plan made on the empty inbox, each of the 20 batches reads the whole table
  // (2,000,000 rows in all); planned again after its first batch, the job probes indexes.
  assert.ok(
    read < 600_000,
    `the inbox's sequential scans read ${read} rows: the prune kept a plan made on an empty inbox`,
  );
});

Deno.test("postgres: an outbox retention job whose prune was planned on an empty outbox reads only its batches", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const jobSql = pg.connect();
  const o = tables.outbox;
  await admin.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
  // A repository that only prunes (a retention job beside the relay): it never claims.
  const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const base = Date.now() - 86_400_000;
  for (let i = 0; i < 8; i++) {
    const pruned = await job.prune({ dispatchedBefore: new Date(), batchSize: 1_000 });
    assert.equal(pruned.dispatched, 0);
  }
  // 100,000 dispatched rows, settled 7 at a time (a mark batch shares its updated_at).
  await admin.unsafe(
    `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', repeat('x', 160), '{}'::jsonb, 'dispatched', 1,
            to_timestamp(${base / 1000}), to_timestamp(${base / 1000}) + (g / 7) * interval '1 ms'
     FROM generate_series(1, 100000) AS g`,
  );
  const progress: number[] = [];
  const pruned = await job.prune({
    dispatchedBefore: new Date(base + 3_000),
    batchSize: 1_000,
    onProgress: (p) => progress.push(p.dispatched),
  });
  // 0..2999 ms: g / 7 < 3000, g = 1..20,999.
  assert.equal(pruned.dispatched, 20_999);
  assert.deepEqual(progress.slice(0, 3), [1_000, 2_000, 3_000], "batches of exactly batchSize");
  await jobSql.end();
  const read = await scanReads(admin, o, { indexFetches: true });
  // Planned on the empty outbox, `id IN (SELECT ... LIMIT)` re-ran its subquery for every
  // candidate row: 20.7 million rows fetched, most for the first batch. As an index range per
  // batch: about 200,000 (each batch's range scan also passes the rows earlier batches
  // deleted, which no vacuum has removed).
  assert.ok(
    read < 1_000_000,
    `the outbox's scans fetched ${read} rows: the prune read more than its batches`,
  );
});

/**
 * Runs `statement` (parameters: a cutoff an hour ago, a batch of 1,000) as a prepared statement
 * whose generic plan was made while `table` was empty, after `fill` filled it: the rows each
 * node on `table` read (returned and removed by its filters), at most, and its scan node types.
 */
async function genericPruneReads(
  sql: postgres.Sql,
  statement: string,
  table: string,
  fill: string,
): Promise<{ most: number; scans: string[] }> {
  const cutoff = new Date(Date.now() - 3_600_000).toISOString();
  // Planned while the table is empty; after five runs Postgres keeps the generic plan.
  await sql.unsafe(`PREPARE p(text, int) AS ${statement}`);
  for (let i = 0; i < 8; i++) await sql.unsafe(`EXECUTE p('${cutoff}', 1000)`);
  await sql.unsafe(fill);
  const plan = await explainPlan(
    sql,
    `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE p('${cutoff}', 1000)`,
  );
  const reads = planNodes(plan).filter((node) => readsTable(node, table));
  return {
    most: Math.max(0, ...reads.map(rowsRead)),
    scans: reads.map((node) => node["Node Type"]),
  };
}

Deno.test("postgres: an outbox prune statement planned on an empty outbox reads one batch of its index, not every prunable row", async () => {
  await using pg = await openPostgresTables();
  const { admin: sql, tables } = pg;
  const o = tables.outbox;
  await sql.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
  const statement = outboxStatements("postgres", resolveSqlOutboxTables(tables), false).prune
    .dispatched;
  const { most, scans } = await genericPruneReads(
    sql,
    statement,
    o,
    `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dispatched', 1,
            now() - interval '2 days', now() - interval '2 days' + (g / 7) * interval '1 ms'
     FROM generate_series(1, 50000) AS g`,
  );
  // Ordered by (updated_at, seq), a plan made on the empty outbox sorted every prunable row
  // (50,000) for each batch; ordered by the index's updated_at, it reads the batch (and its
  // ties). Deleting the batch's rows by id alone, it read the whole table.
  assert.ok(!scans.includes("Seq Scan"), scans.join(", "));
  assert.ok(most <= 2_000, `one batch of 1,000 read ${most} rows of the outbox`);
});

Deno.test("postgres: an inbox prune statement planned on an empty inbox reads one batch of its index, not every old id", async () => {
  await using pg = await openPostgresTables();
  const { admin: sql, tables } = pg;
  const inbox = tables.inbox;
  await sql.unsafe(`ALTER TABLE ${inbox} SET (autovacuum_enabled = false)`);
  const statement = outboxStatements("postgres", resolveSqlOutboxTables(tables), false).inboxPrune;
  const { most, scans } = await genericPruneReads(
    sql,
    statement,
    inbox,
    `INSERT INTO ${inbox} (consumer, message_id, received_at)
     SELECT 'c', 'm-' || g, now() - interval '2 days' + (g / 7) * interval '1 ms'
     FROM generate_series(1, 50000) AS g`,
  );
  // Deleting the batch's rows by address alone, the plan made on the empty inbox read all of
  // it.
  assert.ok(!scans.includes("Seq Scan"), scans.join(", "));
  assert.ok(most <= 2_000, `one batch of 1,000 read ${most} rows of the inbox`);
});

Deno.test("postgres: prune's idle-key statements planned on empty tables probe indexes, never scan the outbox or its key table", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const sql = pg.connect();
  const o = tables.outbox;
  const keys = `${o}_keys`;
  await sql.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
  await sql.unsafe(`ALTER TABLE ${keys} SET (autovacuum_enabled = false)`);
  const statements = retireKeyStatements("postgres", resolveSqlOutboxTables(tables));
  const cutoff = new Date(Date.now() - 3_600_000).toISOString();
  // Planned while both tables are empty; after five runs Postgres keeps the generic plans.
  await sql.unsafe(`PREPARE k(text, bigint) AS ${statements.keys}`);
  await sql.unsafe(`PREPARE r(text, timestamptz) AS ${statements.retire}`);
  for (let i = 0; i < 8; i++) {
    await sql.begin(async (tx) => {
      await tx.unsafe(`EXECUTE k('', 1000)`);
      await tx.unsafe(`EXECUTE r('["a", "b"]', '${cutoff}')`);
    });
  }
  // 20,000 keys with three dispatched messages each, two days old; every other key also has
  // one dispatched a minute ago (not idle).
  await sql.unsafe(
    `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
     SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dispatched', 1,
            now() - interval '2 days',
            CASE WHEN g % 6 = 0 THEN now() - interval '1 minute' ELSE now() - interval '2 days' END,
            'k-' || lpad((g % 20000)::text, 6, '0'), false
     FROM generate_series(1, 60000) AS g`,
  );
  await sql.unsafe(
    `INSERT INTO ${keys} (ordering_key, stream_seq) SELECT 'k-' || lpad(g::text, 6, '0'), g + 1 FROM generate_series(0, 19999) AS g`,
  );
  const round = await sql.begin(async (tx) => {
    const found = await tx.unsafe(`EXECUTE k('', 1000)`);
    const json = JSON.stringify(found.map((row) => row.ordering_key));
    const plan = await explainPlan(
      tx,
      `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE r('${json}', '${cutoff}')`,
    );
    return { found: found.length, nodes: planNodes(plan) };
  });
  assert.equal(round.found, 1_000);
  const walk = planNodes(
    await explainPlan(sql, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE k('', 1000)`),
  );
  for (const node of [...walk, ...round.nodes]) {
    assert.ok(
      !(node["Node Type"] === "Seq Scan" && (node["Relation Name"] === o ||
        node["Relation Name"] === keys)),
      `a generic plan made on empty tables scans ${node["Relation Name"]}`,
    );
  }
  await sql.unsafe("DEALLOCATE ALL");
  await sql.end();
  const read = await scanReads(admin, o);
  assert.equal(read, 0, `the outbox's sequential scans read ${read} rows`);
  // Half of the 1,000 keys were idle: deleted (and rolled back by nothing: it committed).
  const [left] = await admin.unsafe(`SELECT count(*)::int AS n FROM ${keys}`);
  assert.equal(left.n, 20_000 - 500);
});

Deno.test("postgres: prune's idle-key rounds are planned for their values, even after the outbox was analyzed while small", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const jobSql = pg.connect();
  const o = tables.outbox;
  await admin.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
  const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  // A small keyed outbox, analyzed (as autovacuum leaves it after its first messages), and a
  // retention job that prunes it a few times: its statements are cached with plans for it.
  const relay = new SqlOutboxRepository(postgresJsExecutor(admin), "postgres", tables);
  await relay.enqueueMany(
    Array.from({ length: 60 }, (_, i) => ({
      ...records(i, 1)[0],
      id: `s-${i}`,
      orderingKey: `small-${i % 30}`,
    })),
  );
  for (const message of await relay.claimDue(30, new Date())) {
    await relay.markDispatched(message, new Date(), undefined, { sequence: 1 });
  }
  await admin.unsafe(`ANALYZE ${o}; ANALYZE ${o}_keys`);
  for (let i = 0; i < 8; i++) {
    await job.prune({ dispatchedBefore: new Date(Date.now() - 3_600_000) });
  }
  // Then 10,000 keys, each with an old dispatched message and a pending head (none idle).
  const columns =
    "id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head";
  await admin.unsafe(
    `INSERT INTO ${o} (${columns}) SELECT 'd-' || g, 'event.publish', 'n', 's.a', '{}', '{}'::jsonb, 'dispatched', 1, now() - interval '2 hours', now() - interval '2 hours', 'key-' || lpad(g::text, 6, '0'), false FROM generate_series(1, 10000) AS g`,
  );
  await admin.unsafe(
    `INSERT INTO ${o} (${columns}) SELECT 'p-' || g, 'event.publish', 'n', 's.a', '{}', '{}'::jsonb, 'pending', 0, now(), now(), 'key-' || lpad(g::text, 6, '0'), true FROM generate_series(1, 10000) AS g`,
  );
  await admin.unsafe(
    `INSERT INTO ${o}_keys (ordering_key, stream_seq) SELECT 'key-' || lpad(g::text, 6, '0'), g FROM generate_series(1, 10000) AS g`,
  );
  const before = await scanReads(admin, o);
  await job.prune({ dispatchedBefore: new Date(Date.now() - 3 * 3_600_000) });
  await jobSql.end();
  const read = (await scanReads(admin, o)) - before;
  // With the plans cached for the 60-row outbox, each key of a round was checked by a
  // sequential scan of the whole outbox: 10,000 keys x 20,000 rows.
  assert.ok(read < 200_000, `the outbox's sequential scans read ${read} rows`);
});
