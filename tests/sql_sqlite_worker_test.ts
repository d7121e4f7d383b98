/**
 * `sqliteWorkerExecutor`: the relay's SQLite statements on a worker thread with its own
 * connection. Rows and errors must look as they do on the calling thread; the application keeps
 * enqueueing on its own connection while the worker claims; a closed executor or a dead thread
 * fails every call with `SqliteWorkerClosedError` and leaves nothing waiting. (The conformance
 * suite runs on it too: tests/sql_sqlite_conformance_test.ts.)
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { jetstream } from "@nats-io/jetstream";
import {
  createJetStreamRuntime,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  OutboxSchemaError,
  OutboxValidationError,
  type SqlExecutor,
  sqliteTransactionRunner,
  SqliteWorkerClosedError,
  sqliteWorkerExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { sqliteWorkerThreadOf } from "../src/stores/sql/sqlite_worker_executor.ts";
import { openSqlite } from "./sql/harness.ts";
import { connectNats, createTestStream } from "./kit/mod.ts";

async function withFile(fn: (path: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "outbox_sqlite_worker_" });
  try {
    await fn(`${dir}/app.db`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Rows as plain objects (node:sqlite's rows have no prototype; cloned ones have Object's). */
const plain = (rows: unknown[]): Array<Record<string, unknown>> =>
  rows.map((row) => ({ ...(row as object) }));

/** What a call settled with: its rows, or its error's class name and fields. */
async function outcome(call: Promise<unknown>): Promise<unknown> {
  try {
    return { rows: plain(await call as unknown[]) };
  } catch (error) {
    const e = error as Error & Record<string, unknown>;
    return {
      error: e.constructor.name,
      name: e.name,
      message: e.message,
      code: e.code,
      errcode: e.errcode,
      errstr: e.errstr,
    };
  }
}

