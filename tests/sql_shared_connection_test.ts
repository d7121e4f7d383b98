/**
 * One connection, many users: a SQLite handle, a `pg.Client` or a reserved postgres.js
 * connection shared by a service, a dispatcher and an inbox consumer. A connection has one
 * transaction, so the library queues its transactions per connection object (whichever executor
 * asked) and never runs its statements inside a transaction it did not open.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  migrate,
  nodeSqliteExecutor,
  type OutboxRecord,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlForeignTransactionError,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../mod.ts";
import { connectNats, createTestDatabase, createTestStream, eventually } from "./kit/mod.ts";
import { openSqlite } from "./sql/harness.ts";

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

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function withSqlite(fn: (db: ReturnType<typeof openSqlite>) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "outbox_shared_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
    await fn(db);
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("node:sqlite: two executors over one database share its queue: a relay's claim never joins the service's transaction", async () => {
  await withSqlite(async (db) => {
    const service = nodeSqliteExecutor(db);
    const relay = new SqlOutboxRepository(nodeSqliteExecutor(db), "sqlite");
    let claimedDuring: Promise<string[]> | undefined;
    await assert.rejects(
      service.transaction!(async (tx) => {
        await new SqlOutboxRepository(tx, "sqlite").enqueue(record("uncommitted"));
        claimedDuring = relay.claimDue(10, new Date()).then((rows) => rows.map((r) => r.id));
        await sleep(20);
        throw new Boom("the order was rejected");
      }),
      Boom,
    );
    assert.deepEqual(await claimedDuring, [], "nothing phantom from the rolled-back transaction");
    assert.equal(await relay.get("uncommitted"), undefined);
    // Two executors' transactions queue on the connection instead of interleaving.
    const order: string[] = [];
    await Promise.all(
      [service, nodeSqliteExecutor(db)].map((executor, i) =>
        executor.transaction!(async (tx) => {
          order.push(`${i}:begin`);
          await new SqlOutboxRepository(tx, "sqlite").enqueue(record(`queued-${i}`));
          await sleep(10);
          order.push(`${i}:end`);
        })
      ),
    );
    assert.deepEqual(order, ["0:begin", "0:end", "1:begin", "1:end"]);
  });
});

Deno.test("node:sqlite: a transaction opened outside the library is waited for, never joined (no phantom claim, no accidental savepoint)", async () => {
  await withSqlite(async (db) => {
    const executor = nodeSqliteExecutor(db);
    const relay = new SqlOutboxRepository(executor, "sqlite");
    // The service opens its own transaction and enqueues inside it, deliberately (join mode).
    db.exec("BEGIN IMMEDIATE");
    await new SqlOutboxRepository(nodeSqliteExecutor(db, { openTransaction: "join" }), "sqlite")
      .enqueue(record("raw-uncommitted"));
    // Meanwhile the relay claims and an inbox consumer opens its transaction on the same handle.
    const claimed = relay.claimDue(10, new Date()).then((rows) => rows.map((r) => r.id));
    const inboxDone = executor.transaction!(async (tx) => {
      assert.equal(await new SqlInboxRepository(tx, "sqlite").record("evt-1"), true);
    });
    await sleep(30);
    db.exec("ROLLBACK");
    assert.deepEqual(await claimed, [], "the claim ran after the rollback: nothing phantom");
    await inboxDone;
    assert.equal(await relay.get("raw-uncommitted"), undefined);
    assert.equal(
      await new SqlInboxRepository(executor, "sqlite").has("evt-1"),
      true,
      "the inbox transaction ran after the foreign one, not as a savepoint inside it",
    );
  });
});

Deno.test("node:sqlite: a foreign transaction that does not end fails the library's statements with SqlForeignTransactionError", async () => {
  await withSqlite(async (db) => {
    const executor = nodeSqliteExecutor(db, { openTransactionTimeoutMs: 50 });
    db.exec("BEGIN IMMEDIATE");
    try {
      const relay = new SqlOutboxRepository(executor, "sqlite");
      await assert.rejects(relay.claimDue(10, new Date()), SqlForeignTransactionError);
      let ran = false;
      await assert.rejects(
        executor.transaction!(() => {
          ran = true;
          return Promise.resolve();
        }),
        (error: unknown) => {
          assert.ok(error instanceof SqlForeignTransactionError);
          assert.equal(error.waitedMs, 50);
          assert.match(error.message, /did not open/);
          return true;
        },
      );
      assert.equal(ran, false, "nothing ran inside the foreign transaction");
    } finally {
      db.exec("ROLLBACK");
    }
    // Once it ended, the same executor works again.
    assert.deepEqual(await new SqlOutboxRepository(executor, "sqlite").claimDue(1, new Date()), []);
  });
});

/** Creates `effects` on a fresh database; returns its URL and a disposer. */
async function postgresDatabase() {
  const database = await createTestDatabase();
  const admin = postgres(database.url, { max: 1, onnotice: () => {} });
  await migrate(postgresJsExecutor(admin), { dialect: "postgres" });
  await admin.unsafe("CREATE TABLE effects (id text PRIMARY KEY)");
  return {
    url: database.url,
    admin,
    async effects(): Promise<string[]> {
      return (await admin.unsafe("SELECT id FROM effects ORDER BY id")).map((r) => r.id);
    },
    async inbox(): Promise<string[]> {
      return (await admin.unsafe("SELECT message_id FROM trellis_inbox ORDER BY message_id"))
        .map((r) => r.message_id);
    },
    async [Symbol.asyncDispose]() {
      await admin.end();
      await database[Symbol.asyncDispose]();
    },
  };
}

