/**
 * Ordering keys keep claims constant-cost: with many keys and a long backlog behind every head
 * (and a blocked key with a large backlog), a claim reads heads only, through the claim index,
 * and the check for unfinished hand-overs reads the small held-heads index. Asserted on the
 * plan and on the buffers Postgres touched (EXPLAIN ANALYZE, BUFFERS), and on SQLite's plan.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, nodeSqliteExecutor, postgresJsExecutor } from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { postgresUrl } from "./kit/mod.ts";
import { explainRolledBack, type PlanNode, planNodes } from "./sql/plan.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

const keys = 2_000;
const waitingPerKey = 50;

Deno.test("postgres: with 2,000 keys x 50 waiting messages, a claim reads heads only", async () => {
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    // First (lowest seq) a key blocked by a dead head with a backlog of 100,000; then per key a
    // head and `waitingPerKey` waiting rows.
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT 'blocked-' || i, 'event.publish', 'b', 'b.s', repeat('x', 160), '{}'::jsonb, CASE WHEN i = 0 THEN 'dead' ELSE 'pending' END, 0, now(), now(), 'blocked', i = 0
       FROM generate_series(0, ${keys * waitingPerKey}) AS i`,
    );
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT 'm-' || k || '-' || i, 'event.publish', 'b', 'b.s', repeat('x', 160), '{}'::jsonb, 'pending', 0, now(), now(), 'key-' || k, i = 0
       FROM generate_series(0, ${waitingPerKey}) AS i, generate_series(1, ${keys}) AS k ORDER BY i, k`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${o}`);
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    const lease = new Date(Date.now() + 31_000).toISOString();
    const plan = await explainRolledBack(
      sql,
      `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${statements.claim}`,
      [now, lease, 100, "plan-token"],
    );
    const all = planNodes(plan);
    assert.equal(plan["Actual Rows"], 100);
    assert.ok(all.some((node) => node["Index Name"] === `${o}_pending_idx`), "pending index");
    assert.ok(all.some((node) => node["Index Name"] === `${o}_key_held_idx`), "held-heads index");
    assert.ok(!all.some((node) => node["Node Type"] === "Seq Scan"), "no sequential scan");
    const locking = all.find((node) => node["Node Type"] === "LockRows")!;
    const buffers = (node: PlanNode) =>
      (node["Shared Hit Blocks"] ?? 0) + (node["Shared Read Blocks"] ?? 0);
    // 200,000 waiting rows live in thousands of pages; finding and locking 100 heads touches
    // a few pages per head (index, heap, lock), whatever the backlog.
    const [{ pages }] = await sql.unsafe(
      `SELECT relpages::int AS pages FROM pg_class WHERE relname = '${o}'`,
    );
    assert.ok(pages > 5_000, `the table has ${pages} pages`);
    assert.ok(buffers(locking) < 400, `finding the heads touched ${buffers(locking)} buffers`);
    const [stats] = await sql.unsafe(
      `SELECT count(*)::int AS n FROM ${o} WHERE NOT key_head AND state = 'pending'`,
    );
    assert.equal(stats.n, keys * waitingPerKey * 2);
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("sqlite: the claim reads the covering pending index; the hand-over check the held-heads index", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_order_plan_" });
  const db = openSqlite(`${dir}/o.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    db.exec(`WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < 20000)
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
      SELECT 'm-' || i, 'event.publish', 'b', 'b.s', 'x', '{}', 'pending', 0, '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z', 'key-' || (i % 100), i < 100 FROM g`);
    db.exec("ANALYZE");
    const statements = outboxStatements("sqlite", resolveSqlOutboxTables(), false);
    const plan = db.prepare(`EXPLAIN QUERY PLAN ${statements.claim}`).all().map((row) =>
      String((row as { detail: string }).detail)
    );
    assert.ok(
      plan.some((detail) => detail.includes("USING COVERING INDEX trellis_outbox_pending_idx")),
      plan.join(" | "),
    );
    assert.ok(!plan.some((detail) => /^SCAN trellis_outbox$/.test(detail)), plan.join(" | "));
    // Whether hand-overs are due is asked after the claim, once (not in every returned row).
    const stale = db.prepare(`EXPLAIN QUERY PLAN ${statements.staleHeads}`).all().map((row) =>
      String((row as { detail: string }).detail)
    );
    assert.ok(
      stale.some((detail) => detail.includes("trellis_outbox_key_held_idx")),
      stale.join(" | "),
    );
    assert.ok(!stale.some((detail) => /^SCAN trellis_outbox$/.test(detail)), stale.join(" | "));
    const rows = await executor.query(statements.claim, [
      "2022-01-01T00:00:00.000Z",
      "2022-01-01T00:00:30.000Z",
      500,
      "plan-token",
    ]);
    assert.equal(rows.length, 100, "one head per key");
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
