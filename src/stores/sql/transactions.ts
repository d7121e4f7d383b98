/**
 * Transactions on one SQLite connection: SQLite has one writer per database and a connection
 * has one transaction at a time, so concurrent callers are queued.
 *
 * @module
 */

import type { SqlExecutor } from "./executors.ts";

/**
 * A `TransactionRunner` for one SQLite connection (an executor from
 * `nodeSqliteExecutor` or `betterSqlite3Executor`): runs each `work` between `BEGIN IMMEDIATE`
 * and `COMMIT` (`ROLLBACK` when it throws), one at a time, in call order, through the
 * executor's own `transaction`, which queues per database object: statements other code issues
 * meanwhile on any executor over the same database (a dispatcher or an inbox consumer sharing
 * the connection) wait for the commit instead of joining the transaction, and a transaction
 * opened on the connection outside the library is waited for, never joined. Inside `work`, use
 * the `tx` handle it receives, never an outer executor (that would wait for the very
 * transaction it runs in).
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
): <T>(work: (tx: SqlExecutor) => Promise<T>) => Promise<T> {
  // Our SQLite executors queue their own transactions and keep other statements out of them.
  if (executor.transaction) {
    return <T>(work: (tx: SqlExecutor) => Promise<T>) => executor.transaction!(work);
  }
  // Any other executor: queue BEGIN IMMEDIATE ... COMMIT here. Statements issued on the same
  // executor elsewhere are not kept out of the open transaction; give such code its own handle.
  let tail: Promise<unknown> = Promise.resolve();
  return <T>(work: (tx: SqlExecutor) => Promise<T>): Promise<T> => {
    const run = tail.then(async () => {
      await executor.query("BEGIN IMMEDIATE", []);
      try {
        const result = await work(executor);
        await executor.query("COMMIT", []);
        return result;
      } catch (error) {
        await executor.query("ROLLBACK", []).catch(() => {
          // Already gone (for example SQLite rolled it back itself).
        });
        throw error;
      }
    });
    tail = run.catch(() => {});
    return run;
  };
}