/** Two concurrent transactions on one connection: A fails after B wrote; B must commit. */
async function concurrentTransactions(executors: [SqlExecutor, SqlExecutor]): Promise<void> {
  const [a, b] = executors;
  const failing = a.transaction!(async (tx) => {
    await tx.query("INSERT INTO effects (id) VALUES ($1)", ["a"]);
    await sleep(30);
    throw new Boom("handler A failed");
  });
  const succeeding = b.transaction!(async (tx) => {
    await tx.query("INSERT INTO effects (id) VALUES ($1)", ["b"]);
    await new SqlInboxRepository(tx, "postgres").record("b");
  });
  await assert.rejects(failing, Boom);
  await succeeding;
}

Deno.test("pg.Client: concurrent transactions on one client are serialized; one's rollback never undoes another's writes", async () => {
  await using db = await postgresDatabase();
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    // Two executors over the same client: the queue belongs to the client.
    await concurrentTransactions([pgExecutor(client), pgExecutor(client)]);
    assert.deepEqual(await db.effects(), ["b"]);
    assert.deepEqual(await db.inbox(), ["b"]);
    // A plain statement issued while a transaction is open waits for it instead of joining it.
    const executor = pgExecutor(client);
    let seen: unknown;
    await assert.rejects(
      executor.transaction!(async (tx) => {
        await tx.query("INSERT INTO effects (id) VALUES ($1)", ["c"]);
        seen = executor.query("SELECT count(*)::int AS n FROM effects WHERE id = 'c'", []);
        await sleep(20);
        throw new Boom("rolled back");
      }),
      Boom,
    );
    assert.deepEqual(await seen, [{ n: 0 }]);
  } finally {
    await client.end();
  }
});

Deno.test("pg.Client: transaction() waits for a BEGIN the caller issued on the client, never nests in it", async () => {
  await using db = await postgresDatabase();
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    await client.query("BEGIN");
    await client.query("INSERT INTO effects (id) VALUES ('outer')");
    const inner = pgExecutor(client).transaction!(async (tx) => {
      await tx.query("INSERT INTO effects (id) VALUES ($1)", ["inner"]);
    });
    await sleep(30);
    await client.query("ROLLBACK");
    await inner;
    assert.deepEqual(await db.effects(), ["inner"], "the inner transaction ran on its own");
    await client.query("BEGIN");
    await assert.rejects(
      pgExecutor(client, { openTransactionTimeoutMs: 30 }).transaction!(() => Promise.resolve()),
      SqlForeignTransactionError,
    );
    await client.query("ROLLBACK");
  } finally {
    await client.end();
  }
});

