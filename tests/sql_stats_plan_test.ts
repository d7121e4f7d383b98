/**
 * `stats` must count the active rows without reading the dispatched history: with 200,000
 * dispatched rows kept, it reads the pending heads, the waiting rows and the claimed and failed
 * rows through the partial indexes of version 3 (`pending_idx`, `key_next_idx`, `retry_idx`), on
 * version 5 tables (the claim index still there) and on version 6 tables (dropped): asserted on
 * the plan and, on Postgres, on the rows and buffers each scan actually read (EXPLAIN ANALYZE,
 * BUFFERS), never on time. The dispatched and dead counts read the retention index (its
 * dispatched entries: that count is what the caller asked for). On Postgres the generic plan a
 * relay's prepared statement gets on a still empty outbox reads the same indexes.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, nodeSqliteExecutor, postgresJsExecutor } from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { postgresUrl } from "./kit/mod.ts";
import { explainRolledBack, type PlanNode, planNodes, rowsRead } from "./sql/plan.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

const history = 200_000;
// Live rows: 10 keys with 100 pending messages each (10 heads, 990 waiting), 100 failed rows
// waiting for their retry.
const keys = 10;
const perKey = 100;
const failed = 100;
const live = keys * perKey + failed;
const expected = {
  pending: keys * perKey,
  claimed: 0,
  failed,
  dispatched: history,
  dead: 0,
  due: keys,
};

Deno.test("postgres: with 200k dispatched rows stats reads the active rows through the partial indexes", async () => {
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables, to: 5 });
    const o = tables.outbox;
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'h-' || g, 'event.publish', 'bench', 'bench.s', repeat('x', 160), '{}'::jsonb, 'dispatched', 1,
              now() - interval '1 day', now() - interval '1 day'
       FROM generate_series(1, ${history}) AS g`,
    );
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT 'k-' || g, 'event.publish', 'bench', 'bench.s', 'x', '{}'::jsonb, 'pending', 0, now(), now(),
              'key-' || (g % ${keys}), g <= ${keys}
       FROM generate_series(1, ${keys * perKey}) AS g`,
    );
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at)
       SELECT 'f-' || g, 'event.publish', 'bench', 'bench.s', 'x', '{}'::jsonb, 'failed', 1, now(), now(),
              now() + interval '1 hour'
       FROM generate_series(1, ${failed}) AS g`,
    );
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    for (const version of [5, 6]) {
      await migrate(executor, { dialect: "postgres", tables, to: version });
      await sql.unsafe(`VACUUM ANALYZE ${o}`);
      const plan = await explainRolledBack(
        sql,
        `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${statements.stats}`,
        [now],
      );
      const all = planNodes(plan);
      const scans = all.filter((node) => node["Relation Name"] === o);
      const names = JSON.stringify(scans.map((node) => [node["Node Type"], node["Index Name"]]));
      assert.ok(!all.some((node) => node["Node Type"].includes("Seq Scan")), names);
      for (const index of ["pending_idx", "key_next_idx", "retry_idx"]) {
        assert.ok(
          scans.some((node) => node["Index Name"] === `${o}_${index}`),
          `${index}: ${names}`,
        );
      }
      // Every scan but the dispatched count reads live rows only, a few pages of them.
      const active = scans.filter((node) => node["Index Name"] !== `${o}_retention_idx`);
      const read = active.reduce((sum, node) => sum + rowsRead(node), 0);
      assert.ok(read <= live, `version ${version}: the active counts read ${read} rows: ${names}`);
      const buffers = active.reduce((sum, node) => sum + buffersOf(node), 0);
      // (The table has ~6,700 pages; reading the active rows measured about 60.)
      assert.ok(buffers < 300, `version ${version}: the active counts touched ${buffers} buffers`);
      const [row] = await sql.unsafe(statements.stats, [now]);
      assert.deepEqual(
        Object.fromEntries(Object.keys(expected).map((key) => [key, Number(row[key])])),
        expected,
      );
      console.log(
        `stats with ${history} dispatched rows, version ${version}: active counts ${buffers} buffers, ${read} rows; whole statement ${
          buffersOf(plan)
        } buffers`,
      );
    }
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("postgres: stats' generic plan, made on an empty table, reads the partial indexes", async () => {
  // A relay prepares its statements once per connection and Postgres soon reuses a generic plan,
  // which may be made while the outbox is still empty.
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    let nodes: PlanNode[] = [];
    await sql.begin(async (tx) => {
      await tx.unsafe("SET LOCAL plan_cache_mode = force_generic_plan");
      await tx.unsafe(`PREPARE outbox_stats(text) AS ${statements.stats}`).simple();
      const [row] = await tx.unsafe(
        `EXPLAIN (FORMAT JSON) EXECUTE outbox_stats('2026-01-01T00:00:00.000Z')`,
      ).simple();
      nodes = planNodes((row["QUERY PLAN"] as Array<{ Plan: PlanNode }>)[0].Plan);
      await tx.unsafe("DEALLOCATE outbox_stats").simple();
    });
    const names = JSON.stringify(nodes.map((node) => [node["Node Type"], node["Index Name"]]));
    assert.ok(!nodes.some((node) => node["Node Type"].includes("Seq Scan")), names);
    for (const index of ["pending_idx", "key_next_idx", "retry_idx"]) {
      assert.ok(nodes.some((node) => node["Index Name"] === `${o}_${index}`), `${index}: ${names}`);
    }
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

function buffersOf(node: PlanNode): number {
  return (node["Shared Hit Blocks"] ?? 0) + (node["Shared Read Blocks"] ?? 0);
}

Deno.test("sqlite: with 200k dispatched rows stats reads the active rows through the partial indexes", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_plan_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite", to: 5 });
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${history})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
      SELECT 'h-' || n, 'event.publish', 'bench', 'bench.s', printf('%.160c', 'x'), '{}', 'dispatched', 1,
             '2020-01-01T00:00:00.000Z', '2020-01-01T00:00:00.000Z' FROM g`);
    db.exec(
      `WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${keys * perKey})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
      SELECT 'k-' || n, 'event.publish', 'bench', 'bench.s', 'x', '{}', 'pending', 0,
             '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z', 'key-' || (n % ${keys}), n <= ${keys} FROM g`,
    );
    db.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ${failed})
      INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at)
      SELECT 'f-' || n, 'event.publish', 'bench', 'bench.s', 'x', '{}', 'failed', 1,
             '2021-01-01T00:00:00.000Z', '2021-01-01T00:00:00.000Z', '2030-01-01T00:00:00.000Z' FROM g`);
    const statements = outboxStatements("sqlite", resolveSqlOutboxTables(), false);
    // Without statistics and with them (ANALYZE, or PRAGMA optimize in the application).
    for (const [version, analyze] of [[5, false], [6, false], [5, true], [6, true]] as const) {
      await migrate(executor, { dialect: "sqlite", to: version });
      if (analyze) db.exec("ANALYZE");
      const plan = db.prepare(`EXPLAIN QUERY PLAN ${statements.stats}`).all().map((row) =>
        String((row as { detail: string }).detail)
      );
      const text = `version ${version}, analyze ${analyze}: ${plan.join(" | ")}`;
      for (const index of ["pending_idx", "key_next_idx", "retry_idx"]) {
        assert.ok(plan.some((detail) => detail.includes(`trellis_outbox_${index}`)), text);
      }
      // A scan of the table (or of an index over every row, or of the claim index) is not.
      assert.ok(
        plan.every((detail) =>
          !/^SCAN trellis_outbox( |$)/.test(detail) ||
          /USING (COVERING )?INDEX trellis_outbox_(pending|key_next|retry|key_held)_idx$/
            .test(detail)
        ),
        text,
      );
      const row = db.prepare(statements.stats).get("2022-01-01T00:00:00.000Z") as Record<
        string,
        unknown
      >;
      assert.deepEqual(
        Object.fromEntries(Object.keys(expected).map((key) => [key, Number(row[key])])),
        expected,
      );
    }
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
