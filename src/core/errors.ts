/**
 * Small named error classes. Each carries the data a caller needs to react, and `cause` when
 * it wraps another error.
 *
 * @module
 */

import type { OutboxFailureScope } from "./types.ts";

/**
 * A record, option or name was rejected before anything was stored.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, OutboxValidationError } from "@outbox/nats";
 * try {
 *   await new MemoryOutboxRepository().enqueue({
 *     id: "", kind: "event.publish", name: "x", subject: "a.b", payload: "{}", headers: {},
 *   });
 * } catch (error) {
 *   if (error instanceof OutboxValidationError) console.log(error.field); // "id"
 * }
 * ```
 */
export class OutboxValidationError extends Error {
  /** The offending field, for example `id`, `subject`, `headers.X-Trace` or `tables.outbox`. */
  readonly field: string;
  /** Creates the error for `field` with a message that says what is wrong. */
  constructor(field: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "OutboxValidationError";
    this.field = field;
  }
}

/**
 * An outbox id was reused for different immutable content.
 *
 * @example
 * ```ts
 * import { OutboxDuplicateIdentityError } from "@outbox/nats";
 * const error = new OutboxDuplicateIdentityError("order-42");
 * console.log(error.id, error.message);
 * ```
 */
export class OutboxDuplicateIdentityError extends Error {
  /** The reused id. */
  readonly id: string;
  /** Creates the error for `id`. */
  constructor(id: string, options?: ErrorOptions) {
    super(`Outbox message '${id}' already exists with different immutable content`, options);
    this.name = "OutboxDuplicateIdentityError";
    this.id = id;
  }
}

/**
 * Storage reported a duplicate id but the winning message could not be read back.
 *
 * @example
 * ```ts
 * import { OutboxStorageConflictError } from "@outbox/nats";
 * const error = new OutboxStorageConflictError("order-42");
 * console.log(error.id);
 * ```
 */
export class OutboxStorageConflictError extends Error {
  /** The conflicting id. */
  readonly id: string;
  /** Creates the error for `id`. */
  constructor(id: string, options?: ErrorOptions) {
    super(`Outbox message '${id}' conflicted but no stored row was found`, options);
    this.name = "OutboxStorageConflictError";
    this.id = id;
  }
}

/**
 * A store that can run nothing any more: it was closed, or what it runs its statements on is
 * gone for good (for example the worker thread of a `sqliteWorkerExecutor`). Unlike a database
 * blip, retrying on the same repository cannot succeed, so the dispatcher does not retry a mark
 * that failed with it until the lease ends (its claims stay claimed until their lease ends, and
 * a relay on a new store publishes them again, deduplicated by `Nats-Msg-Id`). Stores throw
 * subclasses of it.
 *
 * @example
 * ```ts
 * import { OutboxStoreClosedError } from "@outbox/nats";
 * const error = new OutboxStoreClosedError("the executor is closed");
 * console.log(error instanceof OutboxStoreClosedError, error.message);
 * ```
 */
export class OutboxStoreClosedError extends Error {
  /** Creates the error with `message` (the cause, when known, as `options.cause`). */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "OutboxStoreClosedError";
  }
}

/**
 * A stored message could not be decoded (corrupt row or entry, bad JSON payload, unknown kind).
 * Stores move such messages to `dead` with this error's message as `lastError`.
 *
 * @example
 * ```ts
 * import { OutboxCorruptRecordError } from "@outbox/nats";
 * const error = new OutboxCorruptRecordError("m-1", "headers is not a JSON object");
 * console.log(error.id, error.reason);
 * ```
 */
export class OutboxCorruptRecordError extends Error {
  /** The id of the message, when it could be read. */
  readonly id: string | undefined;
  /** What is wrong with it. */
  readonly reason: string;
  /** Creates the error for message `id` (if known) with `reason`. */
  constructor(id: string | undefined, reason: string, options?: ErrorOptions) {
    super(
      id === undefined
        ? `Corrupt outbox record: ${reason}`
        : `Corrupt outbox record '${id}': ${reason}`,
      options,
    );
    this.name = "OutboxCorruptRecordError";
    this.id = id;
    this.reason = reason;
  }
}

/**
 * A dispatched mark whose job outcome the store has no room for next to its message (a NATS KV
 * record is one entry, below the server's `max_payload`): the store settled that claim `dead`
 * instead, with `lastError` starting `outcome: `, so the job is not claimed and run again. Thrown
 * by `markDispatched`, and by `markMany` once every mark of its batch has settled (the other
 * marks applied; sending the same marks again reports them `true` and throws this again). A
 * `dead` mark of the same claim then reports `true` and changes nothing, so a caller can record
 * what was stored. The dispatcher asks first (`OutboxRepository.outcomeRoomBytes`) and, when the
 * store still refuses, records the message as dead with this `lastError`.
 *
 * @example
 * ```ts
 * import { OutboxOutcomeRefusedError } from "@outbox/nats";
 * const error = new OutboxOutcomeRefusedError("job-1", "outcome: the job's outcome cannot be stored: ...");
 * console.log(error.id, error.lastError);
 * ```
 */
export class OutboxOutcomeRefusedError extends Error {
  /** The id of the message, now `dead`. */
  readonly id: string;
  /** What the store kept as the message's `lastError` (it starts with `outcome: `). */
  readonly lastError: string;
  /** Creates the error for message `id`, stored dead with `lastError`. */
  constructor(id: string, lastError: string, options?: ErrorOptions) {
    super(`Outbox message '${id}' was stored dead instead of dispatched: ${lastError}`, options);
    this.name = "OutboxOutcomeRefusedError";
    this.id = id;
    this.lastError = lastError;
  }
}