Deno.test("postgres.js sql.reserve(): concurrent transactions on one reserved connection are serialized", async () => {
  await using db = await postgresDatabase();
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  const reserved = await sql.reserve();
  try {
    await concurrentTransactions([postgresJsExecutor(reserved), postgresJsExecutor(reserved)]);
    assert.deepEqual(await db.effects(), ["b"]);
    assert.deepEqual(await db.inbox(), ["b"]);
  } finally {
    reserved.release();
    await sql.end();
  }
});

Deno.test("pg.Client: consumeWithInbox with concurrency 2, handler A fails and B succeeds: B's effects and inbox row are kept", async () => {
  await using db = await postgresDatabase();
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const jsm = await jetstreamManager(nc);
    await jsm.consumers.add(stream.name, {
      durable_name: "worker",
      ack_policy: AckPolicy.Explicit,
    });
    const js = jetstream(nc);
    await js.publish(`${stream.prefix}.a`, "a", { msgID: "a" });
    await js.publish(`${stream.prefix}.b`, "b", { msgID: "b" });
    let failures = 0;
    const running = await consumeWithInbox(await js.consumers.get(stream.name, "worker"), {
      scope: "worker",
      concurrency: 2,
      nakBackoff: { baseMs: 60_000, capMs: 60_000 }, // A is not redelivered during the test
      transaction: (work) => pgExecutor(client).transaction!(work),
      inbox: (tx: SqlExecutor) => new SqlInboxRepository(tx, "postgres"),
      handler: async (message, { tx, messageId }) => {
        await tx.query("INSERT INTO effects (id) VALUES ($1)", [messageId]);
        if (messageId === "a") {
          await sleep(50); // B runs meanwhile
          failures += 1;
          throw new Boom("handler A failed");
        }
        void message;
      },
    });
    await eventually(() => {
      assert.equal(running.stats.processed, 1);
      assert.equal(running.stats.failed, 1);
    }, { timeoutMs: 10_000 });
    await running.stop();
    assert.equal(failures, 1);
    assert.deepEqual(await db.effects(), ["b"], "B's effect survived A's rollback");
    assert.deepEqual(await db.inbox(), ["b"], "B's inbox row survived A's rollback");
  } finally {
    await nc.close();
    await client.end();
  }
});

Deno.test("node:sqlite: a BEGIN issued by other code between the library's wait and its statement is still never joined", async () => {
  // The queue's next entry checks the connection, then runs: any await between the two lets
  // other code (here: whoever awaited the previous library transaction, a few ticks later)
  // open a transaction that the library's statement would then join.
  for (let ticks = 0; ticks < 6; ticks++) {
    await withSqlite(async (db) => {
      db.exec("CREATE TABLE effects (id TEXT PRIMARY KEY)");
      const service = nodeSqliteExecutor(db);
      const relay = nodeSqliteExecutor(db);
      let open!: () => void;
      const gate = new Promise<void>((resolve) => open = resolve);
      const first = service.transaction!(() => gate);
      const statement = relay.query("INSERT INTO effects (id) VALUES ('statement')", []);
      const transaction = relay.transaction!(async (tx) => {
        await tx.query("INSERT INTO effects (id) VALUES ('transaction')", []);
      });
      const foreign = (async () => {
        await first;
        for (let i = 0; i < ticks; i++) await null;
        try {
          db.exec("BEGIN");
        } catch {
          return; // the library's own transaction was open: nothing to test at this tick
        }
        await sleep(10);
        db.exec("ROLLBACK");
      })();
      open();
      await statement;
      await transaction;
      await foreign;
      assert.deepEqual(
        db.prepare("SELECT id FROM effects ORDER BY id").all().map((row) => row.id),
        ["statement", "transaction"],
        `after ${ticks} ticks: the library's writes ran inside the foreign transaction`,
      );
    });
  }
});

