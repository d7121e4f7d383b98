/**
 * consumeWithInbox from the installed package on Node, with a SQL inbox in the handler's own
 * transaction (Postgres through postgres.js, SQLite through node:sqlite and better-sqlite3), on real JetStream:
 * every message takes effect once, a failed handler rolls back its writes and its inbox id and
 * runs again on redelivery, and an id already recorded is acked without the handler.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import postgres from "postgres";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  migrate,
  postgresJsExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlInboxRepository,
} from "@outbox/nats";
import { eventually, natsUrl, postgresUrl, uniqueName } from "./servers.ts";
import { sqliteDrivers } from "./sqlite_drivers.ts";

const count = 20;
const failOnce = "m-7";

/** A database for the consumer: business table `applied`, inbox tables, a transaction runner. */
interface ConsumerDatabase {
  dialect: SqlDialect;
  tables: { outbox: string; inbox: string };
  applied: string;
  executor: SqlExecutor;
  transaction<T>(work: (tx: SqlExecutor) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

async function withStream(
  run: (nc: NatsConnection, stream: string, subject: string) => Promise<void>,
): Promise<void> {
  const nc = await connect({ servers: natsUrl() });
  const stream = uniqueName("node_inbox");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
  await jsm.consumers.add(stream, {
    durable_name: "billing",
    ack_policy: AckPolicy.Explicit,
    max_deliver: 5,
  });
  try {
    await run(nc, stream, `${stream}.orders`);
  } finally {
    await jsm.streams.delete(stream).catch(() => false);
    await nc.close();
  }
}

async function exactlyOnce(db: ConsumerDatabase): Promise<void> {
  const p = db.dialect === "postgres" ? (n: number) => `$${n}` : (n: number) => `?${n}`;
  await migrate(db.executor, { dialect: db.dialect, tables: db.tables });
  await db.executor.query(
    `CREATE TABLE ${db.applied} (id TEXT PRIMARY KEY, delivery INTEGER NOT NULL)`,
    [],
  );
  // As if m-dup had been processed before and only its ack was lost.
  await new SqlInboxRepository(db.executor, db.dialect, db.tables).record("m-dup", {
    consumer: "billing",
  });

  await withStream(async (nc, stream, subject) => {
    const js = jetstream(nc);
    for (const id of ["m-dup", ...Array.from({ length: count }, (_, i) => `m-${i}`)]) {
      await js.publish(subject, JSON.stringify({ id }), { msgID: id });
    }
    const duplicates: string[] = [];
    const failures: unknown[] = [];
    const running = await consumeWithInbox(await js.consumers.get(stream, "billing"), {
      scope: "billing",
      transaction: (work) => db.transaction(work),
      inbox: (tx: SqlExecutor) => new SqlInboxRepository(tx, db.dialect, db.tables),
      nakBackoff: { baseMs: 20, capMs: 20 },
      handler: async (_message, { tx, messageId, deliveryCount }) => {
        await tx.query(`INSERT INTO ${db.applied} (id, delivery) VALUES (${p(1)}, ${p(2)})`, [
          messageId,
          deliveryCount,
        ]);
        // The write above and the inbox id must both roll back.
        if (messageId === failOnce && deliveryCount === 1) throw new Error("first delivery fails");
      },
      onDuplicate: (_message, id) => duplicates.push(id),
      onError: (error) => failures.push(error),
    });
    try {
      await eventually(() => {
        assert.equal(running.stats.processed, count);
        assert.equal(running.stats.duplicates, 1);
      });
    } finally {
      await running.stop();
    }
    assert.deepEqual(duplicates, ["m-dup"]);
    assert.equal(running.stats.failed, 1);
    assert.equal(failures.length, 1);
  });

  const rows = await db.executor.query(`SELECT id, delivery FROM ${db.applied} ORDER BY id`, []);
  assert.equal(rows.length, count, "each message applied once, m-dup never");
  assert.deepEqual(
    rows.map((row) => row.id).sort(),
    Array.from({ length: count }, (_, i) => `m-${i}`).sort(),
  );
  const retried = rows.find((row) => row.id === failOnce)!;
  assert.equal(Number(retried.delivery), 2, "the rolled-back first delivery left nothing");
  const ids = await db.executor.query(
    `SELECT message_id FROM ${db.tables.inbox} WHERE consumer = ${p(1)}`,
    ["billing"],
  );
  assert.equal(ids.length, count + 1);
}

test("node: consumeWithInbox with a Postgres inbox (postgres.js) in the handler's transaction", async () => {
  const sql = postgres(postgresUrl(), { max: 2, onnotice: () => {} });
  const base = uniqueName("ob_node_inbox");
  const db: ConsumerDatabase = {
    dialect: "postgres",
    tables: { outbox: `${base}_o`, inbox: `${base}_i` },
    applied: `${base}_applied`,
    executor: postgresJsExecutor(sql),
    transaction: <T>(work: (tx: SqlExecutor) => Promise<T>) =>
      sql.begin((tx) => work(postgresJsExecutor(tx))) as Promise<T>,
    close: () => sql.end(),
  };
  try {
    await exactlyOnce(db);
  } finally {
    await sql.unsafe(
      `DROP TABLE IF EXISTS ${db.applied}, ${db.tables.outbox}, ${db.tables.inbox}, ${db.tables.outbox}_migrations, ${db.tables.outbox}_keys`,
    ).catch(() => {});
    await db.close();
  }
});

for (const driver of sqliteDrivers) {
  test(`node: consumeWithInbox with a SQLite inbox (${driver.name}) in the handler's transaction`, {
    skip: driver.skip,
  }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "outbox-node-inbox-"));
    const sqlite = driver.open(join(dir, "billing.db"));
    const executor = sqlite.executor;
    const db: ConsumerDatabase = {
      dialect: "sqlite",
      tables: { outbox: "app_outbox", inbox: "app_inbox" },
      applied: "applied",
      executor,
      transaction: (work) => executor.transaction!(work),
      close: () => Promise.resolve(void sqlite.close()),
    };
    try {
      await exactlyOnce(db);
    } finally {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
