/**
 * Claims must not get slower as dispatched history accumulates, nor with a backlog of failed
 * rows waiting for their retry time. With 200,000 dispatched rows kept, or 100,000 failed rows
 * not yet due, the claim statement must read the partial pending and retry indexes, not the
 * table or the waiting rows: asserted on the plan and on the buffers Postgres actually touched
 * (EXPLAIN ANALYZE, BUFFERS), never on time.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, nodeSqliteExecutor, postgresJsExecutor } from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { postgresUrl } from "./kit/mod.ts";
import { explainRolledBack, type PlanNode, planNodes } from "./sql/plan.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

const history = 200_000;
const live = 1_000;

Deno.test("postgres: with 200k dispatched rows the claim reads only the claim index", async () => {
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    // History first (lower seq), then the live rows, as in a long-running service.
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, outcome)
       SELECT 'h-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 160), '{}'::jsonb, 'dispatched', 1,
              now() - interval '1 day' + g * interval '1 ms', now() - interval '1 day', NULL
       FROM generate_series(1, ${history}) AS g`,
    );
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'l-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 160), '{}'::jsonb, 'pending', 0, now(), now()
       FROM generate_series(1, ${live}) AS g`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${o}`);

    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    const lease = new Date(Date.now() + 31_000).toISOString();
    const explain = (text: string, params: unknown[]): Promise<PlanNode> =>
      explainRolledBack(sql, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${text}`, params);
    const buffers = (plan: PlanNode) =>
      (plan["Shared Hit Blocks"] ?? 0) + (plan["Shared Read Blocks"] ?? 0);

    const claim = await explain(statements.claim, [now, lease, 25, "token"]);
    const all = planNodes(claim);
    assert.ok(
      all.some((node) => node["Index Name"] === `${o}_pending_idx`),
      `the claim uses the partial pending index: ${JSON.stringify(all.map((n) => n["Node Type"]))}`,
    );
    assert.ok(!all.some((node) => node["Node Type"] === "Seq Scan"), "no sequential scan");
    assert.equal(claim["Actual Rows"], 25);
    const claimBuffers = buffers(claim);
    // Finding and locking the 25 rows reads a few index pages and their heap pages; the rest of
    // the statement is per claimed row (primary key probe, new row versions, index entries). A
    // scan of the history would touch thousands of pages (the table has ~8,000).
    const locking = all.filter((node) => node["Node Type"] === "LockRows")
      .reduce((sum, node) => sum + buffers(node), 0);
    assert.ok(locking < 100, `finding the rows touched ${locking} buffers`);
    assert.ok(claimBuffers < 1_000, `the claim touched ${claimBuffers} buffers`);

    // The reference's claim shape on the same table, for comparison (not asserted).
    const reference = await explain(
      `UPDATE ${o} SET state = 'claimed', attempts = attempts + 1, updated_at = $1, next_attempt_at = $2 WHERE id IN (SELECT id FROM ${o} WHERE state != 'dispatched' AND (next_attempt_at IS NULL OR next_attempt_at <= $1) ORDER BY created_at LIMIT 25 FOR UPDATE SKIP LOCKED) RETURNING *`,
      [now, lease],
    );
    console.log(
      `claim of 25 with ${history} dispatched rows kept: ${claimBuffers} buffers (reference query shape: ${
        buffers(reference)
      })`,
    );

    // markMany settles a batch through the primary key, not a scan.
    const ids = Array.from({ length: 25 }, (_, i) => `l-${i + 1}`);
    const marks = JSON.stringify(ids.map((id) => ({
      id,
      attempts: 0,
      lease: null,
      token: "token",
      state: "dispatched",
      error: null,
      next: null,
      outcome: null,
    })));
    const mark = await explain(statements.markMany, [marks, now]);
    const markNodes = planNodes(mark);

    assert.ok(markNodes.some((node) => node["Index Name"] === `${o}_pkey`), "marks use the pkey");
    assert.ok(!markNodes.some((node) => node["Node Type"] === "Seq Scan"));
    // So does the common batch's fast mark.
    const fenced = JSON.stringify(Object.fromEntries(ids.map((id) => [id, [0, "token"]])));
    const fastNodes = planNodes(await explain(statements.markDispatchedFast, [fenced, now]));
    assert.ok(fastNodes.some((node) => node["Index Name"] === `${o}_pkey`), "fast mark: pkey");
    assert.ok(!fastNodes.some((node) => node["Node Type"] === "Seq Scan"));

    // A periodic prune that finds nothing old enough reads the retention index, not the table.
    const prune = await explain(statements.prune.dispatched, ["2000-01-01T00:00:00.000Z", 1000]);
    assert.ok(buffers(prune) < 50, `an empty prune touched ${buffers(prune)} buffers`);
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("postgres: a claim of 500 on a table of 20k pending rows probes rows by key, never scans the table", async () => {
  // The planner must not turn the claim into a hash join over a sequential scan of the table
  // (which it did for large batches on mid-sized tables when the claimed ids were joined).
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'p-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 200), '{}'::jsonb, 'pending', 0, now(), now()
       FROM generate_series(1, 20000) AS g`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${o}`);
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    const lease = new Date(Date.now() + 31_000).toISOString();
    for (const limit of [25, 500, 1000]) {
      const plan = await explainRolledBack(
        sql,
        `EXPLAIN (ANALYZE, FORMAT JSON) ${statements.claim}`,
        [now, lease, limit, "token"],
      );
      const all = planNodes(plan);
      assert.equal(plan["Actual Rows"], limit);
      assert.ok(
        !all.some((node) => node["Node Type"] === "Seq Scan"),
        `claim ${limit}: ${JSON.stringify(all.map((node) => node["Node Type"]))}`,
      );
    }
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("postgres: the fast mark's generic plan, made on an empty table, probes the primary key", async () => {
  // A relay prepares its statements once per connection and Postgres soon reuses a generic
  // plan; made while the table was small, a join of the marks to the table was a hash join over
  // a sequential scan of the whole table, kept as the table grew.
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    let nodes: PlanNode[] = [];
    await sql.begin(async (tx) => {
      await tx.unsafe("SET LOCAL plan_cache_mode = force_generic_plan");
      await tx.unsafe(`PREPARE fast_mark(text, text) AS ${statements.markDispatchedFast}`)
        .simple();
      const [row] = await tx.unsafe(
        `EXPLAIN (FORMAT JSON) EXECUTE fast_mark('{"a": [1, "t"]}', '2026-01-01T00:00:00.000Z')`,
      ).simple();
      nodes = planNodes((row["QUERY PLAN"] as Array<{ Plan: PlanNode }>)[0].Plan);
      await tx.unsafe("DEALLOCATE fast_mark").simple();
    });
    assert.ok(
      nodes.some((node) => node["Index Name"] === `${tables.outbox}_pkey`),
      JSON.stringify(nodes.map((node) => node["Node Type"])),
    );
    assert.ok(!nodes.some((node) => node["Node Type"] === "Seq Scan"));
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("sqlite: with 200k dispatched rows the claim reads only the covering claim index", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_plan_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${history})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
      SELECT 'h-' || n, 'event.publish', 'bench', 'bench.s', printf('%.160c', 'x'), '{}', 'dispatched', 1,
             '2020-01-01T00:00:00.000Z', '2020-01-01T00:00:00.000Z' FROM g`);
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${live})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
      SELECT 'l-' || n, 'event.publish', 'bench', 'bench.s', 'x', '{}', 'pending', 0,
             '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z' FROM g`);
    db.exec("ANALYZE");
    const statements = outboxStatements("sqlite", resolveSqlOutboxTables(), false);
    const plan = (text: string) =>
      db.prepare(`EXPLAIN QUERY PLAN ${text}`).all().map((row) =>
        String((row as { detail: string }).detail)
      );
    const claim = plan(statements.claim);
    assert.ok(
      claim.some((detail) => detail.includes("USING COVERING INDEX trellis_outbox_pending_idx")),
      claim.join(" | "),
    );
    assert.ok(
      claim.some((detail) => detail.includes("trellis_outbox_retry_idx")),
      claim.join(" | "),
    );
    assert.ok(
      claim.some((detail) => detail.includes("USING INTEGER PRIMARY KEY")),
      claim.join(" | "),
    );
    assert.ok(!claim.some((detail) => /^SCAN trellis_outbox$/.test(detail)), claim.join(" | "));
    const marks = plan(statements.markMany);
    assert.ok(
      marks.some((detail) => detail.includes("USING INDEX sqlite_autoindex")),
      marks.join(" | "),
    );
    const fast = plan(statements.markDispatchedFast);
    assert.ok(
      fast.some((detail) => detail.includes("USING INDEX sqlite_autoindex")),
      fast.join(" | "),
    );
    assert.ok(!fast.some((detail) => /^SCAN t$/.test(detail)), fast.join(" | "));
    // So does its form for the marks of one claim (the token bound once).
    const oneClaim = plan(statements.markDispatchedOneClaim);
    assert.ok(
      oneClaim.some((detail) => detail.includes("USING INDEX sqlite_autoindex")),
      oneClaim.join(" | "),
    );
    assert.ok(!oneClaim.some((detail) => /^SCAN t$/.test(detail)), oneClaim.join(" | "));
    const prune = plan(statements.prune.dispatched);
    assert.ok(
      prune.some((detail) => detail.includes("trellis_outbox_retention_idx")),
      prune.join(" | "),
    );
    const dead = plan(statements.listDead);
    assert.ok(
      dead.some((detail) => detail.includes("trellis_outbox_retention_idx")),
      dead.join(" | "),
    );
    // And it claims the live rows in order.
    const rows = await executor.query(statements.claim, [
      "2022-01-01T00:00:00.000Z",
      "2022-01-01T00:00:30.000Z",
      3,
      "token",
    ]);
    assert.deepEqual(rows.map((row) => row.id).sort(), ["l-1", "l-2", "l-3"]);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

const backlog = 100_000;

Deno.test("postgres: with 100k failed rows waiting for their retry time the claim reads none of them", async () => {
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    // The backlog is older (lower seq) than the live rows, as after a long outage of one stream.
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error)
       SELECT 'f-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 160), '{}'::jsonb, 'failed', 3,
              now() - interval '1 hour', now(), now() + interval '1 hour' + g * interval '1 ms', 'busy'
       FROM generate_series(1, ${backlog}) AS g`,
    );
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'l-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 160), '{}'::jsonb, 'pending', 0, now(), now()
       FROM generate_series(1, ${live}) AS g`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${o}`);
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    const lease = new Date(Date.now() + 31_000).toISOString();
    const plan = await explainRolledBack(
      sql,
      `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${statements.claim}`,
      [now, lease, 25, "token"],
    );
    const all = planNodes(plan);
    assert.equal(plan["Actual Rows"], 25);
    assert.ok(!all.some((node) => node["Node Type"] === "Seq Scan"), "no sequential scan");
    assert.ok(
      all.some((node) => node["Index Name"] === `${o}_retry_idx`),
      `the due retries come from the retry index: ${
        JSON.stringify(all.map((n) => n["Index Name"]))
      }`,
    );
    const filtered = all.reduce((sum, node) => sum + (node["Rows Removed by Filter"] ?? 0), 0);
    assert.ok(filtered < 100, `the claim filtered out ${filtered} rows (waiting retries read)`);
    const locking = all.filter((node) => node["Node Type"] === "LockRows")
      .reduce(
        (sum, node) => sum + (node["Shared Hit Blocks"] ?? 0) + (node["Shared Read Blocks"] ?? 0),
        0,
      );
    assert.ok(locking < 100, `finding the rows touched ${locking} buffers`);
    console.log(
      `claim of 25 with ${backlog} failed rows waiting: finding the rows touched ${locking} buffers`,
    );
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("sqlite: with 100k failed rows waiting for their retry time the claim reads none of them", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_plan_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${backlog})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at)
      SELECT 'f-' || n, 'event.publish', 'bench', 'bench.s', 'x', '{}', 'failed', 3,
             '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z', '2030-01-01T00:00:00.000Z' FROM g`);
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${live})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
      SELECT 'l-' || n, 'event.publish', 'bench', 'bench.s', 'x', '{}', 'pending', 0,
             '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z' FROM g`);
    db.exec("ANALYZE");
    const statements = outboxStatements("sqlite", resolveSqlOutboxTables(), false);
    const plan = db.prepare(`EXPLAIN QUERY PLAN ${statements.claim}`).all().map((row) =>
      String((row as { detail: string }).detail)
    );
    assert.ok(plan.some((d) => d.includes("trellis_outbox_retry_idx")), plan.join(" | "));
    assert.ok(plan.some((d) => d.includes("trellis_outbox_pending_idx")), plan.join(" | "));
    assert.ok(!plan.some((detail) => /^SCAN trellis_outbox$/.test(detail)), plan.join(" | "));
    const rows = await executor.query(statements.claim, [
      "2022-01-01T00:00:00.000Z",
      "2022-01-01T00:00:30.000Z",
      3,
      "token",
    ]);
    assert.deepEqual(rows.map((row) => row.id).sort(), ["l-1", "l-2", "l-3"]);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
