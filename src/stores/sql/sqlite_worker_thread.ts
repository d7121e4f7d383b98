/**
 * The worker thread of {@linkcode sqliteWorkerExecutor} (sqlite_worker_executor.ts): opens its
 * own `node:sqlite` connection to the database file and runs the statements the executor posts,
 * one message at a time, in the order they were posted. Each request is answered with its rows
 * or with the driver's error as plain data (name, message, stack, `code`, `errcode`, `errstr`),
 * which the executor turns back into an error of the same class with the same fields.
 *
 * Not part of the public API: the executor starts it with `new Worker(url)`.
 *
 * @module
 */

import process from "node:process";
import { parentPort, workerData } from "node:worker_threads";
import { cachedStatement } from "./sqlite_statements.ts";

/** What the executor passes as `workerData`. */
export interface SqliteWorkerSetup {
  /** The database file. */
  path: string;
  /** `PRAGMA busy_timeout`, ms. */
  busyTimeoutMs: number;
  /** `PRAGMA synchronous`, when set. */
  synchronous?: string;
  /** Whether to set `PRAGMA journal_mode = WAL`. */
  wal: boolean;
}

/** A request from the executor. `id` pairs it with its reply. */
export type SqliteWorkerRequest =
  /** Runs one statement with (already mapped) positional parameters; replies with its rows. */
  | { id: number; op: "query"; sql: string; params: unknown[] }
  /** Runs SQL without results (`BEGIN IMMEDIATE`, `COMMIT`, `SAVEPOINT` ...). */
  | { id: number; op: "exec"; sql: string }
  /** Rolls back the open transaction, if one is open (SQLite may have rolled it back itself). */
  | { id: number; op: "rollback" }
  /** Closes the connection (rolling back an open transaction); the executor then ends the thread. */
  | { id: number; op: "close" };

/** An error as data: what survives the thread boundary of a driver error. */
export interface SqliteWorkerErrorData {
  name: string;
  message: string;
  stack?: string;
  /** The error's own enumerable fields with primitive values (`code`, `errcode`, `errstr`). */
  fields: Record<string, string | number | boolean | bigint | null>;
}

/** A reply: `id` 0 announces that the database is open (or could not be opened). */
export type SqliteWorkerReply =
  | { id: number; rows: unknown[] }
  | { id: number; error: SqliteWorkerErrorData };

interface WorkerDatabase {
  prepare(sql: string): { all(...params: never[]): unknown[] };
  exec(sql: string): void;
  close(): void;
  readonly isTransaction: boolean;
}

type NodeSqlite = { DatabaseSync: new (path: string) => WorkerDatabase };

/** Any thrown value as data, keeping the fields the stores and callers inspect. */
function errorData(error: unknown): SqliteWorkerErrorData {
  if (!(error instanceof Error)) {
    return { name: "Error", message: String(error), fields: {} };
  }
  const fields: SqliteWorkerErrorData["fields"] = {};
  for (const [key, value] of Object.entries(error)) {
    if (
      value === null || ["string", "number", "boolean", "bigint"].includes(typeof value)
    ) fields[key] = value as string | number | boolean | bigint | null;
  }
  return { name: error.name, message: error.message, stack: error.stack, fields };
}

function open(setup: SqliteWorkerSetup): WorkerDatabase {
  const sqlite = process.getBuiltinModule?.("node:sqlite") as NodeSqlite | undefined;
  if (!sqlite?.DatabaseSync) {
    throw new Error(
      "node:sqlite is not available in this runtime (Node >= 22.5, or Deno): the SQLite worker executor needs it",
    );
  }
  const db = new sqlite.DatabaseSync(setup.path);
  try {
    db.exec(`PRAGMA busy_timeout = ${Math.trunc(setup.busyTimeoutMs)}`);
    if (setup.wal) db.exec("PRAGMA journal_mode = WAL");
    if (setup.synchronous !== undefined) db.exec(`PRAGMA synchronous = ${setup.synchronous}`);
  } catch (error) {
    db.close();
    throw error;
  }
  return db;
}

/** Runs one request on `db`; returns its rows (`[]` for the statements without results). */
function handle(db: WorkerDatabase, request: SqliteWorkerRequest): unknown[] {
  switch (request.op) {
    case "query":
      return cachedStatement(db, request.sql).all(...(request.params as never[]));
    case "exec":
      db.exec(request.sql);
      return [];
    case "rollback":
      if (db.isTransaction) db.exec("ROLLBACK");
      return [];
    case "close":
      db.close();
      return [];
  }
}

if (parentPort) {
  const port = parentPort;
  let db: WorkerDatabase | undefined;
  try {
    db = open(workerData as SqliteWorkerSetup);
    port.postMessage({ id: 0, rows: [] } satisfies SqliteWorkerReply);
  } catch (error) {
    // The executor ends the thread when it reads this.
    port.postMessage({ id: 0, error: errorData(error) } satisfies SqliteWorkerReply);
  }
  if (db) {
    const connection = db;
    port.on("message", (request: SqliteWorkerRequest) => {
      let reply: SqliteWorkerReply;
      try {
        reply = { id: request.id, rows: handle(connection, request) };
      } catch (error) {
        reply = { id: request.id, error: errorData(error) };
      }
      // After "close", the executor ends the thread when it reads the reply.
      port.postMessage(reply);
    });
  }
}
