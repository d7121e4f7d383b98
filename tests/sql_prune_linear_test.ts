/**
 * A Postgres prune batch's DELETE (outbox and inbox) does work linear in its size on every plan: a
 * generic plan made while the table was empty, custom and generic plans made before and after
 * ANALYZE. Asserted on the plan's own row counts (EXPLAIN ANALYZE), never on time: the rows
 * each node on the table read (returned and removed by its filters), times the batch size when
 * its filter searches an array parameter (`= ANY ($n)`, searched element by element for each
 * row), plus the rows a join filter compared. Deleting the batch's ids as `id = ANY(ARRAY(...))`
 * over the range it spans, a batch of 10,000 compared 10,000 x 10,000.
 */

import assert from "node:assert/strict";
import type postgres from "postgres";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import {
  explainRolledBack,
  modifyingNodes,
  type PlanNode,
  readsTable,
  rowsRead,
} from "./sql/plan.ts";
import { openPostgresTables } from "./sql/postgres_tables.ts";

const rows = 50_000;
const batchSize = 10_000;

/**
 * The comparisons and row reads the DELETE of `plan` did on `table` (see the module's comment).
 */
function work(plan: PlanNode, table: string): { total: number; nodes: string[] } {
  let total = 0;
  const nodes: string[] = [];
  for (const node of modifyingNodes(plan)) {
    if (readsTable(node, table)) {
      const read = rowsRead(node);
      const searches = /= ANY \(\$\d+\)/.test(String(node.Filter ?? ""));
      total += searches ? read * batchSize : read;
      nodes.push(`${node["Node Type"]} read ${read}${searches ? " searching the batch" : ""}`);
    }
    if (node["Join Filter"] !== undefined) {
      const compared = (Number(node["Actual Rows"]) +
        Number(node["Rows Removed by Join Filter"] ?? 0)) * Number(node["Actual Loops"] ?? 1);
      total += compared;
      nodes.push(`${node["Node Type"]} join filter compared ${compared}`);
    }
  }
  return { total, nodes };
}

/** EXPLAIN ANALYZE of one batch of `batchSize` (rolled back) of the prepared statement `name`. */
function explainBatch(sql: postgres.Sql, name: string, cutoff: string): Promise<PlanNode> {
  return explainRolledBack(
    sql,
    `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ${name}('${cutoff}', ${batchSize})`,
    [],
  );
}

async function checkLinear(
  which: "outbox" | "inbox",
  fill: (table: string) => string,
): Promise<void> {
  await using pg = await openPostgresTables();
  const { admin: sql, tables } = pg;
  const table = tables[which];
  await sql.unsafe(`ALTER TABLE ${table} SET (autovacuum_enabled = false)`);
  const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
  const statement = which === "outbox" ? statements.prune.dispatched : statements.inboxPrune;
  const cutoff = new Date(Date.now() - 3_600_000).toISOString();
  await sql.unsafe("SET plan_cache_mode = force_generic_plan");
  await sql.unsafe(`PREPARE empty(text, bigint) AS ${statement}`);
  await sql.unsafe(`EXECUTE empty('${cutoff}', ${batchSize})`);
  await sql.unsafe(fill(table));
  const plans: [string, PlanNode][] = [];
  plans.push(["generic plan made on the empty table", await explainBatch(sql, "empty", cutoff)]);
  await sql.unsafe("SET plan_cache_mode = force_custom_plan");
  plans.push(["custom plan before ANALYZE", await explainBatch(sql, "empty", cutoff)]);
  await sql.unsafe("SET plan_cache_mode = force_generic_plan");
  await sql.unsafe(`PREPARE filled(text, bigint) AS ${statement}`);
  plans.push(["generic plan made before ANALYZE", await explainBatch(sql, "filled", cutoff)]);
  await sql.unsafe(`ANALYZE ${table}`);
  await sql.unsafe(`PREPARE analyzed(text, bigint) AS ${statement}`);
  plans.push(["generic plan made after ANALYZE", await explainBatch(sql, "analyzed", cutoff)]);
  await sql.unsafe("SET plan_cache_mode = force_custom_plan");
  plans.push(["custom plan after ANALYZE", await explainBatch(sql, "analyzed", cutoff)]);
  for (const [mode, plan] of plans) {
    const { total, nodes } = work(plan, table);
    // The batch's rows (and its ties), read once.
    assert.ok(
      total <= 2 * batchSize,
      `${which}, ${mode}: a batch of ${batchSize} did ${total} reads and comparisons (${
        nodes.join("; ")
      })`,
    );
  }
}

Deno.test("postgres: an outbox prune batch of 10,000 does work linear in its size, on a plan made on an empty outbox and after ANALYZE", async () => {
  await checkLinear(
    "outbox",
    (o) =>
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'h-' || g, 'event.publish', 'old', 'orders.old', 'x', '{}'::jsonb, 'dispatched', 1,
              now() - interval '2 days', now() - interval '2 days' + (g / 7) * interval '1 ms'
       FROM generate_series(1, ${rows}) AS g`,
  );
});

Deno.test("postgres: an inbox prune batch of 10,000 does work linear in its size, on a plan made on an empty inbox and after ANALYZE", async () => {
  await checkLinear(
    "inbox",
    (inbox) =>
      `INSERT INTO ${inbox} (consumer, message_id, received_at)
       SELECT 'c' || (g % 3), 'm-' || g, now() - interval '2 days' + (g / 7) * interval '1 ms'
       FROM generate_series(1, ${rows}) AS g`,
  );
});
