/**
 * Executors: the one seam between the SQL stores and a database driver. An executor runs one
 * statement with positional parameters and returns its rows keyed by column name. Adapters are
 * provided for postgres.js, node-postgres (`pg`), `node:sqlite` (and databases with the same
 * `prepare(sql).all(...params)` shape, such as `@db/sqlite`) and better-sqlite3. None of them
 * imports its driver: each takes the caller's handle, so the caller's transaction is used as is.
 *
 * @module
 */

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
 * when the executor is already a transaction). Only `migrate()` needs it.
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
 * `transaction` uses `sql.begin` on the top-level handle, `tx.savepoint` inside a transaction,
 * and `BEGIN` / `COMMIT` on a reserved connection.
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
  const executor: SqlExecutor = {
    async query(text, params) {
      const rows = await sql.unsafe(text, params as never[], unsafeOptions);
      return rows as unknown as SqlRow[];
    },
    transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      const wrap = (tx: PostgresJsSql) => fn(postgresJsExecutor(tx, options));
      if (typeof sql.begin === "function") {
        return (sql.begin as Begin).call(sql, wrap) as Promise<T>;
      }
      if (typeof sql.savepoint === "function") {
        return (sql.savepoint as Begin).call(sql, wrap) as Promise<T>;
      }
      return manualTransaction(executor, "BEGIN", fn);
    },
  };
  return executor;
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
}

interface PgPoolClient extends PgQueryable {
  release(error?: Error | boolean): void;
}

/**
 * An executor over node-postgres (`pg`): a `Pool`, a `Client`, or a `PoolClient` you checked
 * out (for example to run a transaction).
 *
 * `transaction` checks a client out of a `Pool` for `BEGIN` ... `COMMIT`; on a `Client` or
 * `PoolClient` it issues `BEGIN` / `COMMIT` on it, so call it outside your own transaction.
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
export function pgExecutor(queryable: PgQueryable): SqlExecutor {
  const isPool = typeof queryable.release !== "function" && "totalCount" in queryable &&
    typeof queryable.connect === "function";
  const executor: SqlExecutor = {
    async query(text, params) {
      const result = await queryable.query(text, params as unknown[]);
      return result.rows;
    },
    async transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      if (!isPool) return await manualTransaction(executor, "BEGIN", fn);
      const client = await (queryable.connect as () => Promise<PgPoolClient>)();
      let broken = false;
      try {
        return await manualTransaction(pgExecutor(client), "BEGIN", fn, () => {
          broken = true;
        });
      } finally {
        client.release(broken);
      }
    },
  };
  return executor;
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

const maxCachedStatements = 256;

/** Prepared statements per database object, so executors are cheap to create. */
const statementCaches = new WeakMap<object, Map<string, unknown>>();

function cachedStatement<S>(db: { prepare(sql: string): S }, sql: string): S {
  let cache = statementCaches.get(db);
  if (!cache) statementCaches.set(db, cache = new Map());
  let statement = cache.get(sql) as S | undefined;
  if (statement === undefined) {
    statement = db.prepare(sql);
    if (cache.size >= maxCachedStatements) cache.delete(cache.keys().next().value!);
    cache.set(sql, statement);
  }
  return statement;
}

/** SQLite binds numbers, strings, bigints, bytes and null; map the rest. */
function sqliteParams(params: readonly unknown[]): never[] {
  return params.map((value) => {
    if (value === undefined || value === null) return null;
    if (typeof value === "boolean") return value ? 1 : 0;
    if (value instanceof Date) return value.toISOString();
    return value;
  }) as never[];
}

/**
 * An executor over a synchronous SQLite database with `prepare(sql).all(...params)`:
 * `node:sqlite`'s `DatabaseSync` (also `@db/sqlite`). Prepared statements are cached by SQL
 * text per database; `undefined` binds as NULL, booleans as 0/1, `Date`s as ISO text.
 *
 * A connection has one transaction at a time and every statement on it joins the open one, so
 * run your transactions through `executor.transaction(fn)` (or
 * {@linkcode sqliteTransactionRunner}): it queues them, runs `BEGIN IMMEDIATE` ... `COMMIT`, and
 * hands `fn` a transaction handle; statements issued on the executor itself meanwhile (a
 * dispatcher sharing the connection) wait for the commit instead of joining the transaction.
 * Inside a transaction you opened yourself with `db.exec("BEGIN")`, `transaction` uses a
 * savepoint. Recommended settings for a file database: `PRAGMA journal_mode = WAL` and
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
export function nodeSqliteExecutor(db: SqliteDatabase): SqlExecutor {
  return sqliteConnection(
    (sql, params) => cachedStatement(db, sql).all(...sqliteParams(params)) as SqlRow[],
    (sql) => db.exec ? db.exec(sql) : cachedStatement(db, sql).all(...([] as never[])),
    () => db.isTransaction ?? db.inTransaction ?? false,
  );
}

/**
 * An executor over a better-sqlite3 `Database` (for a Node without `node:sqlite`, which came in
 * 22.5). Statements that return rows run with `.all()`, the others with `.run()`
 * (better-sqlite3's `.all()` throws for statements without results). Prepared statements are
 * cached by SQL text; parameters are mapped as in {@linkcode nodeSqliteExecutor}.
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
export function betterSqlite3Executor(db: BetterSqlite3Database): SqlExecutor {
  return sqliteConnection(
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
 * One synchronous SQLite connection shared by async callers. A connection has one transaction
 * at a time and every statement on it joins the open transaction, so:
 *
 * - `transaction(fn)` calls are queued and each runs `BEGIN IMMEDIATE` ... `COMMIT` (`ROLLBACK`
 *   when `fn` throws), handing `fn` a transaction handle whose statements run at once;
 * - a statement on the connection handle itself, issued while a queued transaction is open (the
 *   dispatcher's claim, say), waits until that transaction ended instead of joining it, so it
 *   can never see or commit another caller's uncommitted rows;
 * - inside a transaction the caller opened itself (`db.exec("BEGIN")`), `transaction(fn)` uses
 *   a savepoint, and statements run at once.
 */
function sqliteConnection(
  run: (sql: string, params: readonly unknown[]) => SqlRow[],
  exec: (sql: string) => unknown,
  openedElsewhere: () => boolean,
): SqlExecutor {
  let tail: Promise<unknown> = Promise.resolve();
  let open = false;
  const direct = (sql: string, params: readonly unknown[]): Promise<SqlRow[]> => {
    try {
      return Promise.resolve(run(sql, params));
    } catch (error) {
      return Promise.reject(error);
    }
  };
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
  return {
    query(sql, params) {
      return open ? tail.then(() => direct(sql, params)) : direct(sql, params);
    },
    transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      if (!open && openedElsewhere()) return savepoint(fn, handle);
      const result = tail.then(async () => {
        exec("BEGIN IMMEDIATE");
        open = true;
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
          open = false;
        }
      });
      tail = result.catch(() => {});
      return result;
    },
  };
}

/** BEGIN / COMMIT on an executor bound to one connection. */
async function manualTransaction<T>(
  executor: SqlExecutor,
  begin: string,
  fn: (tx: SqlExecutor) => Promise<T>,
  onRollbackFailure?: () => void,
): Promise<T> {
  await executor.query(begin, []);
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
