/**
 * Scenario 6, bad input refused up front: hostile table names never reach SQL, and records a
 * store could not keep or JetStream could not carry faithfully are refused with a typed error
 * naming the field, on every store, storing nothing (a batch with one bad record stores none).
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import {
  createOutboxBucket,
  createPostgresOutboxSchema,
  createSqliteOutboxSchema,
  createSqlOutboxAdapter,
  getSqlOutboxMigrations,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  type OutboxAdmin,
  type OutboxRecord,
  type OutboxRepository,
  OutboxValidationError,
  postgresJsExecutor,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../../mod.ts";
import { openSqlite } from "../sql/harness.ts";
import { createTestDatabase, uniqueName } from "../kit/mod.ts";
import { figures, natsConnection, pgPool, tempDir } from "./harness.ts";

const hostileTableNames = [
  "trellis_outbox; DROP TABLE sentinel; --",
  "x' OR '1'='1",
  'quoted"name',
  "public.trellis_outbox",
  "with space",
  "1starts_with_digit",
  "dash-name",
  "ünïcode",
  "",
  "a".repeat(49),
];

function good(id: string): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "fault.input",
    subject: "orders.created",
    payload: "{}",
    headers: {},
  };
}

/** A bad record and the field its error must name. */
const badRecords: Array<[string, Record<string, unknown>, string]> = [
  ["empty id", { id: "" }, "id"],
  ["NUL in id", { id: "a\u0000b" }, "id"],
  ["lone surrogate in id", { id: "a\ud800b" }, "id"],
  ["CR/LF in id", { id: "a\r\nNats-Msg-Id: b" }, "id"],
  ["leading space in id", { id: " padded" }, "id"],
  ["trailing tab in id", { id: "padded\t" }, "id"],
  ["id over 2,048 bytes", { id: "é".repeat(1_025) }, "id"],
  ["number id", { id: 42 }, "id"],
  ["unknown kind", { kind: "event.bogus" }, "kind"],
  ["wildcard subject", { subject: "orders.*" }, "subject"],
  ["full wildcard subject", { subject: "orders.>" }, "subject"],
  ["empty token", { subject: "orders..created" }, "subject"],
  ["space in subject", { subject: "orders created" }, "subject"],
  ["empty subject", { subject: "" }, "subject"],
  ["object payload", { payload: { a: 1 } }, "payload"],
  ["NUL in payload", { payload: '{"a":"\u0000"}' }, "payload"],
  ["header name with colon", { headers: { "X:Y": "1" } }, "headers.X:Y"],
  ["header value with CRLF", { headers: { "X-A": "1\r\nNats-Msg-Id: other" } }, "headers.X-A"],
  ["Nats-Msg-Id header not the id", { headers: { "Nats-Msg-Id": "other" } }, "headers.Nats-Msg-Id"],
  ["number header value", { headers: { "X-A": 1 } }, "headers.X-A"],
];

/** A real executor that records every statement it is asked to run. */
function recording(inner: SqlExecutor): SqlExecutor & { statements: string[] } {
  const statements: string[] = [];
  return {
    statements,
    query(sql, params) {
      statements.push(sql);
      return inner.query(sql, params);
    },
    transaction(fn) {
      statements.push("<transaction>");
      return inner.transaction!(fn);
    },
  };
}

Deno.test("bad input: hostile table names are refused before any statement runs", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  await pg.sql`CREATE TABLE sentinel (id int)`;
  await pg.sql`CREATE TABLE students (id int)`;
  const executor = recording(postgresJsExecutor(pg.sql));
  let refused = 0;
  for (const name of hostileTableNames) {
    for (const tables of [{ outbox: name }, { inbox: name }]) {
      const isTables = (error: unknown) =>
        error instanceof OutboxValidationError && error.field.startsWith("tables");
      assert.throws(() => new SqlOutboxRepository(executor, "postgres", tables), isTables);
      assert.throws(() => new SqlInboxRepository(executor, "sqlite", tables), isTables);
      assert.throws(() => createSqlOutboxAdapter(executor, "postgres", tables), isTables);
      assert.throws(() => getSqlOutboxMigrations({ dialect: "postgres", tables }), isTables);
      assert.throws(() => createPostgresOutboxSchema({ outbox: "ok", inbox: "ok", ...tables }));
      assert.throws(() => createSqliteOutboxSchema({ outbox: "ok", inbox: "ok", ...tables }));
      await assert.rejects(migrate(executor, { dialect: "postgres", tables }), isTables);
      refused += 7;
    }
  }
  assert.deepEqual(executor.statements, [], "no statement reached the database");
  const [{ n }] = await pg.sql`
    SELECT count(*)::int AS n FROM pg_tables WHERE tablename IN ('sentinel', 'students')`;
  assert.equal(n, 2, "nothing was dropped");
  figures("bad-input/table-names", { names: hostileTableNames.length, refusals: refused });
});

async function refuseBadRecords(name: string, outbox: OutboxRepository & OutboxAdmin) {
  let refused = 0;
  for (const [what, overrides, field] of badRecords) {
    const record = { ...good(`bad-${refused}`), ...overrides } as OutboxRecord;
    const named = (error: unknown) => {
      assert.ok(error instanceof OutboxValidationError, `${what}: ${error}`);
      assert.equal(error.field, field, what);
      return true;
    };
    await assert.rejects(outbox.enqueue(record), named);
    // One bad record in a batch: none of the batch is stored.
    await assert.rejects(outbox.enqueueMany([good(`neighbour-${refused}`), record]), named);
    assert.equal(await outbox.get(`neighbour-${refused}`), undefined, what);
    refused += 1;
  }
  const stats = await outbox.stats();
  assert.equal(
    stats.pending + stats.claimed + stats.failed + stats.dispatched + stats.dead,
    0,
    "nothing stored",
  );
  figures(`bad-input/records/${name}`, { cases: badRecords.length, stored: 0 });
}

Deno.test("bad input: records that cannot be stored or carried faithfully are refused on Postgres, storing nothing", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await refuseBadRecords("postgres", new SqlOutboxRepository(executor, "postgres"));
});

Deno.test("bad input: records that cannot be stored or carried faithfully are refused on SQLite, storing nothing", async () => {
  await using dir = await tempDir("outbox_faults_input_");
  const db = openSqlite(`${dir.path}/outbox.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    await refuseBadRecords("sqlite", new SqlOutboxRepository(executor, "sqlite"));
  } finally {
    db.close();
  }
});

Deno.test("bad input: records that cannot be stored or carried faithfully are refused on NATS KV, storing nothing", async () => {
  await using nats = await natsConnection();
  const kv = await createOutboxBucket(new Kvm(nats.nc), uniqueName("faults_input"));
  const outbox = new NatsKvOutboxRepository(kv);
  try {
    await refuseBadRecords("nats-kv", outbox);
  } finally {
    await outbox.close();
    await kv.destroy().catch(() => {});
  }
});
