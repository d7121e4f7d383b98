/**
 * Opening a SQLite file for the CLI: `node:sqlite` (Deno, Node >= 22.5), else `better-sqlite3`
 * when the project has it installed (Node before 22.5), else a clear error saying what to install.
 *
 * @module
 */

import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import process from "node:process";
import {
  type BetterSqlite3Database,
  betterSqlite3Executor,
  nodeSqliteExecutor,
  type SqlExecutor,
  type SqliteDatabase,
} from "../../mod.ts";
import { CliError } from "./errors.ts";

/** An open SQLite database. */
export interface OpenedSqlite {
  /** The executor over the connection. */
  executor: SqlExecutor;
  /** Which driver opened it. */
  driver: "node:sqlite" | "better-sqlite3";
  /** Closes the connection. */
  close(): void;
}

type NodeSqliteModule = {
  DatabaseSync: new (path: string) => SqliteDatabase & { exec(sql: string): void; close(): void };
};
type BetterSqlite3Module = {
  default: new (path: string, options?: { fileMustExist?: boolean }) => BetterSqlite3Database & {
    close(): void;
  };
};

/** `node:sqlite` when this runtime has it (Deno; Node >= 22.5 without a flag since 22.13). */
function loadNodeSqlite(): NodeSqliteModule | undefined {
  try {
    return process.getBuiltinModule?.("node:sqlite") as NodeSqliteModule | undefined;
  } catch {
    return undefined;
  }
}

/** `better-sqlite3` from the user's project (Node without node:sqlite), loaded only when node:sqlite is missing. */
function loadBetterSqlite3(): BetterSqlite3Module | undefined {
  try {
    const load = createRequire(import.meta.url);
    const loaded = load("better-sqlite3");
    return { default: loaded.default ?? loaded };
  } catch {
    return undefined;
  }
}

/**
 * Opens `path`. Unless `create` is set, a missing file is an error rather than a new, empty
 * database. Sets `busy_timeout` so the CLI waits for the service's write transactions.
 */
export function openSqlite(
  path: string,
  create: boolean,
  hint = `"outbox-nats migrate --store sqlite:${path}"`,
): OpenedSqlite {
  if (!create && !existsSync(path)) {
    throw new CliError(
      `SQLite database ${path} does not exist (create it and its tables with ${hint})`,
    );
  }
  const nodeSqlite = loadNodeSqlite();
  try {
    if (nodeSqlite?.DatabaseSync) {
      const db = new nodeSqlite.DatabaseSync(path);
      db.exec("PRAGMA busy_timeout = 5000");
      return { executor: nodeSqliteExecutor(db), driver: "node:sqlite", close: () => db.close() };
    }
    const better = loadBetterSqlite3();
    if (better?.default) {
      const db = new better.default(path);
      db.exec("PRAGMA busy_timeout = 5000");
      return {
        executor: betterSqlite3Executor(db),
        driver: "better-sqlite3",
        close: () => db.close(),
      };
    }
  } catch (error) {
    throw new CliError(`cannot open SQLite database ${path}: ${messageOf(error)}`, {
      cause: error,
    });
  }
  throw new CliError(
    "SQLite stores need node:sqlite (Deno, or Node >= 22.5) or the better-sqlite3 package; " +
      "on this Node, install it next to @outbox/nats: npm install better-sqlite3",
  );
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
