/**
 * The key fence on the SQL stores (schema version 4): the claim reads each keyed row's key
 * sequence through the key table's primary key (constant cost, checked on the plans); the key
 * sequence is written in the mark statement (Postgres) or just before it (SQLite), so a mark
 * that fails leaves a key sequence at which a message of the key IS stored (the previous one's,
 * or on SQLite this one's), which the broker and the runtime recognise: with real Postgres and
 * JetStream, nothing is lost, duplicated or reordered.
 */

import assert from "node:assert/strict";
import { jetstream } from "@nats-io/jetstream";
import postgres from "postgres";
import {
  createJetStreamRuntime,
  dispatchOutbox,
  migrate,
  nodeSqliteExecutor,
  OutboxValidationError,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { connectNats, createTestStream, postgresUrl } from "./kit/mod.ts";
import { explainRolledBack, planNodes } from "./sql/plan.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";
import { streamIds } from "./helpers/dispatch.ts";

/** An executor whose next `failures` statements matching `pattern` throw before running. */
function failing(executor: SqlExecutor, pattern: RegExp) {
  const state = { failures: 0 };
  const wrap = (inner: SqlExecutor): SqlExecutor => {
    const wrapped: SqlExecutor = {
      query(sql, params) {
        if (state.failures > 0 && pattern.test(sql)) {
          state.failures -= 1;
          return Promise.reject(new Error("connection reset (simulated)"));
        }
        return inner.query(sql, params);
      },
    };
    if (inner.transaction) wrapped.transaction = (fn) => inner.transaction!((tx) => fn(wrap(tx)));
    return wrapped;
  };
  return { executor: wrap(executor), state };
}

/** The mark statement (Postgres: also the one that records key sequences). */
const markStatement = /^(WITH (nexts|fence_marks) AS|UPDATE \S+ AS t SET state = m\.state)/;

Deno.test("postgres: the claim reads key sequences through the key table's primary key; recording them (in the mark statement) probes it per mark", async () => {
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const o = tables.outbox;
    const keys = 5_000;
    await sql.unsafe(
      `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
       SELECT 'm-' || k || '-' || i, 'event.publish', 'b', 'b.s', 'x', '{}'::jsonb, 'pending', 0, now(), now(), 'key-' || k, i = 0
       FROM generate_series(0, 3) AS i, generate_series(1, ${keys}) AS k ORDER BY i, k`,
    );
    await sql.unsafe(
      `INSERT INTO ${o}_keys (ordering_key, stream_seq) SELECT 'key-' || k, k FROM generate_series(1, ${keys}) AS k`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${o}`);
    await sql.unsafe(`VACUUM ANALYZE ${o}_keys`);
    const statements = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
    const now = new Date(Date.now() + 1_000).toISOString();
    const lease = new Date(Date.now() + 31_000).toISOString();
    const claim = planNodes(
      await explainRolledBack(sql, `EXPLAIN (ANALYZE, FORMAT JSON) ${statements.claim}`, [
        now,
        lease,
        100,
        "plan-token",
      ]),
    );
    assert.ok(claim.some((node) => node["Index Name"] === `${o}_keys_pkey`), "keys primary key");
    assert.ok(!claim.some((node) => node["Node Type"] === "Seq Scan"), "no sequential scan");
    // The real claim: every claimed head carries its key's sequence.
    const outbox = new SqlOutboxRepository(executor, "postgres", tables);
    const claimed = await outbox.claimDue(100, new Date(now));
    assert.equal(claimed.length, 100);
    for (const message of claimed) {
      assert.equal(message.keySequence, Number(message.orderingKey!.slice(4)), message.id);
    }
    const marks = JSON.stringify(claimed.map((message, index) => ({
      id: message.id,
      attempts: message.attempts,
      lease: null,
      token: message.claimToken,
      state: index % 10 === 0 ? "dead" : "dispatched",
      sequence: index % 10 === 0 ? null : 100_000 + index,
    })));
    const plan = await explainRolledBack(
      sql,
      `EXPLAIN (ANALYZE, FORMAT JSON) ${statements.markManyRecordingKeys}`,
      [marks, new Date(now).toISOString()],
    );
    // The fence's own CTEs (the mark statement's plan is tests/sql_claim_plan_test.ts's).
    const fence = (plan.Plans ?? []).filter((node) =>
      String((node as { "Subplan Name"?: string })["Subplan Name"]).startsWith("CTE fence_")
    ).flatMap(planNodes);
    assert.equal(
      (plan.Plans ?? []).filter((node) =>
        String((node as { "Subplan Name"?: string })["Subplan Name"]).startsWith("CTE fence_")
      ).length,
      3,
    );
    // The marks' rows are those the mark statement changed (its `settled` CTE), not re-read.
    assert.ok(!fence.some((node) => node["Relation Name"] === o), "no read of the outbox");
    assert.ok(
      fence.some((node) => (node as { "CTE Name"?: string })["CTE Name"] === "settled"),
      "the settled rows",
    );
    assert.ok(fence.some((node) => node["Index Name"] === `${o}_keys_pkey`), "key rows by key");
    assert.ok(!fence.some((node) => node["Node Type"] === "Seq Scan"), JSON.stringify(fence));
    const [{ n }] = await sql.unsafe(`SELECT count(*)::int AS n FROM ${o}_keys`);
    assert.equal(n, keys, "nothing was written: the EXPLAIN ANALYZE was rolled back");
  } finally {
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
});

Deno.test("sqlite: the claim and the recording of key sequences search the key table's primary key", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_fence_plan_" });
  const db = openSqlite(`${dir}/o.db`);
  try {
    await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
    const statements = outboxStatements("sqlite", resolveSqlOutboxTables(), false);
    const plan = (text: string) =>
      db.prepare(`EXPLAIN QUERY PLAN ${text}`).all().map((row) =>
        String((row as { detail: string }).detail)
      );
    const claim = plan(statements.claim);
    assert.ok(
      claim.some((d) => /SEARCH k USING INDEX sqlite_autoindex_trellis_outbox_keys_1/.test(d)),
      claim.join(" | "),
    );
    for (const statement of statements.keySequences) {
      const details = plan(statement);
      assert.ok(
        !details.some((d) => /^SCAN (t|trellis_outbox|trellis_outbox_keys)$/.test(d)),
        details.join(" | "),
      );
    }
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

for (const dialect of ["postgres", "sqlite"] as const) {
  Deno.test(`${dialect}: a mark statement that fails is retried safely and leaves the right key sequence`, async () => {
    const { executor, close } = await open(dialect);
    try {
      const { executor: flaky, state } = failing(executor, markStatement);
      const outbox = new SqlOutboxRepository(flaky, dialect, tablesOf(dialect));
      const base = { kind: "event.publish" as const, name: "n", subject: "s.k", payload: "{}" };
      for (const id of ["a", "b"]) {
        await outbox.enqueue({ ...base, id, headers: {}, orderingKey: "k" });
      }
      const now = new Date();
      const [a] = await outbox.claimDue(5, now);
      state.failures = 1;
      await assert.rejects(
        outbox.markMany([{ claim: a, state: "dispatched", sequence: 11 }], now),
        /simulated/,
      );
      assert.equal((await outbox.get("a"))?.state, "claimed", "the mark did not apply");
      // The retry (as applyMarks does) applies it; the key sequence was already right.
      assert.deepEqual(
        await outbox.markMany([{ claim: a, state: "dispatched", sequence: 11 }], now),
        [true],
      );
      const [b] = await outbox.claimDue(5, now);
      assert.equal(b.keySequence, 11);
    } finally {
      await close();
    }
  });
}

Deno.test("postgres + JetStream: a dispatcher that dies before its marks land loses, duplicates and reorders nothing", async () => {
  const { executor, close } = await open("postgres");
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const subject = `${stream.prefix}.order-9`;
    const { executor: dying, state } = failing(executor, markStatement);
    const outbox = new SqlOutboxRepository(dying, "postgres", tablesOf("postgres"));
    const ids = ["o9-1", "o9-2", "o9-3"];
    for (const id of ids) {
      await outbox.enqueue({
        id,
        kind: "event.publish",
        name: "n",
        subject,
        payload: "{}",
        headers: {},
        orderingKey: "order-9",
      });
    }
    const runtime = createJetStreamRuntime(jetstream(nc));
    const t0 = new Date();
    const at = (ms: number) => new Date(t0.getTime() + ms);
    const options = { keyFence: "subject" as const, leaseMs: 1_000 };
    assert.equal((await dispatchOutbox(outbox, runtime, { ...options, now: t0 })).dispatched, 1);
    // o9-2 is published, then every mark statement fails until the lease is gone (the
    // dispatcher "died"): neither the mark nor its key sequence lands (one statement).
    state.failures = Number.MAX_SAFE_INTEGER;
    await assert.rejects(dispatchOutbox(outbox, runtime, { ...options, now: at(10) }), /simulated/);
    state.failures = 0;
    assert.equal((await outbox.get("o9-2"))?.state, "claimed");
    // Its next claim carries o9-1's sequence again: the fenced retry is recognised (2.9: a
    // duplicate PubAck; 2.12+: a 10071, and o9-2 last on the subject).
    const result = await dispatchOutbox(outbox, runtime, { ...options, now: at(5_000) });
    assert.deepEqual([result.dispatched, result.duplicates], [1, 1]);
    assert.equal(
      (await dispatchOutbox(outbox, runtime, { ...options, now: at(5_001) })).dispatched,
      1,
    );
    assert.deepEqual(await streamIds(nc, stream.name), ids);
  } finally {
    await nc.close();
    await close();
  }
});

const sqliteTables = { outbox: "fence_o", inbox: "fence_i" };
const postgresTables = uniqueTables();

function tablesOf(dialect: "postgres" | "sqlite") {
  return dialect === "postgres" ? postgresTables : sqliteTables;
}

async function open(
  dialect: "postgres" | "sqlite",
): Promise<{ executor: SqlExecutor; close: () => Promise<void> }> {
  if (dialect === "sqlite") {
    const dir = await Deno.makeTempDir({ prefix: "outbox_fence_" });
    const db = openSqlite(`${dir}/o.db`);
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect, tables: sqliteTables });
    return {
      executor,
      close: async () => {
        db.close();
        await Deno.remove(dir, { recursive: true });
      },
    };
  }
  const sql = postgres(await postgresUrl(), { max: 4, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  await migrate(executor, { dialect, tables: postgresTables });
  await sql.unsafe(`DELETE FROM ${postgresTables.outbox}`);
  await sql.unsafe(`DELETE FROM ${postgresTables.outbox}_keys`);
  return {
    executor,
    close: async () => {
      await dropPostgresTables(executor, postgresTables).catch(() => {});
      await sql.end();
    },
  };
}

Deno.test("the key fence's table name may not be the inbox's or the migrations table's", async () => {
  for (
    const tables of [{ outbox: "ob", inbox: "ob_keys" }, {
      outbox: "ob",
      inbox: "ib",
      migrations: "OB_KEYS",
    }]
  ) {
    assert.throws(() => resolveSqlOutboxTables(tables), OutboxValidationError);
    // Before, migrate failed half way with "table ob_keys already exists".
    const db = openSqlite(":memory:");
    try {
      await assert.rejects(
        migrate(nodeSqliteExecutor(db), { dialect: "sqlite", tables }),
        OutboxValidationError,
      );
    } finally {
      db.close();
    }
  }
});
