/**
 * Executors: the one seam between the SQL stores and a database driver. An executor runs one
 * statement with positional parameters and returns its rows keyed by column name. Adapters are
 * provided for postgres.js, node-postgres (`pg`), `node:sqlite` (and databases with the same
 * `prepare(sql).all(...params)` shape, such as `@db/sqlite`) and better-sqlite3. None of them
 * imports its driver: each takes the caller's handle, so the caller's transaction is used as is.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";
import { nonNegative } from "../../core/limits.ts";
import { connectionQueue } from "./connection_queue.ts";
import { cachedStatement, maxCachedStatements, sqliteParams } from "./sqlite_statements.ts";
import { waitForForeignTransaction } from "./errors.ts";

/**
 * One result row, keyed by column name.
 *
 * @example
 * ```ts
 * import type { SqlRow } from "@outbox/nats";
 * const row: SqlRow = { id: "m-1", attempts: 1 };
 * ```
 */
export type SqlRow = Record<string, unknown>;

/**
 * Runs SQL for the SQL stores. `query` runs ONE statement with positional parameters (`$1`, `$2`
 * for Postgres; `?` / `?NNN` for SQLite) and resolves with its rows (an empty array for a
 * statement that returns none). Hand the stores an executor over your transaction and their
 * statements join it.
 *
 * `transaction`, when present, runs `fn` inside a transaction on one connection (a savepoint
 * when the executor is the `tx` handle of a transaction). The adapters' executors over one
 * connection (a SQLite database, a `pg.Client`, a reserved postgres.js connection) queue their
 * transactions per connection object, so any number of executors may share it; a pool hands
 * each transaction its own connection. `migrate()`, the SQLite transaction runner and
 * inbox consumers use it.
 *
 * @example
 * ```ts
 * import type { SqlExecutor, SqlRow } from "@outbox/nats";
 * // A hand-written executor for a driver without an adapter:
 * function myExecutor(client: { run(sql: string, params: unknown[]): Promise<SqlRow[]> }): SqlExecutor {
 *   return { query: (sql, params) => client.run(sql, [...params]) };
 * }
 * ```
 */
export interface SqlExecutor {
  /** Runs one statement and resolves with its rows. */
  query(sql: string, params: readonly unknown[]): Promise<SqlRow[]>;
  /** Runs `fn` in a transaction (or savepoint) on one connection; commits when it resolves. */
  transaction?<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T>;
}

// ---------------------------------------------------------------------------------------------
// postgres.js

/**
 * The part of a postgres.js handle the adapter uses: `sql` itself, the `tx` handed to
 * `sql.begin`, or a reserved connection from `sql.reserve()`.
 *
 * @example
 * ```ts
 * import postgres from "postgres";
 * import type { PostgresJsSql } from "@outbox/nats";
 * const sql: PostgresJsSql = postgres("postgres://localhost/app");
 * ```
 */
export interface PostgresJsSql {
  /** Runs a statement text with parameters. */
  unsafe(
    query: string,
    parameters?: never[],
    options?: { prepare?: boolean },
  ): PromiseLike<ArrayLike<SqlRow>>;
  /** `sql.begin(fn)` on the top-level handle. */
  begin?: unknown;
  /** `tx.savepoint(fn)` inside `sql.begin`. */
  savepoint?: unknown;
}

/**
 * Options for {@linkcode postgresJsExecutor}.
 *
 * @example
 * ```ts
 * import type { PostgresJsExecutorOptions } from "@outbox/nats";
 * const options: PostgresJsExecutorOptions = { prepare: false }; // e.g. behind an old PgBouncer
 * ```
 */
export interface PostgresJsExecutorOptions {
  /**
   * Use named prepared statements (one round trip per statement after the first). postgres.js
   * only prepares when its own `prepare` connection option is on as well.
   *
   * @default {true}
   */
  prepare?: boolean;
}

type Begin = <T>(fn: (tx: PostgresJsSql) => Promise<T>) => Promise<T>;

