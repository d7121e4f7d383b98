/**
 * A SQLite executor whose statements run on a worker thread with its own connection, so a relay's
 * claims, marks and their commits (an fsync each) never block the thread that publishes to
 * JetStream and handles its acknowledgements.
 *
 * @module
 */

import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { OutboxValidationError } from "../../core/errors.ts";
import { nonNegative } from "../../core/limits.ts";
import { ConnectionQueue } from "./connection_queue.ts";
import { SqliteWorkerClosedError } from "./errors.ts";
import type { SqlExecutor, SqlRow } from "./executors.ts";
import { sqliteParams } from "./sqlite_statements.ts";
import type {
  SqliteWorkerErrorData,
  SqliteWorkerReply,
  SqliteWorkerRequest,
  SqliteWorkerSetup,
} from "./sqlite_worker_thread.ts";

/**
 * Options for {@linkcode sqliteWorkerExecutor}.
 *
 * @example
 * ```ts
 * import type { SqliteWorkerExecutorOptions } from "@outbox/nats";
 * const options: SqliteWorkerExecutorOptions = { busyTimeoutMs: 5_000, synchronous: "NORMAL" };
 * ```
 */
export interface SqliteWorkerExecutorOptions {
  /**
   * `PRAGMA busy_timeout` of the worker's connection: how long a statement waits for a write
   * lock another connection (your application's) holds before it fails with `SQLITE_BUSY`.
   *
   * @default {5000}
   */
  busyTimeoutMs?: number;
  /**
   * `PRAGMA synchronous` of the worker's connection (SQLite's default, `FULL`, when unset). In
   * WAL mode `NORMAL` skips the fsync per commit (a power loss may undo the last commits, never
   * corrupt the database): a relay's marks then cost less, and a lost mark only means the
   * message is published again (deduplicated by `Nats-Msg-Id` within the stream's window).
   */
  synchronous?: "OFF" | "NORMAL" | "FULL" | "EXTRA";
  /**
   * Set `PRAGMA journal_mode = WAL` on open (it is a property of the database file, so it
   * applies to every connection). WAL lets the application read while the relay writes.
   *
   * @default {true}
   */
  wal?: boolean;
}

/**
 * A {@linkcode SqlExecutor} over a worker thread's own SQLite connection; see
 * {@linkcode sqliteWorkerExecutor}.
 *
 * @example
 * ```ts ignore
 * import { type SqliteWorkerExecutor, sqliteWorkerExecutor } from "@outbox/nats";
 * await using executor: SqliteWorkerExecutor = await sqliteWorkerExecutor("app.db");
 * console.log(await executor.query("SELECT 1 AS one", [])); // [ { one: 1 } ]
 * ```
 */
export interface SqliteWorkerExecutor extends SqlExecutor {
  /** Runs `fn` between `BEGIN IMMEDIATE` and `COMMIT` on the worker's connection (queued). */
  transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T>;
  /**
   * Lets the statements already sent finish, closes the connection (an open transaction rolls
   * back) and ends the thread. Later calls, and those still queued behind a transaction,
   * reject with {@linkcode SqliteWorkerClosedError}. Idempotent.
   */
  close(): Promise<void>;
  /** `close()`, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Paths that name a private in-memory or temporary database, which a second thread cannot open.
 * A `file:` URI is read as SQLite reads it: the fragment ignored, the name percent-decoded
 * (`file:%3Amemory%3A` is `:memory:`), `mode=memory` and the in-memory VFS (`vfs=memdb`).
 */
function privateDatabase(path: string): boolean {
  if (path === "" || path === ":memory:") return true;
  if (!path.startsWith("file:")) return false;
  const [name, query = ""] = path.slice("file:".length).split("#", 1)[0].split("?", 2);
  let decoded = name;
  try {
    decoded = decodeURIComponent(name);
  } catch {
    // not valid percent-encoding: SQLite keeps such text as it is
  }
  const params = new URLSearchParams(query);
  return decoded === ":memory:" || decoded === "" || params.get("mode") === "memory" ||
    params.get("vfs") === "memdb";
}

/** The file a `URL` names; `undefined` for a URL that does not name a local file. */
function filePath(url: URL): string | undefined {
  if (url.protocol !== "file:") return undefined;
  try {
    return fileURLToPath(url);
  } catch {
    return undefined; // a host other than localhost
  }
}

/** The worker script next to this module (`.ts` under Deno from source, `.js` in the npm build). */
function workerUrl(): URL {
  const extension = new URL(import.meta.url).pathname.endsWith(".ts") ? "ts" : "js";
  return new URL(`./sqlite_worker_thread.${extension}`, import.meta.url);
}

const errorClasses: Record<string, new (message: string) => Error> = {
  Error,
  RangeError,
  TypeError,
  SyntaxError,
  ReferenceError,
  EvalError,
  URIError,
};

/** The worker's error as an error of the same class with the same fields (`code`, `errcode`). */
function revive(data: SqliteWorkerErrorData): Error {
  const error = new (errorClasses[data.name] ?? Error)(data.message);
  if (error.name !== data.name) {
    Object.defineProperty(error, "name", {
      value: data.name,
      configurable: true,
      writable: true,
      enumerable: false,
    });
  }
  Object.assign(error, data.fields);
  if (data.stack !== undefined) error.stack = data.stack;
  return error;
}

/**
 * A byte parameter as a copy of just its bytes, taken now: posting a view copies the whole
 * buffer behind it (a 10-byte view of 16 MiB cost 49 ms a call), and a `SharedArrayBuffer` is
 * not copied at all, so a change after the call would reach the statement. The driver binds any
 * view as its bytes, so a `Uint8Array` of them binds the same. Other values are returned as is.
 */
function ownBytes(value: unknown): unknown {
  if (!ArrayBuffer.isView(value)) return value;
  const whole = value.byteOffset === 0 && value.byteLength === value.buffer.byteLength &&
    value.buffer instanceof ArrayBuffer;
  if (whole) return value;
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength).slice();
}