Deno.test("sqliteWorkerExecutor: rows, bound parameters and driver errors are exactly those of nodeSqliteExecutor", async () => {
  await withFile(async (path) => {
    const db = openSqlite(path);
    const worker = await sqliteWorkerExecutor(path);
    try {
      const local = nodeSqliteExecutor(db);
      await local.query(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, i INTEGER, r REAL, s TEXT, b BLOB, n TEXT)",
        [],
      );
      const cases: Array<[string, unknown[]]> = [
        [
          "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING *",
          [1, 2 ** 53 - 1, 1.5, "héllo\u0000x", new Uint8Array([0, 1, 255]), null],
        ],
        ["SELECT * FROM t", []],
        [
          "SELECT ?1 AS d, ?2 AS yes, ?3 AS no, ?4 AS nothing, ?5 AS big, ?6 AS bytes, ?7 AS neg",
          [new Date(0), true, false, undefined, 12n, new Uint8Array([7]), -0.25],
        ],
        ["SELECT 1 AS one WHERE 0", []],
        // node:sqlite refuses integers beyond 2^53 by default: the same RangeError either way.
        ["SELECT 9007199254740993 AS big", []],
        ["INSERT INTO t (id) VALUES (1)", []], // UNIQUE constraint failed
        ["SELEC 1", []], // syntax error
        ["SELECT * FROM missing_table", []],
        ["SELECT ?1 AS x", [{ not: "bindable" }]],
      ];
      for (const [sql, params] of cases) {
        const expected = await outcome(local.query(sql, params));
        // The local INSERT ... RETURNING ran; run it on the worker against a fresh id.
        const workerSql = sql.startsWith("INSERT INTO t VALUES")
          ? sql.replace("?1", "?1 + 1")
          : sql;
        const actual = await outcome(worker.query(workerSql, params));
        if (workerSql !== sql) {
          (expected as { rows: Array<{ id: number }> }).rows[0].id += 1;
        }
        if (sql === "SELECT * FROM t") continue; // compared below, after both inserts
        assert.deepEqual(actual, expected, sql);
      }
      assert.deepEqual(
        plain(await worker.query("SELECT * FROM t ORDER BY id", [])),
        plain(await local.query("SELECT * FROM t ORDER BY id", [])),
      );
      const [row] = await worker.query("SELECT b FROM t WHERE id = 1", []);
      assert.ok(row.b instanceof Uint8Array);
    } finally {
      await worker.close();
      db.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: a missing table surfaces as OutboxSchemaError, as on the calling thread", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    try {
      const outbox = new SqlOutboxRepository(worker, "sqlite");
      await assert.rejects(outbox.claimDue(10, new Date()), OutboxSchemaError);
    } finally {
      await worker.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: refuses private databases (:memory:, temporary, mode=memory) before starting a thread", async () => {
  for (const path of [":memory:", "", "file::memory:", "file:shared?mode=memory&cache=shared"]) {
    await assert.rejects(
      sqliteWorkerExecutor(path),
      (error: unknown) => error instanceof OutboxValidationError && error.field === "path",
      path,
    );
  }
  await assert.rejects(
    sqliteWorkerExecutor("x.db", { synchronous: "SOMETIMES" as "FULL" }),
    OutboxValidationError,
  );
});

Deno.test("sqliteWorkerExecutor: a database that cannot be opened rejects with the driver's error", async () => {
  await assert.rejects(
    sqliteWorkerExecutor("/nonexistent-dir-outbox/app.db"),
    (error: unknown) =>
      (error as { code?: string }).code === "ERR_SQLITE_ERROR" &&
      /unable to open/.test((error as Error).message),
  );
});

Deno.test("sqliteWorkerExecutor: transactions commit, roll back, nest as savepoints, and keep other statements out", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    try {
      await worker.query("CREATE TABLE t (v TEXT)", []);
      let release!: () => void;
      const gate = new Promise<void>((resolve) => release = resolve);
      let opened!: () => void;
      const inside = new Promise<void>((resolve) => opened = resolve);
      const tx = worker.transaction(async (tx) => {
        await tx.query("INSERT INTO t VALUES ('in-tx')", []);
        opened();
        await gate;
        await tx.transaction!(async (inner) => {
          await inner.query("INSERT INTO t VALUES ('savepoint')", []);
        });
        await tx.transaction!(async (inner) => {
          await inner.query("INSERT INTO t VALUES ('undone')", []);
          throw new Error("inner");
        }).catch(() => {});
        throw new Error("outer");
      });
      // Issued while the transaction is open: it must wait, not join (and so not be rolled back).
      await inside;
      const outside = worker.query("INSERT INTO t VALUES ('outside') RETURNING v", []);
      await new Promise((resolve) => setTimeout(resolve, 20));
      release();
      await assert.rejects(tx, /outer/);
      assert.deepEqual(plain(await outside), [{ v: "outside" }]);
      assert.deepEqual(plain(await worker.query("SELECT v FROM t", [])), [{ v: "outside" }]);
      await worker.transaction(async (tx) => {
        await tx.query("INSERT INTO t VALUES ('committed')", []);
        await tx.transaction!((inner) => inner.query("INSERT INTO t VALUES ('nested')", []));
      });
      assert.deepEqual(
        plain(await worker.query("SELECT v FROM t ORDER BY rowid", [])).map((r) => r.v),
        ["outside", "committed", "nested"],
      );
    } finally {
      await worker.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: close() lets sent statements finish, rolls back the open transaction, rejects the rest", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    await worker.query("CREATE TABLE t (v TEXT)", []);
    let inTransaction!: () => void;
    const started = new Promise<void>((resolve) => inTransaction = resolve);
    const tx = worker.transaction(async (tx) => {
      await tx.query("INSERT INTO t VALUES ('rolled back')", []);
      inTransaction();
      await new Promise((resolve) => setTimeout(resolve, 50));
      await tx.query("INSERT INTO t VALUES ('after close')", []);
    });
    await started;
    const queued = worker.query("SELECT 1", []); // behind the transaction
    const closing = worker.close();
    const results = await Promise.allSettled([tx, queued, closing]);
    assert.equal(results[0].status, "rejected");
    assert.ok((results[0] as PromiseRejectedResult).reason instanceof SqliteWorkerClosedError);
    assert.equal(results[1].status, "rejected");
    const reason = (results[1] as PromiseRejectedResult).reason;
    assert.ok(reason instanceof SqliteWorkerClosedError);
    assert.equal(reason.reason, "closed");
    assert.equal(results[2].status, "fulfilled");
    await assert.rejects(worker.query("SELECT 1", []), SqliteWorkerClosedError);
    await assert.rejects(worker.transaction(() => Promise.resolve()), SqliteWorkerClosedError);
    await worker.close(); // idempotent
    const db = new DatabaseSync(path);
    assert.deepEqual(
      db.prepare("SELECT count(*) AS n FROM t").all(),
      [{ n: 0 }].map((r) => {
        const row = Object.create(null);
        row.n = r.n;
        return row;
      }),
    );
    db.close();

    // A statement sent before close() finishes.
    const again = await sqliteWorkerExecutor(path);
    const sent = again.query("INSERT INTO t VALUES ('kept') RETURNING v", []);
    await again.close();
    assert.deepEqual(plain(await sent), [{ v: "kept" }]);
  });
});

