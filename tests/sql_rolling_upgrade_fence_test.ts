/**
 * The claim token fence during a rolling upgrade: a version 2 library process (its claim
 * statement, verbatim, which does not know `claim_token` and leaves it as it is) shares the
 * table with version 3 processes. The fence compares `attempts` too for that case, but a
 * requeue resets `attempts` to 0 and kept the token of the claim before it: the old process's
 * first claim after the requeue then looked exactly like the version 3 claim before it (same
 * token, attempts 1), and that claim's late retry of its `markDead` (its first reply lost)
 * killed the message the old process had just claimed to publish again. A requeue ends every
 * earlier claim, so it clears the token. Real Postgres and a real SQLite file.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  migrate,
  nodeSqliteExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

/** The claim statement of the version 2 library (commit 102eb99), `$1` now, `$2` lease, `$3` limit. */
function v2Claim(dialect: "postgres" | "sqlite", o: string): string {
  return dialect === "postgres"
    ? `UPDATE ${o} AS t SET state = 'claimed', attempts = t.attempts + 1, updated_at = $1::timestamptz, next_attempt_at = $2::timestamptz WHERE t.id = ANY(ARRAY(SELECT id FROM ${o} WHERE state IN ('pending', 'claimed', 'failed') AND (next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz) ORDER BY seq LIMIT $3::int FOR UPDATE SKIP LOCKED)) RETURNING t.id, t.attempts`
    : `UPDATE ${o} SET state = 'claimed', attempts = attempts + 1, updated_at = ?1, next_attempt_at = ?2 WHERE seq IN (SELECT seq FROM ${o} WHERE state IN ('pending', 'claimed', 'failed') AND (next_attempt_at IS NULL OR next_attempt_at <= ?1) ORDER BY seq LIMIT ?3) RETURNING id, attempts`;
}

async function lateRetryAfterRequeue(
  executor: SqlExecutor,
  dialect: "postgres" | "sqlite",
  tables: SqlOutboxTables,
  via: "requeue" | "unblockKey" = "requeue",
): Promise<void> {
  const outbox = new SqlOutboxRepository(executor, dialect, tables);
  await outbox.enqueue({
    id: "m",
    kind: "event.publish",
    name: "n",
    subject: "s.a",
    payload: "{}",
    headers: {},
    ...(via === "unblockKey" ? { orderingKey: "k" } : {}),
  });
  const now = new Date();
  // A version 3 process claims and dead-letters the message (a permanent refusal); the reply
  // of its markDead is lost, so it will send the same mark again shortly.
  const [claim] = await outbox.claimDue(1, now);
  assert.equal(claim.attempts, 1);
  assert.equal(await outbox.markDead(claim, { error: "refused", now }), true);
  // Meanwhile an operator requeues it, and a version 2 process claims it to publish it again.
  if (via === "requeue") assert.equal(await outbox.requeue(["m"], now), 1);
  else assert.equal(await outbox.unblockKey("k", { action: "retry", now }), true);
  const later = new Date(now.getTime() + 1_000);
  const old = await executor.query(v2Claim(dialect, tables.outbox), [
    later.toISOString(),
    new Date(later.getTime() + 30_000).toISOString(),
    10,
  ]);
  assert.deepEqual(old.map((row) => [row.id, Number(row.attempts)]), [["m", 1]]);
  // The version 3 process's retried mark belongs to a claim the requeue ended.
  assert.equal(
    await outbox.markDead(claim, { error: "refused", now: later }),
    false,
    "a mark of a claim from before the requeue is superseded",
  );
  assert.equal((await outbox.get("m"))?.state, "claimed", "the old process keeps its claim");
}

Deno.test("postgres: a requeue ends the claims before it, also for a version 2 claimer", async () => {
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  const tables = uniqueTables();
  try {
    await migrate(executor, { dialect: "postgres", tables });
    await lateRetryAfterRequeue(executor, "postgres", tables);
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("sqlite: a requeue ends the claims before it, also for a version 2 claimer", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_rolling_" });
  const db = openSqlite(`${dir}/outbox.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    await lateRetryAfterRequeue(executor, "sqlite", {
      outbox: "trellis_outbox",
      inbox: "trellis_inbox",
    });
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("postgres and sqlite: unblockKey retry ends the claims before it, as requeue does", async () => {
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  const tables = uniqueTables();
  const dir = await Deno.makeTempDir({ prefix: "outbox_rolling_" });
  const db = openSqlite(`${dir}/outbox.db`);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    await lateRetryAfterRequeue(executor, "postgres", tables, "unblockKey");
    const lite = nodeSqliteExecutor(db);
    await migrate(lite, { dialect: "sqlite" });
    await lateRetryAfterRequeue(lite, "sqlite", {
      outbox: "trellis_outbox",
      inbox: "trellis_inbox",
    }, "unblockKey");
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