/**
 * An executor over postgres.js: `sql`, the `tx` handed to `sql.begin`, or a reserved
 * connection. Statements run through `unsafe(text, params)` with positional parameters.
 *
 * `transaction` uses `sql.begin` on the top-level handle (a connection of the pool per
 * transaction), `tx.savepoint` inside a transaction, and `BEGIN` / `COMMIT` on a reserved
 * connection, one transaction at a time per reserved connection (the executor's other
 * statements wait while one is open).
 *
 * @example
 * ```ts ignore
 * import postgres from "postgres";
 * import { postgresJsExecutor, SqlOutboxRepository } from "@outbox/nats";
 *
 * const sql = postgres("postgres://postgres@127.0.0.1:5432/app");
 * await sql.begin(async (tx) => {
 *   await tx`INSERT INTO orders (id) VALUES (${42})`;
 *   const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres");
 *   await outbox.enqueue({
 *     id: "order-42-created", kind: "event.publish", name: "order.created",
 *     subject: "orders.created", payload: JSON.stringify({ id: 42 }), headers: {},
 *   });
 * });
 * ```
 */
export function postgresJsExecutor(
  sql: PostgresJsSql,
  options: PostgresJsExecutorOptions = {},
): SqlExecutor {
  const unsafeOptions = { prepare: options.prepare ?? true };
  const direct = async (text: string, params: readonly unknown[]): Promise<SqlRow[]> => {
    const rows = await sql.unsafe(text, params as never[], unsafeOptions);
    return rows as unknown as SqlRow[];
  };
  if (typeof sql.begin === "function" || typeof sql.savepoint === "function") {
    // The top-level handle (a pool: sql.begin reserves a connection per transaction) or a
    // transaction's `tx` (its statements belong to that transaction; transaction() nests).
    return {
      query: direct,
      transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
        const wrap = (tx: PostgresJsSql) => fn(postgresJsExecutor(tx, options));
        const begin = (sql.begin ?? sql.savepoint) as Begin;
        return begin.call(sql, wrap) as Promise<T>;
      },
    };
  }
  // A reserved connection: one transaction at a time, through the connection's queue.
  return singleConnection(sql, direct, undefined, "postgres.js reserved", 0);
}

// ---------------------------------------------------------------------------------------------
// node-postgres

/**
 * The part of a node-postgres (`pg`) `Pool`, `Client` or `PoolClient` the adapter uses.
 *
 * @example
 * ```ts
 * import pg from "pg";
 * import type { PgQueryable } from "@outbox/nats";
 * const pool: PgQueryable = new pg.Pool({ connectionString: "postgres://localhost/app" });
 * ```
 */
export interface PgQueryable {
  /** Runs a statement with positional parameters. */
  query(text: string, values?: unknown[]): Promise<{ rows: SqlRow[] }>;
  /** `Pool#connect()` resolves with a `PoolClient`; `Client#connect()` with nothing. */
  connect?: unknown;
  /** Present on a `PoolClient`. */
  release?: unknown;
  /** Present on a `Pool`. */
  totalCount?: unknown;
  /** `Client` / `PoolClient` (pg 8.x): `"I"` idle, `"T"` in a transaction, `"E"` failed one. */
  getTransactionStatus?: () => string | null;
}

/**
 * Options for {@linkcode pgExecutor}.
 *
 * @example
 * ```ts
 * import type { PgExecutorOptions } from "@outbox/nats";
 * const options: PgExecutorOptions = { openTransactionTimeoutMs: 1_000 };
 * ```
 */
export interface PgExecutorOptions {
  /**
   * On a `Client` / `PoolClient`: how long `transaction(fn)` waits for a transaction the library
   * did not open on the connection (your own `BEGIN`) to end before it throws
   * {@linkcode SqlForeignTransactionError}. It never nests inside it.
   *
   * @default {5000}
   */
  openTransactionTimeoutMs?: number;
}

interface PgPoolClient extends PgQueryable {
  release(error?: Error | boolean): void;
}