let savepointCounter = 0;

/**
 * Opens a SQLite executor whose statements run on a worker thread (`node:worker_threads`) with
 * its own `node:sqlite` connection to the database file at `path`, for a relay: the
 * dispatcher's claims, marks, hand-overs and prunes (and their commits, an fsync each under
 * `synchronous = FULL`) then run off the thread that publishes to JetStream and handles its
 * PubAcks. Resolves once the worker has opened the database; rejects with the driver's error
 * when it cannot, and with `OutboxValidationError` for `":memory:"` (or any other private
 * in-memory / temporary database), which a second connection cannot see.
 *
 * Statements run in the order they are issued. `transaction(fn)` runs `BEGIN IMMEDIATE` ...
 * `COMMIT` (`ROLLBACK` when `fn` throws; savepoints when `fn` nests), one transaction at a time:
 * statements issued meanwhile on the executor wait for the commit instead of joining it.
 * Parameters bind as with {@linkcode nodeSqliteExecutor}; rows and driver errors come back as on
 * the calling thread (numbers, bigints, text, `Uint8Array` blobs, null; errors of the same class
 * with their `code`, `errcode` and `errstr`). A call after `close()`, or after the thread died,
 * rejects with {@linkcode SqliteWorkerClosedError}; so do calls waiting when that happened.
 *
 * Enqueue on your application's own connection, in your transaction (`nodeSqliteExecutor` over
 * your `DatabaseSync`), and give only the relay this executor. Two connections write to one
 * file: each waits for the other's write lock (`busy_timeout`, both sides). Use WAL mode and a
 * busy timeout on your connection too (`PRAGMA busy_timeout = 5000`), or your `BEGIN IMMEDIATE`
 * may fail with `SQLITE_BUSY` while the relay commits. Needs `node:sqlite` (Deno, Node >= 22.5).
 *
 * @example
 * ```ts ignore
 * import { DatabaseSync } from "node:sqlite";
 * import {
 *   createJetStreamRuntime,
 *   migrate,
 *   nodeSqliteExecutor,
 *   OutboxDispatcher,
 *   SqlOutboxRepository,
 *   sqliteWorkerExecutor,
 * } from "@outbox/nats";
 * import { jetstream } from "@nats-io/jetstream";
 * import { connect } from "@nats-io/transport-node";
 *
 * // The application enqueues on its own connection, in its own transactions.
 * const db = new DatabaseSync("app.db");
 * db.exec("PRAGMA journal_mode = WAL");
 * db.exec("PRAGMA busy_timeout = 5000");
 * await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
 *
 * // The relay claims and marks on a worker thread's connection.
 * const relay = await sqliteWorkerExecutor("app.db", { busyTimeoutMs: 5_000 });
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const dispatcher = new OutboxDispatcher(
 *   new SqlOutboxRepository(relay, "sqlite"),
 *   createJetStreamRuntime(jetstream(nc)),
 * );
 * // It relays from now on; on shutdown:
 * await dispatcher.stop();
 * await relay.close();
 * await nc.close();
 * ```
 */
