/**
 * One queue per database connection: a connection has one transaction at a time, and every
 * statement sent on it joins the transaction that is open. Whatever runs the library's
 * statements on a single connection (a SQLite handle, a `pg.Client`, a reserved postgres.js
 * connection) goes through the queue of that connection object, whichever executor issued them,
 * so two executors over one connection never interleave their transactions.
 *
 * @module
 */

/**
 * The queue of one connection: entries (a library transaction, or a statement that arrived while
 * the connection was busy) run one at a time, in call order.
 */
export class ConnectionQueue {
  #tail: Promise<unknown> = Promise.resolve();
  #entries = 0;
  /**
   * When an entry first found the transaction that is open on the connection (one the library
   * did not open) still open, or `undefined` once an entry found the connection free: entries
   * queued behind the first one waiting for it count their wait from then, not from their turn.
   */
  foreignSince: number | undefined;
  /**
   * Whether a transaction the library began is open on the connection (so an open transaction
   * is not a foreign one that a `"join"` executor may run in, even while entries wait).
   */
  ownTransactionOpen = false;

  /** Whether an entry is running or waiting: a new statement must queue, not run at once. */
  get busy(): boolean {
    return this.#entries > 0;
  }

  /** Runs `fn` once every entry queued before it has ended; nothing else of the queue runs meanwhile. */
  run<T>(fn: () => T | Promise<T>): Promise<T> {
    this.#entries += 1;
    const result = this.#tail.then(fn).finally(() => {
      this.#entries -= 1;
    });
    this.#tail = result.catch(() => {});
    return result;
  }
}

const queues = new WeakMap<object, ConnectionQueue>();

/** The queue of `connection` (the driver's connection object), created on first use. */
export function connectionQueue(connection: object): ConnectionQueue {
  let queue = queues.get(connection);
  if (!queue) queues.set(connection, queue = new ConnectionQueue());
  return queue;
}