/**
 * An executor over node-postgres (`pg`): a `Pool`, a `Client`, or a `PoolClient` you checked
 * out (for example to run a transaction).
 *
 * `transaction` checks a client out of a `Pool` for `BEGIN` ... `COMMIT`. On a `Client` or
 * `PoolClient` it issues `BEGIN` / `COMMIT` on it, one transaction at a time per connection
 * object (whichever executor over it asked), and the executor's other statements wait while one
 * is open; it waits for a transaction you opened yourself on the connection to end (bounded,
 * then {@linkcode SqlForeignTransactionError}) instead of nesting in it. Statements issued while
 * no library transaction is open run at once, inside your own `BEGIN` if you opened one (as in
 * the example): never let a dispatcher share a connection on which your code runs `BEGIN`
 * itself.
 *
 * @example
 * ```ts ignore
 * import pg from "pg";
 * import { pgExecutor, SqlOutboxRepository } from "@outbox/nats";
 *
 * const pool = new pg.Pool({ connectionString: "postgres://postgres@127.0.0.1:5432/app" });
 * const client = await pool.connect();
 * try {
 *   await client.query("BEGIN");
 *   await client.query("INSERT INTO orders (id) VALUES ($1)", [42]);
 *   await new SqlOutboxRepository(pgExecutor(client), "postgres").enqueue({
 *     id: "order-42-created", kind: "event.publish", name: "order.created",
 *     subject: "orders.created", payload: JSON.stringify({ id: 42 }), headers: {},
 *   });
 *   await client.query("COMMIT");
 * } catch (error) {
 *   await client.query("ROLLBACK");
 *   throw error;
 * } finally {
 *   client.release();
 * }
 * ```
 */
export function pgExecutor(queryable: PgQueryable, options: PgExecutorOptions = {}): SqlExecutor {
  const isPool = typeof queryable.release !== "function" && "totalCount" in queryable &&
    typeof queryable.connect === "function";
  const direct = async (text: string, params: readonly unknown[]): Promise<SqlRow[]> => {
    const result = await queryable.query(text, params as unknown[]);
    return result.rows;
  };
  if (!isPool) {
    const status = queryable.getTransactionStatus;
    const foreign = typeof status === "function"
      ? () => {
        const value = status.call(queryable);
        return value === "T" || value === "E";
      }
      : undefined;
    // The client's status is only as fresh as its last completed query: a BEGIN the caller
    // sent just before ours may still be on the wire. One round trip tells exactly whether our
    // BEGIN started the transaction: within one simple-protocol message, the transaction start
    // time equals the statement time only for a transaction this message began.
    const begin = foreign &&
      (async (): Promise<boolean> => {
        const result: unknown = await queryable.query(
          "BEGIN; SELECT now() = statement_timestamp() AS fresh",
        );
        const rows = Array.isArray(result)
          ? (result[1] as { rows?: SqlRow[] } | undefined)?.rows
          : undefined;
        return rows?.[0]?.fresh !== false;
      });
    return singleConnection(
      queryable,
      direct,
      foreign,
      "node-postgres",
      nonNegative("openTransactionTimeoutMs", options.openTransactionTimeoutMs ?? 5_000),
      begin,
    );
  }
  return {
    query: direct,
    async transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      // A dedicated client per transaction: concurrent transactions never share a connection.
      const client = await (queryable.connect as () => Promise<PgPoolClient>)();
      let broken = false;
      try {
        const tx = transactionHandle(async (text, params) =>
          (await client.query(text, params as unknown[])).rows
        );
        return await manualTransaction(tx, fn, () => {
          broken = true;
        });
      } finally {
        client.release(broken);
      }
    },
  };
}

// ---------------------------------------------------------------------------------------------
// SQLite

/**
 * A synchronous SQLite database with `prepare(sql).all(...params)`: `node:sqlite`'s
 * `DatabaseSync`, `@db/sqlite`'s `Database`, and similar.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import type { SqliteDatabase } from "@outbox/nats";
 * const db: SqliteDatabase = new DatabaseSync(":memory:");
 * ```
 */
export interface SqliteDatabase {
  /** Compiles a statement. */
  prepare(sql: string): { all(...params: never[]): unknown[] };
  /** Runs SQL without results (used for `BEGIN` / `COMMIT`). */
  exec?(sql: string): unknown;
  /** `node:sqlite`: whether a transaction is open. */
  readonly isTransaction?: boolean;
  /** `@db/sqlite` / better-sqlite3: whether a transaction is open. */
  readonly inTransaction?: boolean;
}

