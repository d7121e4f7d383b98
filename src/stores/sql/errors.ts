/**
 * Errors of the SQL stores' executors.
 *
 * @module
 */

import { OutboxStoreClosedError } from "../../core/errors.ts";

/**
 * A statement or transaction of the library found a transaction open on its connection that the
 * library did not open (your own `BEGIN`, an ORM's transaction), waited for it to end, and gave
 * up after `waitedMs`. The library never runs its statements inside a transaction it did not
 * open: a dispatcher's claim there could publish a row that later rolls back, and an inbox
 * transaction there would only be a savepoint that the outer rollback undoes after the ack.
 * Nothing ran.
 *
 * Run your transactions through the executor (`executor.transaction(fn)` or
 * `sqliteTransactionRunner`), enqueue inside them on the `tx` handle, or give the relay its own
 * connection. To enqueue inside a transaction your own code opened on the connection, use an
 * executor created with `{ openTransaction: "join" }` for that.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { nodeSqliteExecutor, SqlForeignTransactionError } from "@outbox/nats";
 *
 * const db = new DatabaseSync(":memory:");
 * const executor = nodeSqliteExecutor(db, { openTransactionTimeoutMs: 10 });
 * db.exec("BEGIN");
 * try {
 *   await executor.query("SELECT 1", []);
 * } catch (error) {
 *   console.log(error instanceof SqlForeignTransactionError); // true
 * }
 * db.exec("ROLLBACK");
 * ```
 */
export class SqlForeignTransactionError extends Error {
  /** How long the library waited for the foreign transaction to end. */
  readonly waitedMs: number;
  /** Creates the error; `driver` names the connection, for example `node:sqlite`. */
  constructor(driver: string, waitedMs: number, options?: ErrorOptions) {
    super(
      `A transaction the library did not open is open on this ${driver} connection and did not ` +
        `end within ${waitedMs} ms; the library never runs its statements inside it (they would ` +
        `see or commit its uncommitted rows). Run transactions through executor.transaction(fn) ` +
        `or sqliteTransactionRunner, give the relay its own connection, or use an executor with ` +
        `{ openTransaction: "join" } to enqueue inside your own transaction. Nothing ran.`,
      options,
    );
    this.name = "SqlForeignTransactionError";
    this.waitedMs = waitedMs;
  }
}

/**
 * Waits until `open()` is false, polling with a growing interval, then calls `then` in the same
 * synchronous step as the check that found the connection free (an await in between would let
 * other code open a transaction that `then`'s statement would join); throws after `timeoutMs`.
 */
export async function waitForForeignTransaction<T>(
  open: () => boolean,
  timeoutMs: number,
  driver: string,
  then: () => T | Promise<T>,
  clock: { calledAt: number; queue: { foreignSince: number | undefined } } = {
    calledAt: Date.now(),
    queue: { foreignSince: undefined },
  },
): Promise<T> {
  // The wait counts from the call, or from when the queue first saw this foreign transaction
  // if that is later: callers queued behind one another all fail within `timeoutMs` of it.
  let delay = 1;
  while (open()) {
    const now = Date.now();
    clock.queue.foreignSince ??= now;
    const waited = now - Math.max(clock.calledAt, clock.queue.foreignSince);
    if (waited >= timeoutMs) throw new SqlForeignTransactionError(driver, timeoutMs);
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay, timeoutMs - waited)));
    delay = Math.min(delay * 2, 25);
  }
  clock.queue.foreignSince = undefined;
  return await then();
}

/**
 * A call on a {@linkcode sqliteWorkerExecutor} that cannot run because the executor is closed or
 * its worker thread is gone: `close()` was called (`reason: "closed"`), or the thread exited or
 * failed (`reason: "exited"`, the thread's error or exit code as `cause`). Every call still
 * waiting when that happened rejects with it; nothing is left hanging. Statements whose reply
 * was lost may or may not have run: the stores' fencing (claim tokens, leases) makes a retry on
 * a new executor safe.
 *
 * @example
 * ```ts ignore
 * import { sqliteWorkerExecutor, SqliteWorkerClosedError } from "@outbox/nats";
 *
 * const executor = await sqliteWorkerExecutor("app.db");
 * await executor.close();
 * try {
 *   await executor.query("SELECT 1", []);
 * } catch (error) {
 *   console.log(error instanceof SqliteWorkerClosedError); // true
 * }
 * ```
 */
export class SqliteWorkerClosedError extends OutboxStoreClosedError {
  /** `"closed"`: `close()` was called; `"exited"`: the worker thread ended or failed. */
  readonly reason: "closed" | "exited";
  /** Creates the error; `options.cause` carries the thread's error or exit code. */
  constructor(reason: "closed" | "exited", detail: string, options?: ErrorOptions) {
    super(
      reason === "closed"
        ? `The SQLite worker executor is closed (${detail}); open a new one to run statements.`
        : `The SQLite worker executor's thread is gone (${detail}); open a new executor.`,
      options,
    );
    this.name = "SqliteWorkerClosedError";
    this.reason = reason;
  }
}
