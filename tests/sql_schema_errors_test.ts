/**
 * An unmigrated or older database: every SQL store call that needs a missing table or column
 * throws OutboxSchemaError naming the table, the version found and the fix, on node:sqlite,
 * postgres.js and node-postgres (better-sqlite3: tests/node/sql.spec.ts).
 */

import assert from "node:assert/strict";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import {
  getSqlOutboxMigrations,
  migrate,
  nodeSqliteExecutor,
  OutboxSchemaError,
  pgExecutor,
  postgresJsExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

interface Db {
  dialect: SqlDialect;
  executor: SqlExecutor;
  tables: SqlOutboxTables;
  /** postgres.js only: runs `fn` inside `sql.begin`. */
  begin?: (fn: (tx: SqlExecutor) => Promise<void>) => Promise<void>;
  close(): Promise<void>;
}

const drivers: Record<string, () => Promise<Db>> = {
  async "node:sqlite"() {
    const dir = await Deno.makeTempDir({ prefix: "outbox_schema_" });
    const db = openSqlite(`${dir}/app.db`);
    return {
      dialect: "sqlite",
      executor: nodeSqliteExecutor(db),
      tables: uniqueTables(),
      async close() {
        db.close();
        await Deno.remove(dir, { recursive: true });
      },
    };
  },
  async "postgres.js"() {
    const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
    const executor = postgresJsExecutor(sql);
    const tables = uniqueTables();
    return {
      dialect: "postgres",
      executor,
      tables,
      begin: async (fn) => {
        await sql.begin((tx) => fn(postgresJsExecutor(tx)));
      },
      async close() {
        await dropPostgresTables(executor, tables);
        await sql.end();
      },
    };
  },
  async "node-postgres"() {
    const pool = new pg.Pool({ connectionString: await postgresUrl(), max: 2 });
    const executor = pgExecutor(pool);
    const tables = uniqueTables();
    return {
      dialect: "postgres",
      executor,
      tables,
      async close() {
        await dropPostgresTables(executor, tables);
        await pool.end();
      },
    };
  },
};

const record = {
  id: "m-1",
  kind: "event.publish",
  name: "demo",
  subject: "demo.a",
  payload: "{}",
  headers: {},
} as const;

function schemaError(table: string, found: number | undefined, required: number) {
  return (error: unknown) => {
    assert.ok(error instanceof OutboxSchemaError, `expected OutboxSchemaError, got ${error}`);
    assert.equal(error.table, table);
    assert.equal(error.foundVersion, found);
    assert.equal(error.requiredVersion, required);
    assert.match(error.message, new RegExp(`^Table ${table} `));
    assert.match(error.message, /migrate\(\) or `outbox-nats migrate`/);
    assert.ok(error.cause !== undefined);
    return true;
  };
}

for (const [driver, open] of Object.entries(drivers)) {
  Deno.test(`${driver}: an unmigrated database gives OutboxSchemaError (version 0)`, async () => {
    const db = await open();
    try {
      const required = getSqlOutboxMigrations({ dialect: db.dialect }).length;
      const outbox = new SqlOutboxRepository(db.executor, db.dialect, db.tables);
      const inbox = new SqlInboxRepository(db.executor, db.dialect, db.tables);
      const expected = schemaError(db.tables.outbox, 0, required);
      await assert.rejects(outbox.enqueue(record), expected);
      await assert.rejects(outbox.enqueueMany([record, { ...record, id: "m-2" }]), expected);
      await assert.rejects(outbox.claimDue(10, new Date()), expected);
      await assert.rejects(outbox.stats(), expected);
      await assert.rejects(outbox.listDead(), expected);
      await assert.rejects(inbox.record("m-1"), schemaError(db.tables.inbox, 0, required));
    } finally {
      await db.close();
    }
  });

  Deno.test(`${driver}: a version 1 database gives OutboxSchemaError (version 1)`, async () => {
    const db = await open();
    try {
      const required = getSqlOutboxMigrations({ dialect: db.dialect }).length;
      await migrate(db.executor, { dialect: db.dialect, tables: db.tables, to: 1 });
      const outbox = new SqlOutboxRepository(db.executor, db.dialect, db.tables);
      const inbox = new SqlInboxRepository(db.executor, db.dialect, db.tables);
      const expected = schemaError(db.tables.outbox, 1, required);
      await assert.rejects(outbox.enqueue(record), expected);
      await assert.rejects(outbox.claimDue(10, new Date()), expected);
      await assert.rejects(inbox.record("m-1"), schemaError(db.tables.inbox, 1, required));
      // After migrate() the same repositories work.
      await migrate(db.executor, { dialect: db.dialect, tables: db.tables });
      await outbox.enqueue(record);
      assert.equal((await outbox.stats()).pending, 1);
      assert.equal(await inbox.record("m-1"), true);
    } finally {
      await db.close();
    }
  });
}

Deno.test("a version 1 database without a migration record is recognised by its columns", async () => {
  const db = await drivers["node:sqlite"]();
  try {
    const migrations = getSqlOutboxMigrations({ dialect: "sqlite", tables: db.tables });
    for (const statement of migrations[0].up) await db.executor.query(statement, []);
    const outbox = new SqlOutboxRepository(db.executor, "sqlite", db.tables);
    await assert.rejects(
      outbox.claimDue(10, new Date()),
      schemaError(db.tables.outbox, 1, migrations.length),
    );
  } finally {
    await db.close();
  }
});

Deno.test("a version 2 database (before the claim token) is named as version 2", async () => {
  const db = await drivers["node:sqlite"]();
  try {
    const migrations = getSqlOutboxMigrations({ dialect: "sqlite", tables: db.tables });
    for (const migration of migrations.slice(0, 2)) {
      for (const statement of migration.up) await db.executor.query(statement, []);
    }
    const outbox = new SqlOutboxRepository(db.executor, "sqlite", db.tables);
    await assert.rejects(
      outbox.claimDue(10, new Date()),
      schemaError(db.tables.outbox, 2, migrations.length),
    );
  } finally {
    await db.close();
  }
});

Deno.test("postgres.js: inside an aborted transaction a missing table still reads as version 0", async () => {
  const db = await drivers["postgres.js"]();
  try {
    await assert.rejects(
      db.begin!(async (tx) => {
        await new SqlOutboxRepository(tx, "postgres", db.tables).enqueue(record);
      }),
      schemaError(db.tables.outbox, 0, getSqlOutboxMigrations({ dialect: "postgres" }).length),
    );
  } finally {
    await db.close();
  }
});

Deno.test("other driver errors pass through unchanged", async () => {
  const db = await drivers["node:sqlite"]();
  try {
    await migrate(db.executor, { dialect: "sqlite", tables: db.tables });
    const outbox = new SqlOutboxRepository(db.executor, "sqlite", db.tables);
    await assert.rejects(outbox.executor.query("SELEC 1", []), (error: unknown) => {
      assert.ok(!(error instanceof OutboxSchemaError));
      assert.match(String(error), /syntax error/);
      return true;
    });
  } finally {
    await db.close();
  }
});