/**
 * The part of a better-sqlite3 `Database` the adapter uses.
 *
 * @example
 * ```ts
 * import { type BetterSqlite3Database, betterSqlite3Executor } from "@outbox/nats";
 * // better-sqlite3's `Database` fits: openExecutor(new Database("app.db"))
 * const openExecutor = (db: BetterSqlite3Database) => betterSqlite3Executor(db);
 * ```
 */
export interface BetterSqlite3Database {
  /** Compiles a statement; `reader` tells whether it returns rows. */
  prepare(sql: string): {
    readonly reader: boolean;
    all(...params: never[]): unknown[];
    run(...params: never[]): unknown;
  };
  /** Runs SQL without results. */
  exec(sql: string): unknown;
  /** Whether a transaction is open. */
  readonly inTransaction: boolean;
}

/**
 * Options for {@linkcode nodeSqliteExecutor} and {@linkcode betterSqlite3Executor}.
 *
 * @example
 * ```ts
 * import type { SqliteExecutorOptions } from "@outbox/nats";
 * // For enqueueing inside a transaction an ORM opened on the connection:
 * const options: SqliteExecutorOptions = { openTransaction: "join" };
 * ```
 */
export interface SqliteExecutorOptions {
  /**
   * What a statement or `transaction(fn)` does when it finds a transaction open on the
   * connection that the library did not open (`db.isTransaction` / `db.inTransaction`: your own
   * `BEGIN`, an ORM's transaction):
   *
   * - `"wait"`: wait for it to end (at most `openTransactionTimeoutMs`, then
   *   {@linkcode SqlForeignTransactionError}; nothing ran). Never runs inside it. The setting
   *   for a dispatcher, an inbox consumer and anything else sharing the connection.
   * - `"join"`: statements run inside it, and `transaction(fn)` is a savepoint in it. Use such
   *   an executor only to enqueue (or record an inbox id) inside a transaction your own code
   *   opened on the connection, never for a dispatcher or an inbox consumer.
   *
   * Either way, the library's own transactions on the connection (from any executor over the
   * same database object) are queued, and statements wait for them instead of joining them.
   *
   * @default {"wait"}
   */
  openTransaction?: "wait" | "join";
  /**
   * How long `"wait"` waits for a foreign transaction to end before it throws, counted from
   * the call (or from when the connection's queue first saw that transaction, if later), so
   * callers queued behind one another fail together rather than one timeout after another.
   *
   * @default {5000}
   */
  openTransactionTimeoutMs?: number;
}

/**
 * An executor over a synchronous SQLite database with `prepare(sql).all(...params)`:
 * `node:sqlite`'s `DatabaseSync` (also `@db/sqlite`). Prepared statements are cached by SQL
 * text per database; `undefined` binds as NULL, booleans as 0/1, `Date`s as ISO text.
 *
 * A connection has one transaction at a time and every statement on it joins the open one, so
 * run your transactions through `executor.transaction(fn)` (or
 * {@linkcode sqliteTransactionRunner}): it queues them, runs `BEGIN IMMEDIATE` ... `COMMIT`, and
 * hands `fn` a transaction handle; statements issued meanwhile on any executor over the same
 * database object (a dispatcher sharing the connection) wait for the commit instead of joining
 * the transaction. The queue belongs to the database object, not to the executor: create as
 * many executors over one database as you like.
 *
 * A transaction you opened yourself (`db.exec("BEGIN")`) is never joined: the executor's
 * statements and transactions wait for it to end, then run (see
 * {@linkcode SqliteExecutorOptions.openTransaction} to enqueue inside it deliberately).
 * Recommended settings for a file database: `PRAGMA journal_mode = WAL` and
 * `PRAGMA busy_timeout = 5000`.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { migrate, nodeSqliteExecutor, SqlOutboxRepository } from "@outbox/nats";
 *
 * const db = new DatabaseSync(":memory:");
 * const executor = nodeSqliteExecutor(db);
 * await migrate(executor, { dialect: "sqlite" });
 * db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
 *
 * await executor.transaction!(async (tx) => {
 *   await tx.query("INSERT INTO orders (id) VALUES (?)", [42]);
 *   await new SqlOutboxRepository(tx, "sqlite").enqueue({
 *     id: "order-42-created", kind: "event.publish", name: "order.created",
 *     subject: "orders.created", payload: JSON.stringify({ id: 42 }), headers: {},
 *   });
 * });
 * ```
 */
