/**
 * consumeWithInbox with the SQL inbox in the handler's Postgres transaction (postgres.js), as the
 * docs show it: the runner is `(work) => sql.begin((tx) => work(tx))` (this file also checks that
 * it type-checks). A handler failure rolls back its writes and the inbox id together; the
 * redelivery applies the message once; an id already recorded is acked without the handler. The fault suite kills such a consumer between COMMIT and
 * ack (tests/faults/inbox_redelivery_test.ts).
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  migrate,
  postgresJsExecutor,
  SqlInboxRepository,
  type TransactionRunner,
} from "../mod.ts";
import { connectNats, createTestDatabase, createTestStream, eventually } from "./kit/mod.ts";

Deno.test("SQL inbox in the handler's transaction: a failed handler rolls back its writes and the id; each message applied once", async () => {
  await using db = await createTestDatabase();
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  const nc = await connectNats();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
    await sql`CREATE TABLE counters (id text PRIMARY KEY, n integer NOT NULL)`;
    await using stream = await createTestStream(nc);
    await (await jetstreamManager(nc)).consumers.add(stream.name, {
      durable_name: "billing",
      ack_policy: AckPolicy.Explicit,
    });
    const js = jetstream(nc);
    const runInTransaction: TransactionRunner<postgres.TransactionSql> = (work) =>
      sql.begin((tx) => work(tx));
    let failures = 0;
    const running = await consumeWithInbox(await js.consumers.get(stream.name, "billing"), {
      scope: "billing",
      transaction: runInTransaction,
      inbox: (tx: postgres.TransactionSql) =>
        new SqlInboxRepository(postgresJsExecutor(tx), "postgres"),
      nakBackoff: { baseMs: 10, capMs: 20 },
      handler: async (_message, { tx, messageId, deliveryCount }) => {
        await tx`
          INSERT INTO counters (id, n) VALUES (${messageId}, 1)
          ON CONFLICT (id) DO UPDATE SET n = counters.n + 1`;
        if (messageId === "m-3" && deliveryCount < 3) {
          failures += 1;
          throw new Error("fails after its write: the write must roll back");
        }
      },
    });
    // m-7 was processed before, its ack lost: the redelivery must not run the handler.
    await new SqlInboxRepository(postgresJsExecutor(sql), "postgres").record("m-7", {
      consumer: "billing",
    });
    for (let i = 0; i < 10; i++) {
      await js.publish(`${stream.prefix}.billing`, "{}", { msgID: `m-${i}` });
    }
    await eventually(async () => {
      assert.equal(running.stats.processed + running.stats.duplicates, 10);
      const [{ n }] = await sql`SELECT count(*)::int AS n FROM counters`;
      assert.equal(n, 9);
    });
    await running.stop();
    const rows = await sql`SELECT id, n FROM counters ORDER BY id`;
    assert.ok(rows.every((row) => row.n === 1), JSON.stringify(rows));
    assert.ok(!rows.some((row) => row.id === "m-7"), "the known id was not applied again");
    assert.equal(failures, 2, "m-3 failed twice, then applied once");
    assert.equal(running.stats.duplicates, 1);
    const [{ inbox }] = await sql`
      SELECT count(*)::int AS inbox FROM trellis_inbox WHERE consumer = 'billing'`;
    assert.equal(inbox, 10, "nine processed ids and the one recorded before");
  } finally {
    await nc.close();
    await sql.end();
  }
});
