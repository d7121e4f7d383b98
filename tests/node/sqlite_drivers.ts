/**
 * The SQLite drivers the Node suite runs on: `node:sqlite` (every supported Node, >= 22) and
 * better-sqlite3 where its native binary matches the running Node (it is built for one Node ABI;
 * scripts/test_node.ts builds it for the oldest Node of a run). A driver that cannot load here
 * is skipped with the reason, never silently.
 *
 * @module
 */

import { createRequire } from "node:module";
import { DatabaseSync } from "node:sqlite";
import {
  type BetterSqlite3Database,
  betterSqlite3Executor,
  nodeSqliteExecutor,
  type SqlExecutor,
  type SqliteExecutorOptions,
} from "@outbox/nats";

/** better-sqlite3's `Database` class, as far as the suite uses it. */
type BetterSqlite3 = new (path: string) => BetterSqlite3Database & {
  pragma(source: string): unknown;
  close(): void;
};

/**
 * better-sqlite3 is loaded with `require`, not imported: it is a Node-only test dependency
 * (pinned in scripts/test_node.ts), kept out of deno.json so a fresh clone's first `deno task`
 * does not warn about its build script.
 */
function loadBetterSqlite3(): BetterSqlite3 | string {
  try {
    return createRequire(import.meta.url)("better-sqlite3") as BetterSqlite3;
  } catch (error) {
    return `better-sqlite3 is not installed: ${(error as Error).message.split("\n")[0]}`;
  }
}

const Database = loadBetterSqlite3();

/** An open SQLite file database. */
export interface OpenSqlite {
  executor: SqlExecutor;
  /** Another executor over the same connection, with `options`. */
  executorWith(options: SqliteExecutorOptions): SqlExecutor;
  /** Runs SQL on the connection directly, behind the library's back (`BEGIN`, `ROLLBACK`). */
  exec(sql: string): void;
  close(): void;
}

/** One SQLite driver: `skip` is the reason it cannot run on this Node, else `undefined`. */
export interface SqliteDriver {
  name: "node:sqlite" | "better-sqlite3";
  skip: string | undefined;
  /** Opens `path` in WAL mode with a busy timeout, as the README recommends. */
  open(path: string): OpenSqlite;
}

function betterSqlite3Problem(): string | undefined {
  if (typeof Database === "string") return Database;
  try {
    new Database(":memory:").close();
    return undefined;
  } catch (error) {
    return `better-sqlite3's binary does not load on Node ${process.version}: ${
      (error as Error).message.split("\n")[0]
    }`;
  }
}

/** The drivers, node:sqlite first. */
export const sqliteDrivers: readonly SqliteDriver[] = [
  {
    name: "node:sqlite",
    skip: undefined,
    open(path) {
      const db = new DatabaseSync(path);
      db.exec("PRAGMA journal_mode = WAL");
      db.exec("PRAGMA busy_timeout = 10000");
      return {
        executor: nodeSqliteExecutor(db),
        executorWith: (options) => nodeSqliteExecutor(db, options),
        exec: (sql) => db.exec(sql),
        close: () => db.close(),
      };
    },
  },
  {
    name: "better-sqlite3",
    skip: betterSqlite3Problem(),
    open(path) {
      if (typeof Database === "string") throw new Error(Database);
      const db = new Database(path);
      db.pragma("journal_mode = WAL");
      db.pragma("busy_timeout = 10000");
      return {
        executor: betterSqlite3Executor(db),
        executorWith: (options) => betterSqlite3Executor(db, options),
        exec: (sql) => void db.exec(sql),
        close: () => db.close(),
      };
    },
  },
];