export function nodeSqliteExecutor(
  db: SqliteDatabase,
  options: SqliteExecutorOptions = {},
): SqlExecutor {
  return sqliteConnection(
    db,
    (sql, params) => cachedStatement(db, sql).all(...sqliteParams(params)) as SqlRow[],
    (sql) => db.exec ? db.exec(sql) : cachedStatement(db, sql).all(...([] as never[])),
    () => db.isTransaction ?? db.inTransaction ?? false,
    options,
    "SQLite",
  );
}

/**
 * An executor over a better-sqlite3 `Database` (for a Node without `node:sqlite`, which came in
 * 22.5). Statements that return rows run with `.all()`, the others with `.run()`
 * (better-sqlite3's `.all()` throws for statements without results). Prepared statements are
 * cached by SQL text; parameters are mapped as in {@linkcode nodeSqliteExecutor}, and
 * transactions are queued per database object and never join a transaction the library did not
 * open, as there.
 *
 * @example
 * ```ts ignore
 * import { type BetterSqlite3Database, betterSqlite3Executor, migrate, SqlOutboxRepository } from "@outbox/nats";
 *
 * // import Database from "better-sqlite3"; const db = new Database("app.db");
 * declare const db: BetterSqlite3Database & { pragma(source: string): unknown };
 * db.pragma("journal_mode = WAL");
 * const executor = betterSqlite3Executor(db);
 * await migrate(executor, { dialect: "sqlite" });
 * const outbox = new SqlOutboxRepository(executor, "sqlite");
 * ```
 */
export function betterSqlite3Executor(
  db: BetterSqlite3Database,
  options: SqliteExecutorOptions = {},
): SqlExecutor {
  return sqliteConnection(
    db,
    (sql, params) => {
      // better-sqlite3 treats numbered parameters (?1) as named ones: bind positionally.
      const { text, order } = positionalParameters(sql);
      const statement = cachedStatement(db, text);
      const values = sqliteParams(order ? order.map((n) => params[n - 1]) : params);
      if (statement.reader) return statement.all(...values) as SqlRow[];
      statement.run(...values);
      return [];
    },
    (sql) => db.exec(sql),
    () => db.inTransaction,
    options,
    "SQLite",
  );
}

const rewritten = new Map<string, { text: string; order?: number[] }>();

/**
 * Rewrites `?NNN` parameters to plain `?` and returns which parameter each one takes (string
 * literals and quoted identifiers are skipped). Cached per SQL text.
 */
function positionalParameters(sql: string): { text: string; order?: number[] } {
  let result = rewritten.get(sql);
  if (result) return result;
  if (!/\?\d/.test(sql)) {
    result = { text: sql };
  } else {
    const order: number[] = [];
    let text = "";
    let quote: string | undefined;
    for (let i = 0; i < sql.length; i++) {
      const char = sql[i];
      if (quote) {
        text += char;
        if (char === quote) quote = undefined;
      } else if (char === "'" || char === '"') {
        quote = char;
        text += char;
      } else if (char === "?" && /\d/.test(sql[i + 1] ?? "")) {
        let digits = "";
        while (/\d/.test(sql[i + 1] ?? "")) digits += sql[++i];
        order.push(Number(digits));
        text += "?";
      } else {
        text += char;
      }
    }
    result = { text, order };
  }
  if (rewritten.size >= maxCachedStatements) rewritten.delete(rewritten.keys().next().value!);
  rewritten.set(sql, result);
  return result;
}

let savepointCounter = 0;

