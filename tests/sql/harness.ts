/**
 * Fixtures for the SQL stores on real databases: Postgres through postgres.js and node-postgres
 * (fresh unique tables per fixture on the test server), and SQLite (a real file in a temp dir,
 * WAL mode, peers on a second connection to the same file).
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import {
  migrate,
  nodeSqliteExecutor,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlInboxRepository,
  sqliteWorkerExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../../mod.ts";
import type { ConformanceFixture, ConformanceHarness } from "../conformance/cases.ts";
import { postgresUrl, uniqueName } from "../kit/mod.ts";

/** Fresh unique table names (lowercase, valid everywhere). */
export function uniqueTables(): SqlOutboxTables {
  const base = uniqueName("ob").slice(0, 40);
  return { outbox: `${base}_o`, inbox: `${base}_i` };
}

/** Drops the tables of `tables` (and their migrations and key fence tables). */
export async function dropPostgresTables(
  executor: SqlExecutor,
  tables: SqlOutboxTables,
): Promise<void> {
  await executor.query(
    `DROP TABLE IF EXISTS ${tables.outbox}, ${tables.inbox}, ${tables.outbox}_migrations, ${tables.outbox}_keys`,
    [],
  );
}

/** Opens a SQLite file database the way the docs recommend (WAL, busy timeout). */
export function openSqlite(path: string): DatabaseSync {
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA busy_timeout = 10000");
  return db;
}

/** SQLite: each fixture is a new database file in a new temp dir (default table names). */
export const sqliteHarness: ConformanceHarness = {
  name: "sqlite (node:sqlite, WAL file)",
  canCorrupt: true,
  async open(): Promise<ConformanceFixture> {
    const dir = await Deno.makeTempDir({ prefix: "outbox_sqlite_" });
    const path = `${dir}/outbox.db`;
    const db = openSqlite(path);
    const peer = openSqlite(path);
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    return sqliteFixture(executor, nodeSqliteExecutor(peer), async () => {
      peer.close();
      db.close();
      await Deno.remove(dir, { recursive: true });
    });
  },
};

/**
 * The fixture of a SQLite file: the stores on `executor`, one peer on `peerExecutor` (another
 * connection to the same file), corruption written with `executor`.
 */
function sqliteFixture(
  executor: SqlExecutor,
  peerExecutor: SqlExecutor,
  close: () => Promise<void>,
): ConformanceFixture {
  return {
    outbox: new SqlOutboxRepository(executor, "sqlite"),
    inbox: new SqlInboxRepository(executor, "sqlite"),
    peers: [{
      outbox: new SqlOutboxRepository(peerExecutor, "sqlite"),
      inbox: new SqlInboxRepository(peerExecutor, "sqlite"),
    }],
    async corrupt(id) {
      await executor.query(
        "UPDATE trellis_outbox SET headers = '{not json', kind = 'event.bogus' WHERE id = ?1",
        [id],
      );
    },
    close,
  };
}

/**
 * SQLite with the stores on a worker thread's connection (`sqliteWorkerExecutor`), as a relay
 * runs them; the peer is the application's own connection on this thread (`nodeSqliteExecutor`).
 */
export const sqliteWorkerHarness: ConformanceHarness = {
  name: "sqlite (worker thread executor, WAL file)",
  canCorrupt: true,
  async open(): Promise<ConformanceFixture> {
    const dir = await Deno.makeTempDir({ prefix: "outbox_sqlite_worker_" });
    const path = `${dir}/outbox.db`;
    const peer = openSqlite(path);
    const peerExecutor = nodeSqliteExecutor(peer);
    const executor = await sqliteWorkerExecutor(path, { busyTimeoutMs: 10_000 });
    await migrate(executor, { dialect: "sqlite" });
    return sqliteFixture(executor, peerExecutor, async () => {
      await executor.close();
      peer.close();
      await Deno.remove(dir, { recursive: true });
    });
  },
};

interface PostgresHandles {
  executor: SqlExecutor;
  peer: SqlExecutor;
  end(): Promise<void>;
}

async function postgresHarnessFixture(handles: PostgresHandles): Promise<ConformanceFixture> {
  const tables = uniqueTables();
  const { executor, peer } = handles;
  try {
    await migrate(executor, { dialect: "postgres", tables });
  } catch (error) {
    await handles.end();
    throw error;
  }
  return {
    outbox: new SqlOutboxRepository(executor, "postgres", tables),
    inbox: new SqlInboxRepository(executor, "postgres", tables),
    peers: [{
      outbox: new SqlOutboxRepository(peer, "postgres", tables),
      inbox: new SqlInboxRepository(peer, "postgres", tables),
    }],
    async corrupt(id) {
      await executor.query(
        `UPDATE ${tables.outbox} SET headers = '"not an object"'::jsonb, kind = 'event.bogus' WHERE id = $1`,
        [id],
      );
    },
    async close() {
      try {
        await dropPostgresTables(executor, tables);
      } finally {
        await handles.end();
      }
    },
  };
}

/** Postgres through postgres.js; the peer is a second pool. */
export const postgresJsHarness: ConformanceHarness = postgresJsHarnessAt(
  "postgres (postgres.js)",
  postgresUrl,
);

/**
 * Postgres through postgres.js at `url()` with extra client options (a pooler in front, say);
 * the peer is a second pool.
 */
export function postgresJsHarnessAt(
  name: string,
  url: () => Promise<string>,
  options: postgres.Options<Record<string, postgres.PostgresType>> = {},
): ConformanceHarness {
  return {
    name,
    canCorrupt: true,
    async open() {
      const at = await url();
      const sql = postgres(at, { max: 4, onnotice: () => {}, ...options });
      const other = postgres(at, { max: 4, onnotice: () => {}, ...options });
      return await postgresHarnessFixture({
        executor: postgresJsExecutor(sql),
        peer: postgresJsExecutor(other),
        end: async () => {
          await Promise.all([sql.end(), other.end()]);
        },
      });
    },
  };
}

/** Postgres through node-postgres (`pg.Pool`); the peer is a second pool. */
export const pgHarness: ConformanceHarness = {
  name: "postgres (node-postgres)",
  canCorrupt: true,
  async open() {
    const url = await postgresUrl();
    const pool = new pg.Pool({ connectionString: url, max: 4 });
    const other = new pg.Pool({ connectionString: url, max: 4 });
    return await postgresHarnessFixture({
      executor: pgExecutor(pool),
      peer: pgExecutor(other),
      end: async () => {
        await Promise.all([pool.end(), other.end()]);
      },
    });
  },
};
