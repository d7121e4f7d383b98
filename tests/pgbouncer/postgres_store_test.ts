/**
 * The Postgres store through a private PgBouncer in transaction pooling mode (the way many
 * production deployments reach Postgres): claims, marks and the rest of the conformance suite,
 * outbox rows in the caller's transaction, the SQL inbox in the handler's transaction, the relay
 * end to end to JetStream; and LISTEN/NOTIFY, which does not work through it, detected and turned
 * into polling with a warning.
 *
 * postgres.js runs with `prepare: false` here, as its documentation asks behind a transaction
 * pooler (PgBouncer before 1.21 does not track prepared statements).
 *
 * Needs the `pgbouncer` binary: `scripts/install_pgbouncer.sh`. Run with `deno task test:pgbouncer`.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  createJetStreamRuntime,
  listenForOutboxWakeups,
  migrate,
  OutboxDispatcher,
  type OutboxRecord,
  postgresJsExecutor,
  processOnce,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../../mod.ts";
import {
  connectNats,
  createTestDatabase,
  createTestStream,
  eventually,
  type TestDatabase,
} from "../kit/mod.ts";
import { PgBouncer } from "../kit/pgbouncer.ts";
import { testConformance } from "../conformance/deno.ts";
import { postgresJsHarnessAt } from "../sql/harness.ts";

let shared: Promise<{ bouncer: PgBouncer; db: TestDatabase }> | undefined;
/** One PgBouncer and one database for this file, stopped and dropped when it unloads. */
function bouncer(): Promise<{ bouncer: PgBouncer; db: TestDatabase }> {
  shared ??= (async () => {
    const db = await createTestDatabase();
    const bouncer = await PgBouncer.start({ upstream: db.url, poolMode: "transaction" });
    globalThis.addEventListener("unload", () => bouncer.stopSync());
    return { bouncer, db };
  })();
  return shared;
}

async function pooledUrl(): Promise<string> {
  const { bouncer: b, db } = await bouncer();
  return b.urlFor(db.name);
}

const pooled = async (max = 4) =>
  postgres(await pooledUrl(), { max, prepare: false, onnotice: () => {} });

let n = 0;
function record(prefix = "orders", id = `pgb-${++n}`): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "order.created",
    subject: `${prefix}.created`,
    payload: JSON.stringify({ n }),
    headers: {},
  };
}

testConformance(
  postgresJsHarnessAt("postgres (postgres.js) through PgBouncer, transaction pooling", pooledUrl, {
    prepare: false,
  }),
);

Deno.test("PgBouncer (transaction pooling): LISTEN gets no notifications; listenForOutboxWakeups warns and falls back to polling", async () => {
  const sql = await pooled(1);
  const direct = postgres((await bouncer()).db.url, { max: 1, onnotice: () => {} });
  try {
    const warnings: string[] = [];
    const wakes: string[] = [];
    const subscription = await listenForOutboxWakeups(sql, {
      channel: "outbox_pgbouncer_check",
      onWake: (reason) => wakes.push(reason),
      onWarning: (message) => warnings.push(message),
      verifyTimeoutMs: 1_000,
    });
    assert.equal(subscription.mode, "polling");
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /receives no notifications .*PgBouncer/);
    await subscription.close();

    // The same call on a direct connection listens (and the check notification is not a wake).
    const listening = await listenForOutboxWakeups(direct, {
      channel: "outbox_pgbouncer_check",
      onWake: (reason) => wakes.push(reason),
      onWarning: (message) => warnings.push(message),
    });
    assert.equal(listening.mode, "listen");
    assert.equal(warnings.length, 1);
    await listening.close();
    assert.ok(!wakes.includes("notify"), `no wake from the check notifications: ${wakes}`);
  } finally {
    await sql.end();
    await direct.end();
  }
});