/**
 * One synchronous SQLite connection shared by async callers, through the queue of its database
 * object (shared by every executor over it). A connection has one transaction at a time and
 * every statement on it joins the open transaction, so:
 *
 * - `transaction(fn)` calls are queued and each runs `BEGIN IMMEDIATE` ... `COMMIT` (`ROLLBACK`
 *   when `fn` throws), handing `fn` a transaction handle whose statements run at once;
 * - a statement on an executor, issued while the queue is busy (the dispatcher's claim during
 *   an inbox transaction, say), queues behind it instead of joining it, so it can never see or
 *   commit another caller's uncommitted rows;
 * - a transaction open on the connection that the library did not open (`openedElsewhere()`
 *   while the queue is idle) is waited for, bounded, in `"wait"` mode; `"join"` mode runs
 *   statements inside it and nests `transaction(fn)` as a savepoint.
 */
function sqliteConnection(
  db: object,
  run: (sql: string, params: readonly unknown[]) => SqlRow[],
  exec: (sql: string) => unknown,
  openedElsewhere: () => boolean,
  options: SqliteExecutorOptions,
  driver: string,
): SqlExecutor {
  const queue = connectionQueue(db);
  const join = options.openTransaction === "join";
  if (!join && options.openTransaction !== undefined && options.openTransaction !== "wait") {
    throw new OutboxValidationError(
      "openTransaction",
      `openTransaction must be "wait" or "join", got ${String(options.openTransaction)}`,
    );
  }
  const timeoutMs = nonNegative(
    "openTransactionTimeoutMs",
    options.openTransactionTimeoutMs ?? 5_000,
  );
  const direct = (sql: string, params: readonly unknown[]): Promise<SqlRow[]> => {
    try {
      return Promise.resolve(run(sql, params));
    } catch (error) {
      return Promise.reject(error);
    }
  };
  // The check that finds the connection free and the first statement happen in one synchronous
  // step (`then`), so no foreign BEGIN can slip in between them.
  const notInForeign = <T>(then: () => T | Promise<T>, calledAt: number): Promise<T> =>
    join
      ? Promise.resolve().then(then)
      : waitForForeignTransaction(openedElsewhere, timeoutMs, driver, then, { calledAt, queue });
  const savepoint = async <T>(fn: (tx: SqlExecutor) => Promise<T>, tx: SqlExecutor) => {
    const name = `outbox_sp_${++savepointCounter}`;
    exec(`SAVEPOINT ${name}`);
    try {
      const result = await fn(tx);
      exec(`RELEASE ${name}`);
      return result;
    } catch (error) {
      exec(`ROLLBACK TO ${name}`);
      exec(`RELEASE ${name}`);
      throw error;
    }
  };
  const handle: SqlExecutor = {
    query: direct,
    transaction: (fn) => savepoint(fn, handle),
  };
  /** Runs `fn` in the transaction just begun; commits, or rolls back when it throws. */
  const ownTransaction = async <T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> => {
    queue.ownTransactionOpen = true;
    try {
      const value = await fn(handle);
      exec("COMMIT");
      return value;
    } catch (error) {
      try {
        if (openedElsewhere()) exec("ROLLBACK");
      } catch {
        // SQLite may already have rolled back (for example after SQLITE_FULL)
      }
      throw error;
    } finally {
      queue.ownTransactionOpen = false;
    }
  };
  // In "join" mode, a transaction open on the connection that the library did not begin is the
  // caller's own: run in it at once, never behind entries that wait for it to end (those would
  // wait for the caller, and the caller for them, until the timeout).
  const inCallersTransaction = () => join && !queue.ownTransactionOpen && openedElsewhere();
  return {
    query(sql, params) {
      if (inCallersTransaction()) return direct(sql, params);
      if (!queue.busy && (join || !openedElsewhere())) return direct(sql, params);
      const calledAt = Date.now();
      return queue.run(() => notInForeign(() => run(sql, params), calledAt));
    },
    transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      if (inCallersTransaction()) return savepoint(fn, handle);
      const calledAt = Date.now();
      return queue.run(() =>
        notInForeign(() => {
          if (join && openedElsewhere()) return savepoint(fn, handle);
          exec("BEGIN IMMEDIATE");
          return ownTransaction(fn);
        }, calledAt)
      );
    },
  };
}