Deno.test("pg.Client: transaction() never nests in a BEGIN the caller sent just before it (still in flight)", async () => {
  await using db = await postgresDatabase();
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  client.on("notice", () => {});
  try {
    const executor = pgExecutor(client);
    let open!: () => void;
    const gate = new Promise<void>((resolve) => open = resolve);
    const first = executor.transaction!(() => gate);
    const library = executor.transaction!(async (tx) => {
      await tx.query("INSERT INTO effects (id) VALUES ($1)", ["library"]);
    });
    // The caller's own transaction starts as soon as the first library transaction ended: its
    // BEGIN is on the wire when the next library transaction looks at the connection.
    const caller = (async () => {
      await first;
      await client.query("BEGIN");
      await client.query("INSERT INTO effects (id) VALUES ('caller')");
      await sleep(30);
      await client.query("ROLLBACK");
    })();
    open();
    await Promise.all([library, caller]);
    assert.deepEqual(
      await db.effects(),
      ["library"],
      "the library's COMMIT committed the caller's transaction, which it then could not roll back",
    );
  } finally {
    await client.end();
  }
});

Deno.test("node:sqlite: callers queued behind a foreign transaction that does not end each fail within openTransactionTimeoutMs, not one after another", async () => {
  await withSqlite(async (db) => {
    const executor = nodeSqliteExecutor(db, { openTransactionTimeoutMs: 150 });
    db.exec("BEGIN IMMEDIATE");
    try {
      const started = Date.now();
      const failedAfter = await Promise.all(
        [1, 2, 3, 4, 5].map(async (i) => {
          const call = i % 2
            ? executor.query("SELECT 1", [])
            : executor.transaction!(() => sleep(1));
          await assert.rejects(call, SqlForeignTransactionError);
          return Date.now() - started;
        }),
      );
      // Waiting in the queue for the same foreign transaction counts: the fifth caller must not
      // wait five timeouts (a stuck transaction would grow the queue without bound).
      assert.ok(Math.max(...failedAfter) < 450, `failed after ${failedAfter.join(", ")} ms`);
    } finally {
      db.exec("ROLLBACK");
    }
    // A caller arriving once the transaction ended is not failed by the old clock.
    assert.deepEqual((await executor.query("SELECT 1 AS one", [])).map((row) => row.one), [1]);
  });
});

Deno.test('node:sqlite: a "join" executor enqueues inside the caller\'s transaction at once, even while a relay statement waits for that transaction', async () => {
  await withSqlite(async (db) => {
    const relay = new SqlOutboxRepository(
      nodeSqliteExecutor(db, { openTransactionTimeoutMs: 2_000 }),
      "sqlite",
    );
    const service = nodeSqliteExecutor(db, { openTransaction: "join" });
    db.exec("BEGIN IMMEDIATE");
    let claimed: Promise<string[]>;
    let enqueueMs: number;
    try {
      claimed = relay.claimDue(10, new Date()).then((claims) => claims.map((c) => c.id));
      claimed.catch(() => {}); // awaited below
      await sleep(5); // the claim is queued, waiting for this transaction to end
      const started = Date.now();
      await new SqlOutboxRepository(service, "sqlite").enqueue(record("joined"));
      await service.transaction!(async (tx) => {
        await new SqlOutboxRepository(tx, "sqlite").enqueue(record("joined-savepoint"));
      });
      enqueueMs = Date.now() - started;
    } finally {
      db.exec("COMMIT");
    }
    assert.ok(enqueueMs < 500, `the enqueue waited ${enqueueMs} ms behind the relay's claim`);
    assert.deepEqual((await claimed).sort(), ["joined", "joined-savepoint"]);
  });
});

Deno.test("pg.Client: statements in the caller's own BEGIN run at once, even while a library transaction waits for it", async () => {
  await using db = await postgresDatabase();
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    const consumer = pgExecutor(client, { openTransactionTimeoutMs: 2_000 });
    await client.query("BEGIN");
    let inbox: Promise<unknown>;
    let enqueueMs: number;
    try {
      inbox = consumer.transaction!((tx) => new SqlInboxRepository(tx, "postgres").record("evt-1"));
      inbox.catch(() => {}); // awaited below
      await sleep(5); // the inbox transaction is queued, waiting for this BEGIN to end
      const started = Date.now();
      await new SqlOutboxRepository(pgExecutor(client), "postgres").enqueue(record("mine"));
      enqueueMs = Date.now() - started;
    } finally {
      await client.query("COMMIT");
    }
    assert.ok(enqueueMs < 500, `the enqueue waited ${enqueueMs} ms behind the inbox transaction`);
    await inbox;
    assert.deepEqual(await db.inbox(), ["evt-1"]);
  } finally {
    await client.end();
  }
});
