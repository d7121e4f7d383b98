/**
 * A `claimed` or `failed` row without a due time (`next_attempt_at` NULL: an operator's "retry
 * now" UPDATE, or a row left so by another writer) is due: version 2's claim took it, `stats()`
 * counts it as due, and the memory and KV stores claim such messages. The version 3 claim
 * (pending scan + due-time scan) read only rows with a due time, so such a row was never
 * claimed again while `stats()` kept reporting it due: a message stuck for good. Real Postgres
 * (both drivers) and a real SQLite file; on Postgres the extra scan must stay an index probe
 * whatever the column statistics suggest (the table is never scanned).
 */

import assert from "node:assert/strict";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import {
  migrate,
  nodeSqliteExecutor,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { postgresUrl } from "./kit/mod.ts";
import { explainRolledBack, planNodes } from "./sql/plan.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

const record = (id: string) => ({
  id,
  kind: "event.publish" as const,
  name: "n",
  subject: "s.a",
  payload: "{}",
  headers: {},
});

/** A failed row and a claimed row, both with their due time set to NULL by hand. */
async function strandWithoutDueTime(
  executor: SqlExecutor,
  dialect: "postgres" | "sqlite",
  tables: SqlOutboxTables,
): Promise<void> {
  const outbox = new SqlOutboxRepository(executor, dialect, tables);
  await outbox.enqueueMany([record("failed-1"), record("claimed-1")]);
  const now = new Date();
  const claimed = await outbox.claimDue(2, now);
  assert.equal(claimed.length, 2);
  const failed = claimed.find((message) => message.id === "failed-1")!;
  assert.equal(
    await outbox.markFailed(failed, {
      error: "busy",
      nextAttemptAt: new Date(now.getTime() + 3_600_000),
      now,
    }),
    true,
  );
  await executor.query(
    `UPDATE ${tables.outbox} SET next_attempt_at = NULL WHERE id IN ('failed-1', 'claimed-1')`,
    [],
  );
  const later = new Date(now.getTime() + 1_000);
  const stats = await outbox.stats(later);
  assert.equal(stats.due, 2, "stats() counts rows without a due time as due");
  const again = await outbox.claimDue(10, later);
  assert.deepEqual(
    again.map((message) => [message.id, message.attempts]).sort(),
    [["claimed-1", 2], ["failed-1", 2]],
    "the claim takes the rows stats() reports due",
  );
  assert.equal((await outbox.stats(later)).due, 0);
}

const postgresDrivers = [
  {
    name: "postgres.js",
    open: (url: string) => {
      const sql = postgres(url, { max: 2, onnotice: () => {} });
      return { executor: postgresJsExecutor(sql), end: () => sql.end() };
    },
  },
  {
    name: "node-postgres",
    open: (url: string) => {
      const pool = new pg.Pool({ connectionString: url, max: 2 });
      return { executor: pgExecutor(pool), end: () => pool.end() };
    },
  },
];

for (const driver of postgresDrivers) {
  Deno.test(`postgres (${driver.name}): claimed and failed rows without a due time are claimed`, async () => {
    const { executor, end } = driver.open(await postgresUrl());
    const tables = uniqueTables();
    try {
      await migrate(executor, { dialect: "postgres", tables });
      await strandWithoutDueTime(executor, "postgres", tables);
    } finally {
      await dropPostgresTables(executor, tables);
      await end();
    }
  });
}

Deno.test("sqlite: claimed and failed rows without a due time are claimed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_null_due_" });
  const db = openSqlite(`${dir}/outbox.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    await strandWithoutDueTime(executor, "sqlite", {
      outbox: "trellis_outbox",
      inbox: "trellis_inbox",
    });
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("postgres: finding rows without a due time is an index probe, never a table scan", async () => {
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    // Half the rows are pending (no due time), three quarters claimed or failed (with one): a
    // planner that estimates "claimed or failed without a due time" from the two columns'
    // statistics alone expects thousands of such rows and prefers a sequential scan.
    for (
      const [prefix, state, next] of [
        ["f", "failed", "now() + interval '1 hour'"],
        ["c", "claimed", "now() - interval '1 minute'"],
        ["r", "failed", "now() - interval '1 minute'"],
        ["p", "pending", "NULL"],
      ]
    ) {
      await sql.unsafe(
        `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at)
         SELECT '${prefix}-' || g, 'event.publish', 'n', 's.a', '{}', '{}'::jsonb, '${state}', 1, now(), now(), ${next}
         FROM generate_series(1, 25000) AS g`,
      );
    }
    await sql.unsafe(`VACUUM ANALYZE ${o}`);
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const plan = await explainRolledBack(
      sql,
      `EXPLAIN (FORMAT JSON) ${statements.claim}`,
      [
        new Date().toISOString(),
        new Date(Date.now() + 30_000).toISOString(),
        100,
        "t",
      ],
    );
    const all = planNodes(plan);
    assert.ok(
      !all.some((node) => node["Node Type"] === "Seq Scan"),
      `no sequential scan: ${JSON.stringify(all.map((node) => node["Node Type"]))}`,
    );
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});
