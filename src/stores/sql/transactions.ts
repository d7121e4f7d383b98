/**
 * Transactions on one SQLite connection: SQLite has one writer per database and a connection
 * has one transaction at a time, so concurrent callers are queued.
 *
 * @module
 */

import type { TransactionRunner } from "../../core/types.ts";
import type { SqlExecutor } from "./executors.ts";

/**
 * Options for {@linkcode sqliteTransactionRunner}.
 *
 * @example
 * ```ts
 * import type { SqliteTransactionOptions } from "@outbox/nats";
 * const options: SqliteTransactionOptions = { mode: "IMMEDIATE" };
 * ```
 */
export interface SqliteTransactionOptions {
  /**
   * How the transaction begins. `IMMEDIATE` takes the write lock at `BEGIN`, so a transaction
   * that writes never fails halfway with SQLITE_BUSY on an upgrade.
   *
   * @default {"IMMEDIATE"}
   */
  mode?: "IMMEDIATE" | "DEFERRED" | "EXCLUSIVE";
}

/**
 * A {@linkcode TransactionRunner} for one SQLite connection (an executor from
 * `nodeSqliteExecutor` or `betterSqlite3Executor`): runs each `work` between `BEGIN IMMEDIATE`
 * and `COMMIT` (`ROLLBACK` when it throws), one at a time, in call order. `work` receives the
 * same executor; do not start another transaction on the connection from inside it.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import {
 *   migrate,
 *   nodeSqliteExecutor,
 *   SqlOutboxRepository,
 *   sqliteTransactionRunner,
 * } from "@outbox/nats";
 *
 * const db = new DatabaseSync(":memory:");
 * const executor = nodeSqliteExecutor(db);
 * await migrate(executor, { dialect: "sqlite" });
 * db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)");
 * const inTransaction = sqliteTransactionRunner(executor);
 * await inTransaction(async (tx) => {
 *   await tx.query("INSERT INTO orders (item) VALUES (?)", ["book"]);
 *   await new SqlOutboxRepository(tx, "sqlite").enqueue({
 *     id: "order-1", kind: "event.publish", name: "order.created", subject: "orders.created",
 *     payload: '{"item":"book"}', headers: {},
 *   });
 * });
 * ```
 */
export function sqliteTransactionRunner(
  executor: SqlExecutor,
  options: SqliteTransactionOptions = {},
): TransactionRunner<SqlExecutor> {
  const begin = `BEGIN ${options.mode ?? "IMMEDIATE"}`;
  let tail: Promise<unknown> = Promise.resolve();
  return <T>(work: (tx: SqlExecutor) => Promise<T>): Promise<T> => {
    const run = tail.then(async () => {
      await executor.query(begin, []);
      let result: T;
      try {
        result = await work(executor);
      } catch (error) {
        try {
          await executor.query("ROLLBACK", []);
        } catch {
          // The transaction is already gone (for example SQLite rolled it back itself).
        }
        throw error;
      }
      try {
        await executor.query("COMMIT", []);
      } catch (error) {
        await executor.query("ROLLBACK", []).catch(() => {});
        throw error;
      }
      return result;
    });
    tail = run.catch(() => {});
    return run;
  };
}