Deno.test("sqliteWorkerExecutor: a dead worker thread fails waiting and later calls with SqliteWorkerClosedError, nothing hangs", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    // A statement that runs for a while, so the thread dies with it pending.
    const long = worker.query(
      "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 30000000) SELECT count(*) AS n FROM c",
      [],
    );
    const behind = worker.query("SELECT 1", []);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await sqliteWorkerThreadOf(worker)!.terminate();
    for (const call of [long, behind, worker.query("SELECT 1", [])]) {
      await assert.rejects(
        call,
        (error: unknown) => error instanceof SqliteWorkerClosedError && error.reason === "exited",
      );
    }
    await worker.close();
  });
});

Deno.test("sqliteWorkerExecutor: a parameter that cannot cross to the thread rejects that call only", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    try {
      await assert.rejects(worker.query("SELECT ?1 AS x", [() => 1]));
      assert.deepEqual(plain(await worker.query("SELECT 2 AS x", [])), [{ x: 2 }]);
    } finally {
      await worker.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: the application enqueues on its own connection while the worker claims: every message claimed exactly once", async () => {
  await withFile(async (path) => {
    const db = openSqlite(path);
    db.exec("PRAGMA busy_timeout = 10000");
    const app = nodeSqliteExecutor(db);
    await migrate(app, { dialect: "sqlite" });
    const worker = await sqliteWorkerExecutor(path, { busyTimeoutMs: 10_000 });
    try {
      const relay = new SqlOutboxRepository(worker, "sqlite");
      const inTransaction = sqliteTransactionRunner(app);
      const total = 600;
      const keys = ["k1", "k2", undefined];
      let enqueued = 0;
      const enqueueing = (async () => {
        for (let i = 0; i < total; i += 3) {
          await inTransaction(async (tx: SqlExecutor) => {
            const outbox = new SqlOutboxRepository(tx, "sqlite");
            for (let j = i; j < i + 3; j++) {
              await outbox.enqueue({
                id: `m-${j}`,
                kind: "event.publish",
                name: "n",
                subject: "s",
                payload: String(j),
                headers: {},
                orderingKey: keys[j % 3],
              });
            }
          });
          enqueued += 3;
          if (i % 30 === 0) await new Promise((resolve) => setTimeout(resolve, 0));
        }
      })();
      const claimed: string[] = [];
      let done = false;
      void enqueueing.finally(() => done = true);
      while (true) {
        const batch = await relay.claimDue(25, new Date());
        claimed.push(...batch.map((message) => message.id));
        const marks = await relay.markMany(
          batch.map((claim) => ({ claim, state: "dispatched" as const })),
          new Date(),
        );
        assert.ok(marks.every(Boolean));
        if (batch.length === 0 && done) {
          if ((await relay.stats()).pending === 0) break;
        }
      }
      await enqueueing;
      assert.equal(enqueued, total);
      assert.equal(claimed.length, total);
      assert.equal(new Set(claimed).size, total);
      const stats = await relay.stats();
      assert.equal(stats.dispatched, total);
      // Each key's messages were claimed in enqueue order.
      for (const key of ["k1", "k2"]) {
        const order = claimed.map((id) => Number(id.slice(2))).filter((n) => keys[n % 3] === key);
        assert.deepEqual(order, [...order].sort((a, b) => a - b));
      }
    } finally {
      await worker.close();
      db.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: while a worker transaction holds the write lock, the calling thread's BEGIN IMMEDIATE waits its busy_timeout, then fails with SQLITE_BUSY", async () => {
  // The trade-off of a second connection: SQLite's busy handler blocks the calling thread. A
  // worker transaction that spans round trips cannot advance while that thread is blocked.
  await withFile(async (path) => {
    const db = openSqlite(path);
    db.exec("PRAGMA busy_timeout = 100");
    const worker = await sqliteWorkerExecutor(path);
    try {
      await worker.query("CREATE TABLE t (v TEXT)", []);
      let holding!: () => void;
      const held = new Promise<void>((resolve) => holding = resolve);
      let finish!: () => void;
      const tx = worker.transaction(async (tx) => {
        await tx.query("INSERT INTO t VALUES ('worker')", []);
        holding();
        await new Promise<void>((resolve) => finish = resolve);
      });
      await held;
      const started = performance.now();
      assert.throws(
        () => db.exec("BEGIN IMMEDIATE"),
        /database is locked/, // SQLITE_BUSY
      );
      assert.ok(performance.now() - started >= 90);
      finish();
      await tx;
      db.exec("BEGIN IMMEDIATE");
      db.exec("INSERT INTO t VALUES ('app')");
      db.exec("COMMIT");
      assert.deepEqual(
        plain(await worker.query("SELECT v FROM t ORDER BY rowid", [])).map((r) => r.v),
        ["worker", "app"],
      );
    } finally {
      await worker.close();
      db.close();
    }
  });
});

/** Settles `call` or, after `ms`, reports it as still pending (a hang). */
function settledWithin(call: Promise<unknown>, ms = 2_000): Promise<string> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    call.then(() => "fulfilled", (error) => `rejected: ${(error as Error)?.name}`),
    new Promise<string>((resolve) => timer = setTimeout(() => resolve("pending"), ms)),
  ]).finally(() => clearTimeout(timer));
}