export async function sqliteWorkerExecutor(
  path: string | URL,
  options: SqliteWorkerExecutorOptions = {},
): Promise<SqliteWorkerExecutor> {
  const file = path instanceof URL ? filePath(path) : path;
  if (path instanceof URL && file === undefined) {
    throw new OutboxValidationError(
      "path",
      `sqliteWorkerExecutor needs a database file: ${path.href} is not a file: URL of this host`,
    );
  }
  if (typeof file !== "string" || privateDatabase(file)) {
    throw new OutboxValidationError(
      "path",
      `sqliteWorkerExecutor needs a database file: ${
        JSON.stringify(String(file))
      } is private to one connection (in memory or temporary), which the worker thread's own connection cannot see; use nodeSqliteExecutor for it`,
    );
  }
  const synchronous = options.synchronous;
  if (synchronous !== undefined && !["OFF", "NORMAL", "FULL", "EXTRA"].includes(synchronous)) {
    throw new OutboxValidationError(
      "synchronous",
      `synchronous must be "OFF", "NORMAL", "FULL" or "EXTRA", got ${String(synchronous)}`,
    );
  }
  const setup: SqliteWorkerSetup = {
    path: file,
    busyTimeoutMs: nonNegative("busyTimeoutMs", options.busyTimeoutMs ?? 5_000),
    synchronous,
    wal: options.wal ?? true,
  };
  const worker = new Worker(workerUrl(), { workerData: setup });
  const connection = new WorkerConnection(worker);
  try {
    await connection.opened;
  } catch (error) {
    await connection.terminate();
    throw error;
  }
  const executor = connection.executor();
  threads.set(executor, worker);
  return executor;
}

/** The thread behind each executor, for tests that end it behind the executor's back. */
const threads = new WeakMap<SqlExecutor, Worker>();

/**
 * The worker thread behind `executor` (internal: tests use it to end the thread abruptly);
 * `undefined` for any other executor.
 */
export function sqliteWorkerThreadOf(executor: SqlExecutor): Worker | undefined {
  return threads.get(executor);
}

/** A request without its id (assigned when it is posted). */
type Request = SqliteWorkerRequest extends infer R ? R extends unknown ? Omit<R, "id"> : never
  : never;

type Pending = { resolve(rows: SqlRow[]): void; reject(error: unknown): void };

/** The worker and the calls waiting for its replies. */
class WorkerConnection {
  readonly #worker: Worker;
  readonly #pending = new Map<number, Pending>();
  readonly #queue = new ConnectionQueue();
  #nextId = 1;
  /** Why calls fail from now on, once closed or gone. */
  #gone: SqliteWorkerClosedError | undefined;
  /**
   * Calls queued behind a transaction and not started yet: rejected as soon as the executor is
   * closed or its thread is gone, not when that transaction ends (its `fn` may never end).
   */
  readonly #waiting = new Set<(error: unknown) => void>();
  #exited: Promise<void>;
  /** Resolves once the database is open; rejects with the reason it could not be opened. */
  readonly opened: Promise<void>;

