/**
 * Scenario: one connection for everything, as a small service runs it. The service's business
 * transactions (10% rolled back after the enqueue), the dispatcher and the inbox consumer
 * (concurrency 4, 10% of first deliveries failing after their writes) share ONE database
 * connection: a SQLite handle, then a single `pg.Client`. Each component creates its own
 * executor over that connection, as independent modules of a service would.
 *
 * Nothing phantom may reach the stream (no id of a rolled-back transaction), nothing may be
 * published twice, and every message the consumer acked must have its effects and its inbox row.
 */

import assert from "node:assert/strict";
// @ts-types="@types/pg"
import pg from "pg";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  createJetStreamRuntime,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  pgExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../../mod.ts";
import { createTestDatabase, createTestStream, eventually } from "../kit/mod.ts";
import { openSqlite } from "../sql/harness.ts";
import { figures, natsConnection, readStreamIds, since, tempDir } from "./harness.ts";

const workers = 4;

class Rollback extends Error {}

/** Deterministic 10% choices, spread over the ids. */
const rolledBack = (i: number) => i % 10 === 3;
const failsFirst = (i: number) => i % 10 === 7;

async function scenario(
  name: string,
  orders: number,
  dialect: SqlDialect,
  executor: () => SqlExecutor,
  tables: { rows(table: string): Promise<string[]> },
): Promise<void> {
  const p = (n: number) => dialect === "postgres" ? `$${n}` : "?";
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  await (await jetstreamManager(nats.nc)).consumers.add(stream.name, {
    durable_name: "shipping",
    ack_policy: AckPolicy.Explicit,
    ack_wait: 10_000_000_000,
    max_deliver: -1,
  });
  const js = jetstream(nats.nc);
  const started = performance.now();

  const dispatcher = new OutboxDispatcher(
    new SqlOutboxRepository(executor(), dialect),
    createJetStreamRuntime(js),
    { idleRetryMs: 10, limit: 50 },
  );
  const consumer = await consumeWithInbox(await js.consumers.get(stream.name, "shipping"), {
    scope: "shipping",
    concurrency: 4,
    nakBackoff: { baseMs: 10, capMs: 50 },
    transaction: (work) => executor().transaction!(work),
    inbox: (tx: SqlExecutor) => new SqlInboxRepository(tx, dialect),
    handler: async (message, { tx, messageId, deliveryCount }) => {
      const i = Number(message.json<{ i: number }>().i);
      await tx.query(`INSERT INTO shipments (id) VALUES (${p(1)})`, [messageId]);
      await new Promise((resolve) => setTimeout(resolve, 1)); // hold the transaction open
      if (failsFirst(i) && deliveryCount === 1) throw new Error("carrier API said no");
    },
  });

  const committed: string[] = [];
  const service = async (worker: number) => {
    const orderExecutor = executor();
    for (let i = worker; i < orders; i += workers) {
      const id = `order-${i}`;
      try {
        await orderExecutor.transaction!(async (tx) => {
          await tx.query(`INSERT INTO orders (id) VALUES (${p(1)})`, [id]);
          await new SqlOutboxRepository(tx, dialect).enqueue({
            id,
            kind: "event.publish",
            name: "order.created",
            subject: `${stream.prefix}.orders`,
            payload: JSON.stringify({ i }),
            headers: {},
          });
          // Other work of the request: the dispatcher and the consumer run meanwhile.
          await new Promise((resolve) => setTimeout(resolve, i % 3));
          if (rolledBack(i)) throw new Rollback("payment declined");
        });
        committed.push(id);
        dispatcher.notify();
      } catch (error) {
        if (!(error instanceof Rollback)) throw error;
      }
    }
  };
  await Promise.all(Array.from({ length: workers }, (_, w) => service(w)));
  assert.equal(committed.length, orders * 0.9);

  await eventually(() => assert.equal(consumer.stats.processed, committed.length), {
    timeoutMs: 20_000,
    intervalMs: 50,
  });
  await consumer.stop();
  await dispatcher.stop();
  const elapsedMs = since(started);

  const expected = [...committed].sort();
  const streamIds = await readStreamIds(nats.nc, stream.name);
  const phantom = streamIds.filter((id) => !committed.includes(id));
  assert.deepEqual(phantom, [], "no id of a rolled-back transaction reached the stream");
  assert.equal(streamIds.length, committed.length, "each committed order published once");
  assert.deepEqual(await tables.rows("orders"), expected);
  assert.deepEqual(await tables.rows("shipments"), expected, "every acked message's effects");
  assert.deepEqual(await tables.rows("inbox"), expected, "and its inbox row");
  figures(`shared ${name} connection`, {
    orders,
    committed: committed.length,
    published: streamIds.length,
    phantom: phantom.length,
    processed: consumer.stats.processed,
    failedAttempts: consumer.stats.failed,
    elapsedMs,
  });
}

Deno.test("one SQLite connection shared by the service, the dispatcher and the inbox consumer: nothing phantom, every acked effect present", async () => {
  await using dir = await tempDir("outbox_shared_conn_");
  const db = openSqlite(`${dir.path}/app.db`);
  try {
    await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
    db.exec(
      "CREATE TABLE orders (id TEXT PRIMARY KEY); CREATE TABLE shipments (id TEXT PRIMARY KEY)",
    );
    const rows = (table: string) => {
      const sql = table === "inbox"
        ? "SELECT message_id AS id FROM trellis_inbox ORDER BY 1"
        : `SELECT id FROM ${table} ORDER BY 1`;
      return Promise.resolve(db.prepare(sql).all().map((row) => String(row.id)));
    };
    await scenario("SQLite", 400, "sqlite", () => nodeSqliteExecutor(db), { rows });
  } finally {
    db.close();
  }
});

Deno.test("one pg.Client shared by the service, the dispatcher and the inbox consumer: nothing phantom, every acked effect present", async () => {
  await using database = await createTestDatabase();
  const client = new pg.Client({ connectionString: database.url });
  await client.connect();
  const reader = new pg.Client({ connectionString: database.url });
  await reader.connect();
  try {
    await migrate(pgExecutor(client), { dialect: "postgres" });
    await client.query("CREATE TABLE orders (id text PRIMARY KEY)");
    await client.query("CREATE TABLE shipments (id text PRIMARY KEY)");
    const rows = async (table: string) => {
      const sql = table === "inbox"
        ? "SELECT message_id AS id FROM trellis_inbox ORDER BY 1"
        : `SELECT id FROM ${table} ORDER BY 1`;
      return (await reader.query(sql)).rows.map((row) => String(row.id));
    };
    // Every statement of all three goes through one connection, one round trip at a time.
    await scenario("pg.Client", 200, "postgres", () => pgExecutor(client), { rows });
  } finally {
    await reader.end();
    await client.end();
  }
});