Deno.test("PgBouncer (transaction pooling): outbox rows commit and roll back with the caller's transaction", async () => {
  const sql = await pooled();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
    await sql`CREATE TABLE IF NOT EXISTS pgb_orders (id text PRIMARY KEY)`;
    const rolledBack = record();
    await assert.rejects(
      sql.begin(async (tx) => {
        await tx`INSERT INTO pgb_orders VALUES (${rolledBack.id})`;
        await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueue(rolledBack);
        throw new Error("rolled back");
      }),
      /rolled back/,
    );
    const committed = record();
    await sql.begin(async (tx) => {
      await tx`INSERT INTO pgb_orders VALUES (${committed.id})`;
      await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueue(committed);
    });
    const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres");
    assert.equal(await outbox.get(rolledBack.id), undefined);
    assert.equal((await outbox.get(committed.id))?.state, "pending");
    assert.deepEqual(
      [...await sql`SELECT id FROM pgb_orders WHERE id IN (${rolledBack.id}, ${committed.id})`],
      [{ id: committed.id }],
    );
  } finally {
    await sql.end();
  }
});

Deno.test("PgBouncer (transaction pooling): the SQL inbox in the handler's transaction applies each message once", async () => {
  const sql = await pooled();
  try {
    await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
    await sql`CREATE TABLE IF NOT EXISTS pgb_effects (id text PRIMARY KEY, n int NOT NULL)`;
    const apply = (id: string, fail = false) =>
      sql.begin(async (tx) => {
        const inbox = new SqlInboxRepository(postgresJsExecutor(tx), "postgres");
        return await processOnce(inbox, { messageId: id, consumer: "pgb" }, async () => {
          await tx`INSERT INTO pgb_effects VALUES (${id}, 1)
            ON CONFLICT (id) DO UPDATE SET n = pgb_effects.n + 1`;
          if (fail) throw new Error("handler failed");
        });
      });
    const id = `inbox-${crypto.randomUUID()}`;
    await assert.rejects(apply(id, true), /handler failed/);
    assert.deepEqual(await apply(id), { duplicate: false, value: undefined });
    assert.deepEqual(await apply(id), { duplicate: true });
    const concurrent = `inbox-${crypto.randomUUID()}`;
    const results = await Promise.allSettled([apply(concurrent), apply(concurrent)]);
    const fresh = results.filter((r) => r.status === "fulfilled" && !r.value.duplicate);
    assert.equal(fresh.length, 1, JSON.stringify(results));
    assert.deepEqual(
      [...await sql`SELECT id, n FROM pgb_effects WHERE id IN (${id}, ${concurrent}) ORDER BY id`]
        .map((row) => row.n),
      [1, 1],
    );
  } finally {
    await sql.end();
  }
});

Deno.test("PgBouncer (transaction pooling): a dispatcher relays through it to JetStream by polling, with LISTEN detected as unusable", async () => {
  const sql = await pooled();
  await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
  const nc = await connectNats();
  const stream = await createTestStream(nc);
  const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", undefined, {
    notify: true,
  });
  const dispatcher = new OutboxDispatcher(
    outbox,
    createJetStreamRuntime(jetstream(nc)),
    { limit: 50, idleRetryMs: 100 },
  );
  const subscription = await listenForOutboxWakeups(sql, {
    onWake: () => dispatcher.notify(),
    onWarning: () => {},
    verifyTimeoutMs: 500,
  });
  try {
    assert.equal(subscription.mode, "polling");
    const records = Array.from({ length: 200 }, () => record(stream.prefix));
    await sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", undefined, { notify: true })
        .enqueueMany(records)
    );
    await eventually(async () => {
      for (const r of [records[0], records.at(-1)!]) {
        assert.equal((await outbox.get(r.id))?.state, "dispatched");
      }
    }, { timeoutMs: 30_000, intervalMs: 100 });
    const info = await (await jetstreamManager(nc)).streams.info(stream.name);
    assert.equal(info.state.messages, records.length);
  } finally {
    await dispatcher.stop();
    await subscription.close();
    await stream[Symbol.asyncDispose]();
    await nc.close();
    await sql.end();
  }
});

Deno.test("PgBouncer: stop the shared instance and drop its database", async () => {
  if (!shared) return;
  const { bouncer: b, db } = await shared;
  await b.stop();
  await db[Symbol.asyncDispose]();
});