/**
 * An executor over one connection that is not a pool (a `pg.Client` or `PoolClient`, a
 * reserved postgres.js connection), through the connection's queue (shared by every executor
 * over the same connection object): `transaction(fn)` calls run one at a time, and a statement
 * issued while the queue is busy waits instead of joining the open transaction. Statements
 * issued while the queue is idle run at once, inside whatever transaction the caller opened on
 * the connection itself (the documented way to enqueue inside your own `BEGIN`).
 * `transaction(fn)` never nests in such a caller's transaction: with `foreign` (the driver
 * reports the connection's transaction status) it waits for it to end, bounded.
 */
function singleConnection(
  connection: object,
  direct: (text: string, params: readonly unknown[]) => Promise<SqlRow[]>,
  foreign: (() => boolean) | undefined,
  driver: string,
  timeoutMs: number,
  beginOwn?: () => Promise<boolean>,
): SqlExecutor {
  const queue = connectionQueue(connection);
  const handle = transactionHandle(direct);
  // BEGIN, once no transaction opened elsewhere is open (waited for, bounded). `beginOwn`
  // resolves false when its BEGIN landed in a transaction that a statement sent just before it
  // opened (a no-op then): that one is waited for too, and BEGIN sent again. From the check on,
  // an open transaction is the library's (`ownTransactionOpen`), not the caller's.
  const begin = async (calledAt: number): Promise<void> => {
    const mine = () => {
      queue.ownTransactionOpen = true;
    };
    for (;;) {
      if (foreign) {
        await waitForForeignTransaction(foreign, timeoutMs, driver, mine, { calledAt, queue });
      } else mine();
      if (!beginOwn) return void await direct("BEGIN", []);
      if (await beginOwn()) return;
      queue.ownTransactionOpen = false;
    }
  };
  return {
    query(text, params) {
      // Queued while a library transaction is open or pending, except inside the caller's own
      // BEGIN (pending library transactions wait for it: they must not be waited for).
      if (!queue.busy || (foreign && !queue.ownTransactionOpen && foreign())) {
        return direct(text, params);
      }
      return queue.run(() => direct(text, params));
    },
    transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      const calledAt = Date.now();
      return queue.run(async () => {
        try {
          return await manualTransaction(handle, fn, undefined, () => begin(calledAt));
        } finally {
          queue.ownTransactionOpen = false;
        }
      });
    },
  };
}

let pgSavepointCounter = 0;

/** The `tx` handed to `fn` inside the library's transaction: statements run at once. */
function transactionHandle(
  direct: (text: string, params: readonly unknown[]) => Promise<SqlRow[]>,
): SqlExecutor {
  const handle: SqlExecutor = {
    query: direct,
    transaction: (fn) => savepointTransaction(handle, fn),
  };
  return handle;
}

/** A savepoint inside the library's own transaction (a deliberate nesting by `fn`'s code). */
async function savepointTransaction<T>(
  tx: SqlExecutor,
  fn: (tx: SqlExecutor) => Promise<T>,
): Promise<T> {
  const name = `outbox_sp_${++pgSavepointCounter}`;
  await tx.query(`SAVEPOINT ${name}`, []);
  let result: T;
  try {
    result = await fn(tx);
  } catch (error) {
    await tx.query(`ROLLBACK TO SAVEPOINT ${name}`, []).catch(() => {});
    throw error;
  }
  await tx.query(`RELEASE SAVEPOINT ${name}`, []);
  return result;
}

/** BEGIN / COMMIT on an executor bound to one connection. */
async function manualTransaction<T>(
  executor: SqlExecutor,
  fn: (tx: SqlExecutor) => Promise<T>,
  onRollbackFailure?: () => void,
  begin: () => Promise<unknown> = () => executor.query("BEGIN", []),
): Promise<T> {
  await begin();
  let result: T;
  try {
    result = await fn(executor);
  } catch (error) {
    try {
      await executor.query("ROLLBACK", []);
    } catch {
      onRollbackFailure?.();
    }
    throw error;
  }
  await executor.query("COMMIT", []);
  return result;
}
