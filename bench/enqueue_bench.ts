/**
 * Enqueue cost inside the caller's transaction, on Postgres (postgres.js) and SQLite
 * (node:sqlite, WAL file). The baseline of each group is the same business transaction without
 * the outbox, so the group summary reads "what the outbox adds to your transaction":
 *
 * - single: one business row + `enqueue` of one message (and, on Postgres, with `notify: true`,
 *   which adds `pg_notify` to the insert),
 * - bulk: 100 business rows in one statement + `enqueueMany` of 100 messages.
 *
 * The whole transaction is timed, commit included.
 *
 * Run with `deno task bench` (or `deno bench -A bench/enqueue_bench.ts`).
 *
 * @module
 */

import postgres from "postgres";
import {
  migrate,
  nodeSqliteExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { cleanUpAtExit } from "./support/cleanup.ts";
import { createBenchDatabase } from "./support/postgres.ts";
import { records } from "./support/records.ts";
import { openBenchSqlite } from "./support/sqlite.ts";

const bulk = 100;
let sequence = 0;

/** One business row per record, as JSON for a single-statement insert. */
function orders(count: number): { ids: number[]; json: string } {
  const ids = Array.from({ length: count }, () => ++sequence);
  const json = JSON.stringify(
    ids.map((id) => ({ id, customer: `c-${id % 977}`, total: id % 1000 })),
  );
  return { ids, json };
}

// --- Postgres --------------------------------------------------------------------------------

const database = await createBenchDatabase("enqueue");
cleanUpAtExit({ kind: "postgres-database", serverUrl: database.serverUrl, name: database.name });
const sql = postgres(database.url, { max: 1, onnotice: () => {} });
await migrate(postgresJsExecutor(sql), { dialect: "postgres" });
await sql.unsafe(
  "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
);
const pgInsertOne = "INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)";
const pgInsertMany =
  "INSERT INTO orders (id, customer, total) SELECT id, customer, total FROM json_to_recordset($1::text::json) AS r(id bigint, customer text, total integer)";

async function postgresTransaction(
  count: number,
  outbox: "none" | "plain" | "notify",
): Promise<void> {
  const { ids, json } = orders(count);
  await sql.begin(async (tx) => {
    if (count === 1) await tx.unsafe(pgInsertOne, [ids[0], `c-${ids[0] % 977}`, ids[0] % 1000]);
    else await tx.unsafe(pgInsertMany, [json]);
    if (outbox === "none") return;
    const repository = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", {}, {
      notify: outbox === "notify",
    });
    const batch = records(`order-${ids[0]}`, "orders", count);
    if (count === 1) await repository.enqueue(batch[0]);
    else await repository.enqueueMany(batch);
  });
}

Deno.bench({
  name: "postgres tx: 1 business row",
  group: "postgres enqueue 1",
  baseline: true,
  fn: async () => await postgresTransaction(1, "none"),
});
Deno.bench({
  name: "postgres tx: 1 business row + enqueue",
  group: "postgres enqueue 1",
  fn: async () => await postgresTransaction(1, "plain"),
});
Deno.bench({
  name: "postgres tx: 1 business row + enqueue, notify: true",
  group: "postgres enqueue 1",
  fn: async () => await postgresTransaction(1, "notify"),
});
Deno.bench({
  name: `postgres tx: ${bulk} business rows`,
  group: `postgres enqueue ${bulk}`,
  baseline: true,
  fn: async () => await postgresTransaction(bulk, "none"),
});
Deno.bench({
  name: `postgres tx: ${bulk} business rows + enqueueMany(${bulk})`,
  group: `postgres enqueue ${bulk}`,
  fn: async () => await postgresTransaction(bulk, "plain"),
});

// --- SQLite ----------------------------------------------------------------------------------

const { db } = await openBenchSqlite("enqueue");
const sqlite: SqlExecutor = nodeSqliteExecutor(db);
await migrate(sqlite, { dialect: "sqlite" });
db.exec(
  "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total INTEGER NOT NULL, created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ')))",
);
const sqliteInsertOne = db.prepare("INSERT INTO orders (id, customer, total) VALUES (?, ?, ?)");
const sqliteInsertMany = db.prepare(
  "INSERT INTO orders (id, customer, total) SELECT json_extract(value, '$.id'), json_extract(value, '$.customer'), json_extract(value, '$.total') FROM json_each(?)",
);
// The transactions below are opened with raw BEGIN: enqueue inside them deliberately.
const sqliteOutbox = new SqlOutboxRepository(
  nodeSqliteExecutor(db, { openTransaction: "join" }),
  "sqlite",
);

async function sqliteTransaction(count: number, withOutbox: boolean): Promise<void> {
  const { ids, json } = orders(count);
  db.exec("BEGIN IMMEDIATE");
  try {
    if (count === 1) sqliteInsertOne.run(ids[0], `c-${ids[0] % 977}`, ids[0] % 1000);
    else sqliteInsertMany.run(json);
    if (withOutbox) {
      const batch = records(`order-${ids[0]}`, "orders", count);
      if (count === 1) await sqliteOutbox.enqueue(batch[0]);
      else await sqliteOutbox.enqueueMany(batch);
    }
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
}

Deno.bench({
  name: "sqlite tx: 1 business row",
  group: "sqlite enqueue 1",
  baseline: true,
  fn: async () => await sqliteTransaction(1, false),
});
Deno.bench({
  name: "sqlite tx: 1 business row + enqueue",
  group: "sqlite enqueue 1",
  fn: async () => await sqliteTransaction(1, true),
});
Deno.bench({
  name: `sqlite tx: ${bulk} business rows`,
  group: `sqlite enqueue ${bulk}`,
  baseline: true,
  fn: async () => await sqliteTransaction(bulk, false),
});
Deno.bench({
  name: `sqlite tx: ${bulk} business rows + enqueueMany(${bulk})`,
  group: `sqlite enqueue ${bulk}`,
  fn: async () => await sqliteTransaction(bulk, true),
});
