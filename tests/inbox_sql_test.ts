/**
 * Exactly-once processing with the SQL inbox in the handler's own transaction, on real NATS
 * JetStream with Postgres (postgres.js) and SQLite (node:sqlite, a WAL file).
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import postgres from "postgres";
import { AckPolicy, jetstream, jetstreamManager, type JsMsg } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  consumeWithInbox,
  type InboxConsumer,
  migrate,
  nodeSqliteExecutor,
  postgresJsExecutor,
  processOnce,
  type SqlExecutor,
  SqlInboxRepository,
  sqliteTransactionRunner,
  type TransactionRunner,
} from "../mod.ts";
import {
  connectNats,
  createTestDatabase,
  createTestStream,
  eventually,
  type TestStream,
} from "./kit/mod.ts";

/** Runs work in a transaction and resolves to its result. */
type Run = <T>(work: (tx: SqlExecutor) => Promise<T>) => Promise<T>;

/** A store the inbox lives in, with a business table `effects(id, applied)`. */
interface Store extends AsyncDisposable {
  name: string;
  run: Run;
  /** How many times the effect for `id` was applied. */
  applied(id: string): Promise<number>;
  /** Inbox rows for `id` (any consumer). */
  inboxRows(id: string): Promise<number>;
  /** Opens a second connection (another consumer instance). */
  peer(): Promise<{ run: TransactionRunner<SqlExecutor> } & AsyncDisposable>;
}

async function postgresStore(): Promise<Store> {
  const database = await createTestDatabase();
  const open = () => postgres(database.url, { max: 4, onnotice: () => {} });
  const sql = open();
  await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
  await sql`CREATE TABLE effects (id text PRIMARY KEY, applied int NOT NULL)`;
  const runner = (client: postgres.Sql): Run => (work) =>
    client.begin((tx) => work(postgresJsExecutor(tx))) as ReturnType<typeof work>;
  return {
    name: "postgres",
    run: runner(sql),
    async applied(id) {
      const [row] = await sql`SELECT applied FROM effects WHERE id = ${id}`;
      return row ? Number(row.applied) : 0;
    },
    async inboxRows(id) {
      const [row] =
        await sql`SELECT count(*)::int AS n FROM trellis_inbox WHERE message_id = ${id}`;
      return row.n;
    },
    peer() {
      const other = open();
      return Promise.resolve({
        run: runner(other),
        [Symbol.asyncDispose]: () => other.end(),
      });
    },
    async [Symbol.asyncDispose]() {
      await sql.end();
      await database[Symbol.asyncDispose]();
    },
  };
}

