/**
 * Postgres enqueueMany against enqueueMany: two producers' batches must never wait for each other
 * in a cycle (a "deadlock detected" aborts a producer's business transaction), whatever the order
 * of their records. The old statement inserted a batch's rows in batch order, so two batches that
 * gave the same new keys their heads in opposite orders each held an uncommitted entry of the
 * unique head index the other waited for.
 *
 * Each interleaving is built step by step: a third transaction C holds an uncommitted entry that
 * batch A reaches in the middle of its rows, so A stops there holding the entries before it; then
 * batch B runs until it waits for A (or, taking its entries in the same order as A, finishes);
 * then C rolls back and A goes on. Batch order, A took A's entries past B's, and B held one A
 * needs: a deadlock, every time.
 *
 * @module
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  migrate,
  type OutboxRecord,
  postgresJsExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";
import { backendPid, settledOrWaiting } from "./sql/lock_waits.ts";

function record(id: string, key?: string): OutboxRecord {
  const r: OutboxRecord = {
    id,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ id }),
    headers: {},
  };
  if (key !== undefined) r.orderingKey = key;
  return r;
}

function outcome(result: PromiseSettledResult<unknown>): string {
  if (result.status === "fulfilled") return "ok";
  const error = result.reason as { code?: string; message?: string };
  return `${error?.code ?? "error"}: ${error?.message}`;
}

/**
 * Runs C's enqueue (held open), then A's batch until it waits for C, then B's batch until it
 * waits or finishes, then rolls C back; resolves with A's and B's outcomes.
 */
async function interleave(
  url: string,
  tables: SqlOutboxTables,
  c: OutboxRecord,
  a: OutboxRecord[],
  b: OutboxRecord[],
): Promise<string[]> {
  const admin = postgres(url, { max: 1, onnotice: () => {} });
  const aSql = postgres(url, { max: 1, onnotice: () => {} });
  const bSql = postgres(url, { max: 1, onnotice: () => {} });
  const cSql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const [aPid, bPid] = [await backendPid(aSql), await backendPid(bSql)];
    const cHolds = Promise.withResolvers<void>();
    const cEnd = Promise.withResolvers<void>();
    const cDone = cSql.begin(async (tx) => {
      await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables).enqueue(c);
      cHolds.resolve();
      await cEnd.promise;
      throw new Error("C rolls back");
    }).catch(() => {});
    await cHolds.promise;
    const aDone = aSql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables).enqueueMany(a)
    );
    aDone.catch(() => {});
    assert.equal(await settledOrWaiting(admin, aPid, aDone), true, "A waits for C");
    const bDone = bSql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables).enqueueMany(b)
    );
    bDone.catch(() => {});
    await settledOrWaiting(admin, bPid, bDone);
    cEnd.resolve();
    await cDone;
    return (await Promise.allSettled([aDone, bDone])).map(outcome);
  } finally {
    await Promise.all([admin.end(), aSql.end(), bSql.end(), cSql.end()]);
  }
}

/** The table's rows as `id:seq-rank:head` in seq order, per key (unkeyed under ""). */
async function rowsByKey(
  sql: postgres.Sql,
  tables: SqlOutboxTables,
): Promise<Record<string, string[]>> {
  const rows = await sql.unsafe(
    `SELECT id, coalesce(ordering_key, '') AS k, key_head FROM ${tables.outbox} ORDER BY seq`,
  );
  const out: Record<string, string[]> = {};
  for (const row of rows) (out[row.k] ??= []).push(`${row.id}${row.key_head ? "*" : ""}`);
  return out;
}

Deno.test("postgres: two enqueueMany giving new keys their heads in opposite orders never deadlock", async () => {
  const url = await postgresUrl();
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
    // A = [k1, k3, k2] stops at k3 (C's uncommitted head); B = [k2, k1].
    const outcomes = await interleave(
      url,
      tables,
      record("c3", "k3"),
      [record("a1", "k1"), record("a3", "k3"), record("a2", "k2")],
      [record("b2", "k2"), record("b1", "k1")],
    );
    assert.deepEqual(outcomes, ["ok", "ok"]);
    // A committed first (B waited for it at its first key): A's rows head their keys, B's wait
    // behind them; A's rows are numbered in key order.
    assert.deepEqual(await rowsByKey(sql, tables), {
      k1: ["a1*", "b1"],
      k2: ["a2*", "b2"],
      k3: ["a3*"],
    });
    const seqs = await sql.unsafe(
      `SELECT id FROM ${tables.outbox} WHERE id LIKE 'a%' ORDER BY seq`,
    );
    assert.deepEqual(seqs.map((row) => row.id), ["a1", "a2", "a3"]);
  } finally {
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.end();
  }
});

Deno.test("postgres: a batch is numbered in key order, each key's rows (and the unkeyed ones, last) in batch order", async () => {
  const url = await postgresUrl();
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
    const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables);
    await outbox.enqueue(record("z0", "kz"));
    // Key order (ka, km, kz, unkeyed) differs from the batch's; kz has a head, so its rows go in
    // with the first round; ka's second row waits for its head's round.
    await outbox.enqueueMany([
      record("z9", "kz"),
      record("a5", "ka"),
      record("u3"),
      record("z1", "kz"),
      record("m7", "km"),
      record("a2", "ka"),
      record("u0"),
    ]);
    assert.deepEqual(await rowsByKey(sql, tables), {
      kz: ["z0*", "z9", "z1"],
      ka: ["a5*", "a2"],
      km: ["m7*"],
      "": ["u3*", "u0*"],
    });
    const order = await sql.unsafe(
      `SELECT id FROM ${tables.outbox} WHERE id <> 'a2' ORDER BY seq`,
    );
    assert.deepEqual(order.map((row) => row.id), ["z0", "a5", "m7", "z9", "z1", "u3", "u0"]);
  } finally {
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.end();
  }
});

Deno.test("postgres: a role with only the documented table grants enqueues batches, keyed or not", async () => {
  const url = await postgresUrl();
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const role = `${tables.outbox}_producer`;
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
    await sql.unsafe(`CREATE ROLE ${role}`);
    // docs/sql.md#privileges
    await sql.unsafe(`GRANT SELECT, INSERT, UPDATE ON ${tables.outbox} TO ${role}`);
    const stored = await sql.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL ROLE ${role}`);
      const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
      await outbox.enqueue(record("p0", "kp"));
      return await outbox.enqueueMany([
        record("p1", "kp"),
        record("q1", "kq"),
        record("q2", "kq"),
        record("u1"),
      ]);
    });
    assert.deepEqual(stored.map((message) => message.id), ["p1", "q1", "q2", "u1"]);
  } finally {
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.unsafe(`DROP ROLE IF EXISTS ${role}`);
    await sql.end();
  }
});
