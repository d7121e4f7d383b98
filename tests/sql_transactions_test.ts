/**
 * The SQL stores inside the caller's transaction, across connections and threads: rollback leaves
 * no outbox row, concurrent claimers take each row once, stale claims are fenced, and pg_notify
 * wakes a LISTENer only on commit.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import {
  listenForOutboxWakeups,
  migrate,
  nodeSqliteExecutor,
  type OutboxRecord,
  pgExecutor,
  postgresJsExecutor,
  SqlInboxRepository,
  sqliteTransactionRunner,
  SqlOutboxRepository,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

let n = 0;
function record(id = `m-${++n}`): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ n }),
    headers: {},
  };
}

class Boom extends Error {}

async function withPostgres(
  fn: (sql: postgres.Sql, tables: ReturnType<typeof uniqueTables>) => Promise<void>,
): Promise<void> {
  const sql = postgres(await postgresUrl(), { max: 4, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    await sql.unsafe(`CREATE TABLE ${tables.outbox}_orders (id int PRIMARY KEY)`);
    await fn(sql, tables);
  } finally {
    await sql.unsafe(`DROP TABLE IF EXISTS ${tables.outbox}_orders`);
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
}

Deno.test("postgres.js: outbox rows commit and roll back with the business rows (sql.begin)", async () => {
  await withPostgres(async (sql, tables) => {
    const orders = `${tables.outbox}_orders`;
    await assert.rejects(
      sql.begin(async (tx) => {
        await tx.unsafe(`INSERT INTO ${orders} (id) VALUES (1)`);
        const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
        await outbox.enqueue(record("rolled-back-1"));
        await outbox.enqueueMany([record("rolled-back-2"), record("rolled-back-3")]);
        await new SqlInboxRepository(postgresJsExecutor(tx), "postgres", tables).record("in-1");
        throw new Boom("business rule failed");
      }),
      Boom,
    );
    const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables);
    for (const id of ["rolled-back-1", "rolled-back-2", "rolled-back-3"]) {
      assert.equal(await outbox.get(id), undefined);
    }
    assert.equal((await sql.unsafe(`SELECT * FROM ${orders}`)).length, 0);
    assert.equal(
      await new SqlInboxRepository(postgresJsExecutor(sql), "postgres", tables).record("in-1"),
      true,
      "the inbox id rolled back too",
    );

    await sql.begin(async (tx) => {
      await tx.unsafe(`INSERT INTO ${orders} (id) VALUES (2)`);
      await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables)
        .enqueue(record("committed"));
    });
    assert.equal((await outbox.get("committed"))?.state, "pending");
    assert.equal((await sql.unsafe(`SELECT * FROM ${orders}`)).length, 1);
  });
});

Deno.test("node-postgres: outbox rows roll back with the client's transaction", async () => {
  const url = await postgresUrl();
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  const tables = uniqueTables();
  try {
    await migrate(pgExecutor(pool), { dialect: "postgres", tables });
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      await new SqlOutboxRepository(pgExecutor(client), "postgres", tables).enqueue(
        record("pg-rb"),
      );
      await client.query("ROLLBACK");
      await client.query("BEGIN");
      await new SqlOutboxRepository(pgExecutor(client), "postgres", tables).enqueue(
        record("pg-ok"),
      );
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    const outbox = new SqlOutboxRepository(pgExecutor(pool), "postgres", tables);
    assert.equal(await outbox.get("pg-rb"), undefined);
    assert.equal((await outbox.get("pg-ok"))?.state, "pending");
  } finally {
    await dropPostgresTables(pgExecutor(pool), tables);
    await pool.end();
  }
});

Deno.test("node:sqlite: outbox rows roll back with BEGIN IMMEDIATE ... ROLLBACK (join mode)", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_tx_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db, { openTransaction: "join" });
    await migrate(executor, { dialect: "sqlite" });
    db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
    const outbox = new SqlOutboxRepository(executor, "sqlite");
    db.exec("BEGIN IMMEDIATE");
    try {
      db.prepare("INSERT INTO orders (id) VALUES (?)").run(1);
      await outbox.enqueue(record("sqlite-rb-1"));
      await outbox.enqueueMany([record("sqlite-rb-2"), record("sqlite-rb-3")]);
      throw new Boom("business rule failed");
    } catch (error) {
      db.exec("ROLLBACK");
      assert.ok(error instanceof Boom);
    }
    for (const id of ["sqlite-rb-1", "sqlite-rb-2", "sqlite-rb-3"]) {
      assert.equal(await outbox.get(id), undefined);
    }
    assert.deepEqual({ ...db.prepare("SELECT count(*) AS n FROM orders").get() }, { n: 0 });
    db.exec("BEGIN IMMEDIATE");
    db.prepare("INSERT INTO orders (id) VALUES (?)").run(2);
    await outbox.enqueue(record("sqlite-ok"));
    db.exec("COMMIT");
    assert.equal((await outbox.get("sqlite-ok"))?.state, "pending");
    // A join-mode executor's transaction() nests as a savepoint inside the caller's transaction.
    db.exec("BEGIN IMMEDIATE");
    await assert.rejects(
      executor.transaction!(async (tx) => {
        await new SqlOutboxRepository(tx, "sqlite").enqueue(record("inner"));
        throw new Boom("inner");
      }),
      Boom,
    );
    await outbox.enqueue(record("outer"));
    db.exec("COMMIT");
    assert.equal(await outbox.get("inner"), undefined);
    assert.equal((await outbox.get("outer"))?.state, "pending");
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("node:sqlite: statements on a shared connection never join another caller's transaction", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_tx_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    const inTransaction = sqliteTransactionRunner(executor);
    // The dispatcher's view: the same connection, outside any transaction.
    const relay = new SqlOutboxRepository(executor, "sqlite");
    let claimedDuring: Promise<string[]> | undefined;
    await assert.rejects(
      inTransaction(async (tx) => {
        await new SqlOutboxRepository(tx, "sqlite").enqueue(record("uncommitted"));
        // A claim issued while the transaction is open (across a macrotask, as a relay's timer
        // would) must neither see the uncommitted row nor run inside this transaction.
        claimedDuring = relay.claimDue(10, new Date()).then((rows) => rows.map((r) => r.id));
        await new Promise((resolve) => setTimeout(resolve, 20));
        throw new Boom("the order was rejected");
      }),
      Boom,
    );
    assert.deepEqual(await claimedDuring, [], "nothing from the rolled-back transaction");
    assert.equal(await relay.get("uncommitted"), undefined);
    // Committed work is claimed after the commit, by a claim issued during the transaction.
    await inTransaction(async (tx) => {
      await new SqlOutboxRepository(tx, "sqlite").enqueue(record("committed"));
      claimedDuring = relay.claimDue(10, new Date()).then((rows) => rows.map((r) => r.id));
      await new Promise((resolve) => setTimeout(resolve, 20));
    });
    assert.deepEqual(await claimedDuring, ["committed"]);
    // Transactions queue: two at once run one after the other, each atomically.
    const order: string[] = [];
    await Promise.all(["a", "b"].map((name) =>
      inTransaction(async (tx) => {
        order.push(`${name}:begin`);
        await new SqlOutboxRepository(tx, "sqlite").enqueue(record(`queued-${name}`));
        await new Promise((resolve) => setTimeout(resolve, 10));
        order.push(`${name}:end`);
      })
    ));
    assert.deepEqual(order, ["a:begin", "a:end", "b:begin", "b:end"]);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("postgres: four pools claiming concurrently take each of 600 rows exactly once", async () => {
  const url = await postgresUrl();
  const tables = uniqueTables();
  const pools = Array.from({ length: 4 }, () => postgres(url, { max: 2, onnotice: () => {} }));
  const executor = postgresJsExecutor(pools[0]);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const outbox = new SqlOutboxRepository(executor, "postgres", tables);
    const total = 600;
    for (let i = 0; i < total; i += 200) {
      await outbox.enqueueMany(Array.from({ length: 200 }, (_, j) => record(`c-${i + j}`)));
    }
    const now = new Date();
    const seen: string[] = [];
    let settled = 0;
    await Promise.all(Array.from({ length: 8 }, async (_, worker) => {
      const store = new SqlOutboxRepository(
        postgresJsExecutor(pools[worker % pools.length]),
        "postgres",
        tables,
      );
      while (true) {
        const claimed = await store.claimDue(9, now);
        if (claimed.length === 0) break;
        seen.push(...claimed.map((m) => m.id));
        const results = await store.markMany(
          claimed.map((claim) => ({ claim, state: "dispatched" as const })),
          now,
        );
        settled += results.filter(Boolean).length;
      }
    }));
    assert.equal(seen.length, total);
    assert.equal(new Set(seen).size, total);
    assert.equal(settled, total);
    assert.equal((await outbox.stats(now)).dispatched, total);
  } finally {
    await dropPostgresTables(executor, tables);
    await Promise.all(pools.map((pool) => pool.end()));
  }
});

Deno.test("sqlite: claimers in four threads on one WAL file take each of 600 rows exactly once", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_threads_" });
  const path = `${dir}/app.db`;
  const db = openSqlite(path);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    const outbox = new SqlOutboxRepository(executor, "sqlite");
    const total = 600;
    await outbox.enqueueMany(Array.from({ length: total }, (_, i) => record(`t-${i}`)));
    const now = new Date().toISOString();
    const results = await Promise.all(Array.from({ length: 4 }, () => {
      const worker = new Worker(new URL("./sql/sqlite_claim_worker.ts", import.meta.url), {
        type: "module",
      });
      return new Promise<{ ids: string[]; settled: number; error?: string }>((resolve) => {
        worker.onmessage = (event) => {
          worker.terminate();
          resolve(event.data);
        };
        worker.postMessage({ path, now, batch: 7 });
      });
    }));
    for (const result of results) assert.equal(result.error, undefined, String(result.error));
    const seen = results.flatMap((result) => result.ids);
    assert.equal(seen.length, total);
    assert.equal(new Set(seen).size, total);
    assert.equal(results.reduce((sum, r) => sum + r.settled, 0), total);
    assert.equal((await outbox.stats()).dispatched, total);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("stale claims are fenced across connections (postgres and sqlite)", async () => {
  const check = async (
    a: SqlOutboxRepository,
    b: SqlOutboxRepository,
  ) => {
    await a.enqueueMany([record("s-1"), record("s-2")]);
    const t0 = new Date();
    const stale = await a.claimDue(2, t0, { leaseMs: 1_000 });
    const fresh = await b.claimDue(2, new Date(t0.getTime() + 1_000), { leaseMs: 1_000 });
    assert.deepEqual(fresh.map((m) => m.attempts), [2, 2]);
    const later = new Date(t0.getTime() + 1_500);
    assert.deepEqual(
      await a.markMany([
        { claim: stale[0], state: "dispatched" },
        { claim: stale[1], state: "failed", error: "late", nextAttemptAt: later },
      ], later),
      [false, false],
    );
    // The stale claim's token: fenced whatever else matches.
    assert.equal(
      await b.markDispatched({ ...fresh[0], claimToken: stale[0].claimToken }, later),
      false,
    );
    // Without a token, same attempts, wrong lease: still fenced.
    assert.equal(
      await b.markDispatched(
        { id: fresh[0].id, attempts: fresh[0].attempts, nextAttemptAt: stale[0].nextAttemptAt },
        later,
      ),
      false,
    );
    assert.deepEqual(
      await b.markMany([
        { claim: fresh[0], state: "dispatched" },
        { claim: fresh[1], state: "dead", error: "no stream" },
        { claim: fresh[1], state: "dispatched" },
      ], later),
      [true, true, false],
    );
  };

  const url = await postgresUrl();
  const one = postgres(url, { max: 1, onnotice: () => {} });
  const two = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  try {
    await migrate(postgresJsExecutor(one), { dialect: "postgres", tables });
    await check(
      new SqlOutboxRepository(postgresJsExecutor(one), "postgres", tables),
      new SqlOutboxRepository(postgresJsExecutor(two), "postgres", tables),
    );
  } finally {
    await dropPostgresTables(postgresJsExecutor(one), tables);
    await Promise.all([one.end(), two.end()]);
  }

  const dir = await Deno.makeTempDir({ prefix: "outbox_fence_" });
  const first = openSqlite(`${dir}/app.db`);
  const second = openSqlite(`${dir}/app.db`);
  try {
    await migrate(nodeSqliteExecutor(first), { dialect: "sqlite" });
    await check(
      new SqlOutboxRepository(nodeSqliteExecutor(first), "sqlite"),
      new SqlOutboxRepository(nodeSqliteExecutor(second), "sqlite"),
    );
  } finally {
    second.close();
    first.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("pg_notify on enqueue reaches a LISTENer on commit only", async () => {
  await withPostgres(async (sql, tables) => {
    const listener = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
    const events: string[] = [];
    let waiter: (() => void) | undefined;
    const next = () => new Promise<void>((resolve) => waiter = resolve);
    let arrived = next();
    const subscription = await listenForOutboxWakeups(listener, {
      tables,
      onWake(reason, payload) {
        events.push(`${reason}:${payload ?? ""}`);
        waiter?.();
      },
    });
    try {
      assert.deepEqual(
        events,
        ["listen:"],
        "a (re)LISTEN wakes once: notifications may have been missed",
      );
      assert.equal(subscription.channel, tables.outbox);
      assert.equal(subscription.mode, "listen", "a direct connection receives notifications");
      arrived = next();
      await assert.rejects(
        sql.begin(async (tx) => {
          await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables, {
            notify: true,
          })
            .enqueue(record());
          throw new Boom("rolled back");
        }),
        Boom,
      );
      await sql.begin(async (tx) => {
        const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables, {
          notify: true,
        });
        await outbox.enqueue(record());
        await outbox.enqueueMany([record(), record()]);
        assert.deepEqual(events, ["listen:"], "nothing is delivered before commit");
      });
      await arrived;
      // A marker after the commit: everything before it has been delivered by then.
      arrived = next();
      await sql.notify(tables.outbox, "marker");
      while (!events.includes("notify:marker")) {
        await arrived;
        arrived = next();
      }
      assert.deepEqual(events, [
        "listen:",
        `notify:${tables.outbox}`, // one per committed transaction (Postgres folds duplicates)
        "notify:marker",
      ]);
    } finally {
      await subscription.close();
      await listener.end();
    }
  });
});