async function sqliteStore(): Promise<Store> {
  const dir = await Deno.makeTempDir({ prefix: "outbox-inbox-sqlite-" });
  const path = `${dir}/app.db`;
  const open = () => {
    const db = new DatabaseSync(path);
    db.exec("PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;");
    return db;
  };
  const db = open();
  const executor = nodeSqliteExecutor(db);
  await migrate(executor, { dialect: "sqlite" });
  db.exec("CREATE TABLE effects (id TEXT PRIMARY KEY, applied INTEGER NOT NULL)");
  const run = sqliteTransactionRunner(executor);
  return {
    name: "sqlite",
    run,
    applied(id) {
      const row = db.prepare("SELECT applied FROM effects WHERE id = ?").get(id);
      return Promise.resolve(row ? Number(row.applied) : 0);
    },
    inboxRows(id) {
      const row = db.prepare("SELECT count(*) AS n FROM trellis_inbox WHERE message_id = ?").get(
        id,
      );
      return Promise.resolve(Number(row?.n));
    },
    // node:sqlite is synchronous: a second connection in the same thread would block the event
    // loop on the first one's write lock (until busy_timeout). A second consumer instance in
    // one process shares the connection, whose runner queues transactions; across processes
    // each has its own connection (tests/faults).
    peer() {
      return Promise.resolve({ run, [Symbol.asyncDispose]: () => Promise.resolve() });
    },
    async [Symbol.asyncDispose]() {
      db.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** Applies the message's effect: increments `effects.applied` for its id. */
async function applyEffect(tx: SqlExecutor, id: string, dialect: string): Promise<void> {
  await tx.query(
    dialect === "postgres"
      ? "INSERT INTO effects (id, applied) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET applied = effects.applied + 1"
      : "INSERT INTO effects (id, applied) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET applied = effects.applied + 1",
    [id],
  );
}

async function jetstreamSetup(
  streamConfig: Record<string, unknown> = {},
  consumerConfig: Record<string, unknown> = {},
): Promise<{ nc: NatsConnection; stream: TestStream } & AsyncDisposable> {
  const nc = await connectNats();
  const stream = await createTestStream(nc, streamConfig);
  const jsm = await jetstreamManager(nc);
  await jsm.consumers.add(stream.name, {
    durable_name: "worker",
    ack_policy: AckPolicy.Explicit,
    ...consumerConfig,
  });
  return {
    nc,
    stream,
    async [Symbol.asyncDispose]() {
      await stream[Symbol.asyncDispose]();
      await nc.close();
    },
  };
}

async function consume(
  env: { nc: NatsConnection; stream: TestStream },
  store: { run: TransactionRunner<SqlExecutor> },
  dialect: "postgres" | "sqlite",
  handler: (message: JsMsg, tx: SqlExecutor, id: string, delivery: number) => Promise<void>,
  extra: { run?: TransactionRunner<SqlExecutor>; nakBaseMs?: number } = {},
): Promise<InboxConsumer> {
  const js = jetstream(env.nc);
  return await consumeWithInbox(await js.consumers.get(env.stream.name, "worker"), {
    scope: "worker",
    transaction: extra.run ?? store.run,
    inbox: (tx) => new SqlInboxRepository(tx, dialect),
    nakBackoff: { baseMs: extra.nakBaseMs ?? 20, capMs: Math.max(100, extra.nakBaseMs ?? 0) },
    handler: (message, { tx, messageId, deliveryCount }) =>
      handler(message, tx, messageId, deliveryCount),
  });
}

for (const open of [postgresStore, sqliteStore]) {
  const dialect = open === postgresStore ? "postgres" : "sqlite";

  Deno.test(`${dialect}: a redelivery after the handler committed but before the ack applies nothing`, async () => {
    await using store = await open();
    await using env = await jetstreamSetup();
    // The first delivery commits, then "crashes" before the ack: the runner throws after COMMIT,
    // so the loop naks instead of acking, exactly what a process dying there would cause.
    let crashed = false;
    const crashingRun: TransactionRunner<SqlExecutor> = async (work) => {
      const result = await store.run(work);
      if (!crashed) {
        crashed = true;
        throw new Error("process died after COMMIT, before ack");
      }
      return result;
    };
    const deliveries: number[] = [];
    const running = await consume(env, store, dialect, async (_m, tx, id, delivery) => {
      deliveries.push(delivery);
      await applyEffect(tx, id, dialect);
    }, { run: crashingRun });
    await jetstream(env.nc).publish(`${env.stream.prefix}.a`, "x", { msgID: "order-1" });
    await eventually(() => assert.equal(running.stats.duplicates, 1), { timeoutMs: 10_000 });
    await running.stop();
    assert.deepEqual(deliveries, [1], "the handler ran once; the redelivery was a duplicate");
    assert.equal(await store.applied("order-1"), 1);
    assert.equal(await store.inboxRows("order-1"), 1);
  });

  Deno.test(`${dialect}: a failed handler leaves no inbox row and its redelivery succeeds`, async () => {
    await using store = await open();
    await using env = await jetstreamSetup();
    const running = await consume(env, store, dialect, async (_m, tx, id, delivery) => {
      await applyEffect(tx, id, dialect); // rolled back with the inbox row when we throw
      if (delivery === 1) throw new Error("downstream said no");
    }, { nakBaseMs: 1_500 });
    await jetstream(env.nc).publish(`${env.stream.prefix}.a`, "x", { msgID: "order-2" });
    // Between the failure and the redelivery (naked for 1.5 s), the database holds nothing.
    await eventually(() => assert.equal(running.stats.failed, 1), { timeoutMs: 10_000 });
    assert.equal(running.stats.processed, 0);
    assert.equal(await store.inboxRows("order-2"), 0, "the failed attempt left no inbox row");
    assert.equal(await store.applied("order-2"), 0, "nor its effect");
    await eventually(() => assert.equal(running.stats.processed, 1), { timeoutMs: 10_000 });
    await running.stop();
    assert.equal(await store.applied("order-2"), 1);
    assert.equal(await store.inboxRows("order-2"), 1);
  });

  Deno.test(`${dialect}: concurrent deliveries of one id to two consumer instances take effect once`, async () => {
    await using store = await open();
    await using peer = await store.peer();
    // A 100 ms duplicate window (the server's minimum) lets the same Nats-Msg-Id be stored
    // several times: the copies a re-publish outside the window would produce. The server
    // forgets ids when its purge timer fires, which can run late on a loaded machine (nats-server
    // 2.15 in CI once kept 3 of 20 ids past 150 ms): the copies are 500 ms apart.
    await using env = await jetstreamSetup({ duplicate_window: 100_000_000 });
    const js = jetstream(env.nc);
    const ids = Array.from({ length: 20 }, (_, i) => `dup-${i}`);
    for (let copy = 0; copy < 3; copy++) {
      for (const id of ids) await js.publish(`${env.stream.prefix}.a`, id, { msgID: id });
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
    const info = await (await jetstreamManager(env.nc)).streams.info(env.stream.name);
    assert.equal(info.state.messages, 60, "three stored copies of each id");
    const slowEffect = async (_m: JsMsg, tx: SqlExecutor, id: string) => {
      await applyEffect(tx, id, dialect);
      await new Promise((resolve) => setTimeout(resolve, 5)); // hold the transaction open
    };
    const first = await consume(env, store, dialect, slowEffect);
    const second = await consume(env, store, dialect, slowEffect, { run: peer.run });
    await eventually(() => {
      const done = first.stats.processed + first.stats.duplicates + second.stats.processed +
        second.stats.duplicates;
      assert.equal(done, 60);
    }, { timeoutMs: 20_000 });
    await Promise.all([first.stop(), second.stop()]);
    assert.equal(first.stats.processed + second.stats.processed, 20);
    for (const id of ids) assert.equal(await store.applied(id), 1, id);
  });

  Deno.test(`${dialect}: a poison message is terminated after max_deliver with nothing applied`, async () => {
    await using store = await open();
    await using env = await jetstreamSetup({}, { max_deliver: 3 });
    const poisoned: string[] = [];
    const running = await consume(env, store, dialect, async (_m, tx, id) => {
      await applyEffect(tx, id, dialect);
      throw new Error("cannot apply");
    });
    const js = jetstream(env.nc);
    await js.publish(`${env.stream.prefix}.a`, "x", { msgID: "poison-1" });
    await eventually(() => assert.equal(running.stats.poisoned, 1), { timeoutMs: 10_000 });
    await running.stop();
    poisoned.push("poison-1");
    assert.equal(running.stats.failed, 3);
    assert.equal(await store.applied("poison-1"), 0);
    assert.equal(await store.inboxRows("poison-1"), 0);
  });

  Deno.test(`${dialect}: processOnce records and works in the caller's transaction`, async () => {
    await using store = await open();
    const work = (tx: SqlExecutor) =>
      processOnce(
        new SqlInboxRepository(tx, dialect),
        { messageId: "p-1", consumer: "c" },
        () => applyEffect(tx, "p-1", dialect),
      );
    assert.equal((await store.run(work)).duplicate, false);
    assert.equal((await store.run(work)).duplicate, true);
    await assert.rejects(
      store.run(async (tx) => {
        await processOnce(
          new SqlInboxRepository(tx, dialect),
          { messageId: "p-2" },
          () => applyEffect(tx, "p-2", dialect),
        );
        throw new Error("rolled back");
      }),
      /rolled back/,
    );
    assert.equal(await store.applied("p-1"), 1);
    assert.equal(await store.applied("p-2"), 0);
    assert.equal(await store.inboxRows("p-2"), 0);
  });
}