  constructor(worker: Worker) {
    this.#worker = worker;
    let onOpen!: Pending;
    this.opened = new Promise<void>((resolve, reject) => {
      onOpen = { resolve: () => resolve(), reject };
    });
    this.#pending.set(0, onOpen);
    this.#exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
    worker.on("message", (reply: SqliteWorkerReply) => {
      const call = this.#pending.get(reply.id);
      if (!call) return;
      this.#pending.delete(reply.id);
      this.#idle();
      if ("error" in reply) call.reject(revive(reply.error));
      else call.resolve(reply.rows as SqlRow[]);
    });
    worker.on("error", (error) => {
      this.#fail(new SqliteWorkerClosedError("exited", `it failed: ${error}`, { cause: error }));
    });
    worker.on("exit", (code) => {
      this.#fail(
        new SqliteWorkerClosedError("exited", `it exited with code ${code}`, { cause: code }),
      );
    });
  }

  /** Rejects every waiting call with `reason` and refuses new ones. */
  #fail(reason: SqliteWorkerClosedError): void {
    this.#refuse(reason);
    const calls = [...this.#pending.values()];
    this.#pending.clear();
    for (const call of calls) call.reject(this.#gone);
  }

  /** Refuses new calls with `reason` (unless already refused) and rejects the queued ones. */
  #refuse(reason: SqliteWorkerClosedError): void {
    this.#gone ??= reason;
    const waiting = [...this.#waiting];
    this.#waiting.clear();
    for (const reject of waiting) reject(this.#gone);
  }

  /**
   * Runs `fn` on the queue once the entries before it ended, unless the executor is closed or
   * its thread gone before then: the call then rejects at once instead of waiting for them.
   */
  queued<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#gone) return Promise.reject(this.#gone);
    return new Promise<T>((resolve, reject) => {
      this.#waiting.add(reject);
      this.#queue.run(() => {
        this.#waiting.delete(reject);
        if (this.#gone) throw this.#gone;
        return fn();
      }).then(resolve, reject);
    });
  }

  /** The worker keeps the process alive only while a call waits for it. */
  #idle(): void {
    if (this.#pending.size === 0) this.#worker.unref();
  }

  /** Posts `request` (its id assigned here) and resolves with the reply's rows. */
  send(request: Request): Promise<SqlRow[]> {
    if (this.#gone) return Promise.reject(this.#gone);
    const id = this.#nextId++;
    return new Promise<SqlRow[]>((resolve, reject) => {
      // Posted first: a parameter that cannot be cloned throws here, and nothing waits for it.
      this.#worker.postMessage({ ...request, id } as SqliteWorkerRequest);
      if (this.#pending.size === 0) this.#worker.ref();
      this.#pending.set(id, { resolve, reject });
    });
  }

  query(sql: string, params: readonly unknown[]): Promise<SqlRow[]> {
    let mapped: unknown[];
    try {
      mapped = sqliteParams(params).map(ownBytes); // an invalid Date throws: a rejection
    } catch (error) {
      return Promise.reject(error);
    }
    return this.send({ op: "query", sql, params: mapped });
  }

  /** Ends the thread at once (it could not open the database). */
  async terminate(): Promise<void> {
    this.#gone ??= new SqliteWorkerClosedError("closed", "the database could not be opened");
    await this.#worker.terminate();
    await this.#exited;
  }

  /** The one close of this connection: a second `close()` waits for the first. */
  #closing: Promise<void> | undefined;

  /**
   * Idempotent: a second call (`await using` after an explicit `close()`, two shutdown hooks)
   * returns the first call's promise instead of ending the thread under the statements the
   * first one lets finish.
   */
  close(): Promise<void> {
    return this.#closing ??= this.#close();
  }

  async #close(): Promise<void> {
    if (!this.#gone) {
      // Behind every statement already posted: they finish first.
      const closing = this.send({ op: "close" });
      this.#refuse(new SqliteWorkerClosedError("closed", "close() was called"));
      await closing.catch(() => {});
    }
    // The thread has closed the database (or is gone): end it.
    await this.#worker.terminate();
    await this.#exited;
    // Calls that were queued behind a transaction when close() came reject (see send()).
    this.#fail(this.#gone!);
  }

  executor(): SqliteWorkerExecutor {
    const queue = this.#queue;
    const queued = <T>(fn: () => Promise<T>) => this.queued(fn);
    const direct = (sql: string, params: readonly unknown[]) => this.query(sql, params);
    const exec = (sql: string) => this.send({ op: "exec", sql });
    const handle: SqlExecutor = {
      query: direct,
      async transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
        const name = `outbox_sp_${++savepointCounter}`;
        await exec(`SAVEPOINT ${name}`);
        try {
          const result = await fn(handle);
          await exec(`RELEASE ${name}`);
          return result;
        } catch (error) {
          await exec(`ROLLBACK TO ${name}`).catch(() => {});
          await exec(`RELEASE ${name}`).catch(() => {});
          throw error;
        }
      },
    };
    const rollback = () => this.send({ op: "rollback" });
    const close = () => this.close();
    return {
      query(sql, params) {
        // While a transaction is open or waiting, a statement waits for it instead of joining.
        return queue.busy ? queued(() => direct(sql, params)) : direct(sql, params);
      },
      transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
        return queued(async () => {
          await exec("BEGIN IMMEDIATE");
          try {
            const result = await fn(handle);
            await exec("COMMIT");
            return result;
          } catch (error) {
            // Also after a failed COMMIT: the connection must not stay in the transaction.
            await rollback().catch(() => {});
            throw error;
          }
        });
      },
      close,
      [Symbol.asyncDispose]: close,
    };
  }
}