/**
 * How a delivery failure should be handled:
 *
 * - `permanent`: retrying cannot help (payload over the server's limit, invalid subject); the
 *   message goes `dead` at once.
 * - `retryable`: this message failed (no stream for its subject yet, a rejected publish); it is
 *   retried with backoff until `maxAttempts`.
 * - `unavailable`: the broker itself is unreachable or not answering; the dispatcher pauses
 *   (circuit breaker) instead of burning every message's attempts.
 *
 * @example
 * ```ts
 * import type { OutboxFailureKind } from "@outbox/nats";
 * const kind: OutboxFailureKind = "retryable";
 * ```
 */
export type OutboxFailureKind = "permanent" | "retryable" | "unavailable";

/**
 * A classified delivery failure, thrown by runtimes (and by `createJetStreamRuntime`). Any other
 * rejection counts as `retryable`.
 *
 * @example
 * ```ts
 * import { OutboxPublishError } from "@outbox/nats";
 * const error = new OutboxPublishError("permanent", "payload exceeds the server's max_payload", {
 *   code: "max_payload",
 * });
 * console.log(error.kind, error.code); // "permanent" "max_payload"
 * ```
 */
export class OutboxPublishError extends Error {
  /** How the dispatcher treats the failure. */
  readonly kind: OutboxFailureKind;
  /** A short stable code (`no_stream`, `timeout`, `max_payload`, ...), safe for metrics. */
  readonly code: string;
  /**
   * What the failure affects: the connection, JetStream as a whole, one stream or one subject.
   * An `unavailable` failure without a scope pauses the whole dispatcher; one scoped to a stream
   * or a subject pauses only that scope.
   */
  readonly scope?: OutboxFailureScope;
  /** Creates the error; `options.code` defaults to the kind. */
  constructor(
    kind: OutboxFailureKind,
    message: string,
    options: ErrorOptions & { code?: string; scope?: OutboxFailureScope } = {},
  ) {
    super(message, options);
    this.name = "OutboxPublishError";
    this.kind = kind;
    this.code = options.code ?? kind;
    if (options.scope) this.scope = options.scope;
  }
}

/**
 * Turns anything thrown into a one-line message for `lastError` and logs.
 *
 * @example
 * ```ts
 * import { errorMessage } from "@outbox/nats";
 * console.log(errorMessage(new TypeError("boom"))); // "TypeError: boom"
 * ```
 */
export function errorMessage(error: unknown): string {
  // Never throws: a thrown value may be anything (a Proxy, an Error whose message getter throws,
  // a symbol name), and a failure's text must always be recordable.
  try {
    if (error instanceof Error) {
      const name = typeof error.name === "string" && error.name !== "Error"
        ? `${error.name}: `
        : "";
      const message = error.message;
      return `${name}${typeof message === "string" ? message : String(message)}`;
    }
    if (typeof error === "string") return error;
    const json = JSON.stringify(error);
    if (typeof json === "string") return json;
    return String(error);
  } catch {
    try {
      return String(error);
    } catch {
      return "(an error that cannot be turned into text)";
    }
  }
}

/**
 * The database's outbox or inbox table is missing or older than this library needs (an
 * unmigrated database, or one a previous version created). Thrown by the SQL stores in place of
 * the driver's "no such table" / "no such column" error; run `migrate()` (or
 * `outbox-nats migrate`) to fix it.
 *
 * @example
 * ```ts
 * import { OutboxSchemaError } from "@outbox/nats";
 * const error = new OutboxSchemaError("trellis_outbox", 1, 2);
 * console.log(error.table, error.foundVersion, error.requiredVersion);
 * console.log(error.message); // "... is at schema version 1; this library needs version 2 ..."
 * ```
 */
export class OutboxSchemaError extends Error {
  /** The table the failed statement used. */
  readonly table: string;
  /**
   * The schema version found: 0 when the table does not exist, `undefined` when it could not be
   * read (for example inside a Postgres transaction the failed statement aborted).
   */
  readonly foundVersion: number | undefined;
  /** The schema version this library needs. */
  readonly requiredVersion: number;
  /** Creates the error; `options.detail` (the driver's message) is appended in parentheses. */
  constructor(
    table: string,
    foundVersion: number | undefined,
    requiredVersion: number,
    options: ErrorOptions & { detail?: string } = {},
  ) {
    const found = foundVersion === 0
      ? `Table ${table} does not exist (schema version 0)`
      : foundVersion === undefined
      ? `Table ${table} has an older schema than this library's (version not readable)`
      : foundVersion < requiredVersion
      ? `Table ${table} is at schema version ${foundVersion}`
      : `Table ${table} records schema version ${foundVersion} but lacks what that version has (changed outside migrate()?)`;
    const detail = options.detail === undefined ? "" : ` (${options.detail})`;
    super(
      `${found}; this library needs version ${requiredVersion}. Run migrate() or ` +
        `\`outbox-nats migrate\` (with the same table names) first${detail}`,
      options,
    );
    this.name = "OutboxSchemaError";
    this.table = table;
    this.foundVersion = foundVersion;
    this.requiredVersion = requiredVersion;
  }
}
