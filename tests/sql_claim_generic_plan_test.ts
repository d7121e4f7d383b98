/**
 * The Postgres claim must not be planned again on every execution. As a prepared statement with
 * `LIMIT $3`, Postgres judged every generic plan dearer than its custom plans (it cannot know
 * the limit) and planned each claim anew, ~1 ms of server CPU per claim in the relay. With the
 * limit written into the text (claim_limits.ts) it keeps a generic plan after five claims.
 * Asserted on `pg_prepared_statements` of the relay's own connection (Postgres 14+ counts the
 * plans).
 */

import assert from "node:assert/strict";
import type postgres from "postgres";
import { type OutboxRecord, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { maxWrittenLimits } from "../src/stores/sql/claim_limits.ts";
import { openPostgresTables } from "./sql/postgres_tables.ts";

function records(count: number, from = 0): OutboxRecord[] {
  return Array.from({ length: count }, (_, k) => ({
    id: `m-${from + k}`,
    kind: "event.publish" as const,
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ n: from + k }),
    headers: {},
  }));
}

interface ClaimPlans {
  statement: string;
  generic: number;
  custom: number;
}

/** The claim statements prepared on `sql`'s (single) connection, and how they were planned. */
async function claimPlans(sql: postgres.Sql): Promise<ClaimPlans[]> {
  const rows = await sql.unsafe(
    `SELECT statement, generic_plans::int AS generic, custom_plans::int AS custom
     FROM pg_prepared_statements WHERE statement LIKE '%SET state = ''claimed''%'`,
  );
  return rows.map((row) => ({
    statement: String(row.statement),
    generic: Number(row.generic),
    custom: Number(row.custom),
  }));
}

Deno.test("postgres: the relay's claim keeps a generic plan instead of planning every claim", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const relaySql = pg.connect();
  // A backlog large enough that a tenth of it (the generic plan's guess at the limit) is far
  // more than a claim takes; analyzed, as autovacuum would.
  const producer = new SqlOutboxRepository(postgresJsExecutor(admin), "postgres", tables);
  for (let from = 0; from < 5_000; from += 1_000) {
    await producer.enqueueMany(records(1_000, from));
  }
  await admin.unsafe(`ANALYZE ${tables.outbox}`);
  const relay = new SqlOutboxRepository(postgresJsExecutor(relaySql), "postgres", tables);
  // 20 claims of 2 (40 rows: below the first plan generation's 64, so one statement text).
  for (let i = 0; i < 20; i++) {
    const claimed = await relay.claimDue(2, new Date());
    assert.equal(claimed.length, 2);
    assert.deepEqual(claimed.map((m) => m.id), [`m-${2 * i}`, `m-${2 * i + 1}`]);
  }
  const plans = await claimPlans(relaySql);
  const executions = plans.reduce((sum, p) => sum + p.generic + p.custom, 0);
  assert.equal(executions, 20, JSON.stringify(plans));
  const custom = plans.reduce((sum, p) => sum + p.custom, 0);
  assert.ok(
    custom <= 5,
    `${custom} of 20 claims were planned anew (custom plans): ${JSON.stringify(plans)}`,
  );
});

Deno.test("postgres: claims with many different limits prepare a bounded number of claim statements", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const relaySql = pg.connect();
  await new SqlOutboxRepository(postgresJsExecutor(admin), "postgres", tables)
    .enqueueMany(records(60));
  const relay = new SqlOutboxRepository(postgresJsExecutor(relaySql), "postgres", tables);
  // Limits 1..10: 55 rows claimed, oldest first, whichever statement each limit takes.
  let next = 0;
  for (let limit = 1; limit <= 10; limit++) {
    const claimed = await relay.claimDue(limit, new Date());
    assert.deepEqual(
      claimed.map((m) => m.id),
      Array.from({ length: limit }, (_, k) => `m-${next + k}`),
    );
    next += limit;
  }
  assert.equal((await relay.claimDue(10, new Date())).length, 5);
  const plans = await claimPlans(relaySql);
  // The first limits written in, and the claim with the limit as a parameter for the others.
  assert.equal(plans.length, maxWrittenLimits + 1, JSON.stringify(plans.map((p) => p.statement)));
});
