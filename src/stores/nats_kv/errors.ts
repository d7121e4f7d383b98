/**
 * JetStream API errors, recognised by their numeric error codes (never by message text), and the
 * KV store's own error.
 *
 * @module
 */

/** JetStream API error code: the subject's last sequence was not the expected one (CAS lost). */
export const wrongLastSequenceCode = 10071;
/** JetStream API error code: wrong last sequence, reported as unknown by newer servers. */
export const wrongLastSequenceUnknownCode = 10164;
/**
 * JetStream API error codes of a stream message delete that found no such message ("no message
 * found"; "sequence N not found" when another delete of it runs at the same time).
 */
export const messageNotFoundCodes: readonly number[] = [10057, 10043];

/**
 * The JetStream API error code (`err_code`) of `error` or of an error in its `cause` chain, or
 * `undefined`. Works on `JetStreamApiError` from `@nats-io/jetstream` without importing it (the
 * caller may use another copy of the package).
 */
export function jetStreamErrorCode(error: unknown): number | undefined {
  for (let current = error, depth = 0; current && depth < 5; depth++) {
    if (typeof current !== "object") return undefined;
    const candidate = current as { code?: unknown; apiError?: unknown; name?: unknown };
    if (
      typeof candidate.code === "number" &&
      (typeof candidate.apiError === "function" || candidate.name === "JetStreamApiError")
    ) {
      return candidate.code;
    }
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** JetStream API error code: the message is larger than the stream's `max_msg_size`. */
export const messageTooLargeCode = 10054;

/**
 * Whether `error` says a write was too large: over the stream's `max_msg_size` (a bucket's
 * `maxValueSize`, by its error code), or refused by the client as over the server's
 * `max_payload` (nats.js has one class for every bad argument: only this sub-case is told by
 * its text, as the runtime's classification does).
 */
export function isTooLargeWrite(error: unknown): boolean {
  if (jetStreamErrorCode(error) === messageTooLargeCode) return true;
  for (let current = error, depth = 0; current && depth < 5; depth++) {
    if (typeof current !== "object") return false;
    const { name, message } = current as { name?: unknown; message?: unknown };
    if (
      name === "InvalidArgumentError" && typeof message === "string" &&
      message.includes("max_payload")
    ) return true;
    current = (current as { cause?: unknown }).cause;
  }
  return false;
}

/** Whether `error` says a write's expected revision did not match (another writer won). */
export function isWrongLastSequence(error: unknown): boolean {
  const code = jetStreamErrorCode(error);
  return code === wrongLastSequenceCode || code === wrongLastSequenceUnknownCode;
}

/**
 * The NATS KV outbox could not bring its in-process index of active messages up to date (its
 * watch on the bucket did not deliver its own barrier write in time, or stopped). The claim that
 * raised it changed nothing it did not return; retry later.
 *
 * @example
 * ```ts
 * import { NatsKvIndexError } from "@outbox/nats";
 * const error = new NatsKvIndexError("watch stopped");
 * console.log(error.name); // "NatsKvIndexError"
 * ```
 */
export class NatsKvIndexError extends Error {
  /** Creates the error with a message that says what failed. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "NatsKvIndexError";
  }
}

/**
 * The entry of an ordering key kept changing under a write of the NATS KV outbox (other
 * processes enqueuing or handing the key over at the same time) for too many rounds. Nothing
 * was lost: the message is stored and indexed; the write that joins it to its key is retried by
 * the next `enqueue` of the same id, a `requeue` of it, or `repair()`.
 *
 * @example
 * ```ts
 * import { NatsKvOrderingKeyError } from "@outbox/nats";
 * const error = new NatsKvOrderingKeyError("order-42", 64);
 * console.log(error.key); // "order-42"
 * ```
 */
export class NatsKvOrderingKeyError extends Error {
  /** The ordering key. */
  readonly key: string;
  /** Creates the error for `key` after `rounds` lost compare-and-set rounds. */
  constructor(key: string, rounds: number, options?: ErrorOptions) {
    super(
      `The entry of ordering key '${key}' changed under ${rounds} writes in a row; retry`,
      options,
    );
    this.name = "NatsKvOrderingKeyError";
    this.key = key;
  }
}