Deno.test("sqliteWorkerExecutor: a second close() while the first waits does not end the thread under the statements sent before it", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    await worker.query("CREATE TABLE t (v TEXT)", []);
    // Sent before close(): close() promises they finish, whichever close() call ends the thread.
    const slow = outcome(worker.query(
      "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000000) SELECT count(*) AS n FROM c",
      [],
    ));
    const sent = outcome(worker.query("INSERT INTO t VALUES ('kept') RETURNING v", []));
    const closing = Promise.all([worker.close(), worker.close(), worker[Symbol.asyncDispose]()]);
    assert.deepEqual(await slow, { rows: [{ n: 2_000_000 }] });
    assert.deepEqual(await sent, { rows: [{ v: "kept" }] });
    await closing;
    const db = new DatabaseSync(path);
    assert.equal(db.prepare("SELECT count(*) AS n FROM t").all()[0].n, 1);
    db.close();
  });
});

Deno.test("sqliteWorkerExecutor: after close(), calls queued behind a transaction that never ends, and later calls, reject instead of hanging", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    await worker.query("CREATE TABLE t (v TEXT)", []);
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => entered = resolve);
    let release!: () => void;
    const never = new Promise<void>((resolve) => release = resolve);
    const stuck = worker.transaction(async (tx) => {
      await tx.query("INSERT INTO t VALUES ('x')", []);
      entered();
      await never; // an awaited call that does not come back (released at the end of the test)
    });
    await inside;
    const queued = settledWithin(worker.query("SELECT 1 AS one", []));
    const queuedTx = settledWithin(worker.transaction((tx) => tx.query("SELECT 1 AS one", [])));
    assert.equal(await settledWithin(worker.close()), "fulfilled");
    assert.equal(await queued, "rejected: SqliteWorkerClosedError");
    assert.equal(await queuedTx, "rejected: SqliteWorkerClosedError");
    assert.equal(
      await settledWithin(worker.query("SELECT 2", [])),
      "rejected: SqliteWorkerClosedError",
    );
    assert.equal(
      await settledWithin(worker.transaction(() => Promise.resolve(1))),
      "rejected: SqliteWorkerClosedError",
    );
    release();
    await assert.rejects(stuck, SqliteWorkerClosedError); // its COMMIT cannot run any more
    const db = new DatabaseSync(path);
    assert.equal(db.prepare("SELECT count(*) AS n FROM t").all()[0].n, 0); // rolled back
    db.close();
  });
});

Deno.test("sqliteWorkerExecutor: refuses the other spellings of a private database and URLs that are not file: URLs", async () => {
  for (
    const path of [
      "file:%3Amemory%3A", // SQLite decodes the name: ":memory:"
      "file:%3amemory%3a?cache=shared",
      "file:/outbox_mem.db?vfs=memdb", // the in-memory VFS
      "file:outbox_mem.db?mode=memory#x",
      new URL("http://example.com/tmp/outbox_http.db"),
    ]
  ) {
    await assert.rejects(
      sqliteWorkerExecutor(path),
      (error: unknown) => error instanceof OutboxValidationError && error.field === "path",
      String(path),
    );
  }
  await withFile(async (path) => {
    // A file: URL (percent-encoded) and a file: URI string still open the file.
    const spaced = path.replace(/app\.db$/, "my app.db");
    for (const location of [new URL(`file://${spaced}`), `file:${path}?cache=private`]) {
      const worker = await sqliteWorkerExecutor(location);
      await worker.query("CREATE TABLE IF NOT EXISTS t (v TEXT)", []);
      await worker.close();
    }
    await Deno.stat(spaced);
    await Deno.stat(path);
  });
});

Deno.test("sqliteWorkerExecutor: a parameter that cannot be mapped rejects the call (no synchronous throw), as on the calling thread", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    try {
      let call: Promise<unknown> | undefined;
      assert.doesNotThrow(() => call = worker.query("SELECT ?1 AS x", [new Date(NaN)]));
      await assert.rejects(call!, RangeError);
      assert.deepEqual(plain(await worker.query("SELECT 2 AS x", [])), [{ x: 2 }]);
    } finally {
      await worker.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: after the relay's thread dies, dispatcher.stop() does not retry marks on it until the lease ends", async () => {
  // A dead thread's executor never answers again: retrying a mark on it (as for a database
  // blip) only holds stop() for the rest of the lease. The claimed messages stay claimed and a
  // fresh relay publishes them again after the lease (deduplicated by Nats-Msg-Id).
  await withFile(async (path) => {
    const db = openSqlite(path);
    const nc = await connectNats();
    await using stream = await createTestStream(nc);
    const worker = await sqliteWorkerExecutor(path);
    try {
      const app = nodeSqliteExecutor(db);
      await migrate(app, { dialect: "sqlite" });
      const outbox = new SqlOutboxRepository(app, "sqlite");
      for (let i = 0; i < 5; i++) {
        await outbox.enqueue({
          id: `m-${i}`,
          kind: "event.publish",
          name: "n",
          subject: `${stream.prefix}.x`,
          payload: "{}",
          headers: {},
        });
      }
      const jetStreamRuntime = createJetStreamRuntime(jetstream(nc));
      let published!: () => void;
      const publishing = new Promise<void>((resolve) => published = resolve);
      let threadDead!: () => void;
      const dead = new Promise<void>((resolve) => threadDead = resolve);
      const leaseMs = 6_000;
      const dispatcher = new OutboxDispatcher(
        new SqlOutboxRepository(worker, "sqlite"),
        {
          // The broker acknowledges while the relay's thread dies: the marks come after it.
          async publishPreparedEvent(event, options) {
            const receipt = await jetStreamRuntime.publishPreparedEvent(event, options);
            published();
            await dead;
            return receipt;
          },
        },
        { leaseMs, onError: () => {} },
      );
      await publishing;
      await sqliteWorkerThreadOf(worker)!.terminate();
      threadDead();
      const started = performance.now();
      await dispatcher.stop();
      const stopMs = performance.now() - started;
      assert.ok(stopMs < leaseMs / 3, `stop() took ${Math.round(stopMs)} ms`);
      // Nothing was marked: the messages are still claimed, for a fresh relay after the lease.
      const stats = await outbox.stats();
      assert.equal(stats.dispatched, 0);
      assert.equal(stats.claimed, 5);
    } finally {
      await worker.close();
      await nc.close();
      db.close();
    }
  });
});

Deno.test("sqliteWorkerExecutor: a byte parameter binds its bytes at call time, as on the calling thread (a SharedArrayBuffer changed afterwards, a small view of a large buffer)", async () => {
  await withFile(async (path) => {
    const worker = await sqliteWorkerExecutor(path);
    try {
      for (let i = 0; i < 10; i++) {
        const shared = new Uint8Array(new SharedArrayBuffer(4));
        shared.set([1, 2, 3, 4]);
        const call = worker.query("SELECT hex(?1) AS h", [shared]);
        shared.fill(9); // after the call: nodeSqliteExecutor has bound 01020304 by now
        assert.deepEqual(plain(await call), [{ h: "01020304" }]);
      }

      // A view posts only its own bytes, not the whole buffer behind it: 20 calls with 3 bytes
      // of a 64 MiB buffer took seconds when each call copied the 64 MiB (49 ms per call for
      // 16 MiB measured), and need milliseconds.
      const large = new Uint8Array(64 * 1024 * 1024);
      large.set([7, 8, 9], 1_000);
      const view = large.subarray(1_000, 1_003);
      const started = performance.now();
      for (let i = 0; i < 20; i++) {
        assert.deepEqual(
          plain(await worker.query("SELECT hex(?1) AS h, ?2 AS n", [view, i])),
          [{ h: "070809", n: i }],
        );
      }
      const elapsed = performance.now() - started;
      assert.ok(elapsed < 1_000, `20 calls took ${Math.round(elapsed)} ms`);
      // Views of other types bind their bytes, as on the calling thread.
      const local = nodeSqliteExecutor(new DatabaseSync(":memory:"));
      for (
        const value of [
          new Float64Array([1.5]).subarray(0, 1),
          new DataView(large.buffer, 1_000, 2),
        ]
      ) {
        assert.deepEqual(
          plain(await worker.query("SELECT hex(?1) AS h", [value])),
          plain(await local.query("SELECT hex(?1) AS h", [value])),
        );
      }
    } finally {
      await worker.close();
    }
  });
});
