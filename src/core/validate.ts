/**
 * Enqueue validation shared by every store: a record that could not be stored or published
 * faithfully is rejected with an {@linkcode OutboxValidationError} before anything is written.
 *
 * @module
 */

import { OutboxValidationError } from "./errors.ts";
import type { OutboxRecord, OutboxRecordKind } from "./types.ts";

/**
 * The record kinds an outbox accepts.
 *
 * @example
 * ```ts
 * import { outboxRecordKinds } from "@outbox/nats";
 * console.log(outboxRecordKinds.includes("job.submit")); // true
 * ```
 */
export const outboxRecordKinds: readonly OutboxRecordKind[] = Object.freeze([
  "event.publish",
  "job.create",
  "job.submit",
]);

/**
 * Longest accepted message id, in UTF-8 bytes (ids are primary keys and index entries).
 *
 * @example
 * ```ts
 * import { maxOutboxIdBytes } from "@outbox/nats";
 * console.log(maxOutboxIdBytes); // 2048
 * ```
 */
export const maxOutboxIdBytes = 2048;

/**
 * Longest accepted subject, in UTF-8 bytes.
 *
 * @example
 * ```ts
 * import { maxSubjectBytes } from "@outbox/nats";
 * console.log(maxSubjectBytes); // 1024
 * ```
 */
export const maxSubjectBytes = 1024;

// deno-lint-ignore no-control-regex
const controlOrSpace = /[\u0000-\u0020\u007f]/;
const headerName = /^[!-9;-~]+$/;

/**
 * Checks a record and returns a detached copy that is safe to store. Throws
 * {@linkcode OutboxValidationError} naming the offending field otherwise.
 *
 * Rules: `id` is a non-empty string of at most {@linkcode maxOutboxIdBytes} bytes without NUL, CR
 * or LF, and without leading or trailing whitespace (it is published as the `Nats-Msg-Id`
 * header, whose value NATS trims); `kind` is one of
 * {@linkcode outboxRecordKinds}; `name` and `payload` are strings without NUL; `subject` is a
 * literal NATS subject (non-empty tokens, no whitespace or control characters, no `*` or `>`
 * token); an `event.publish` payload is JSON text (the dispatcher parses it to publish the
 * event); `headers` is a plain object of string values without CR, LF or NUL, with names of
 * printable ASCII other than `:`; a `Nats-Msg-Id` header, if present, equals `id`. Every string
 * must be well-formed Unicode.
 *
 * @example
 * ```ts
 * import { validateOutboxRecord } from "@outbox/nats";
 * const record = validateOutboxRecord({
 *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
 * });
 * ```
 */
export function validateOutboxRecord(record: unknown): OutboxRecord {
  if (record === null || typeof record !== "object" || Array.isArray(record)) {
    throw new OutboxValidationError("record", "Outbox record must be an object");
  }
  const input = record as Record<string, unknown>;
  const id = requireText("id", input.id);
  if (id.length === 0) throw new OutboxValidationError("id", "Outbox id must not be empty");
  if (/[\r\n]/.test(id)) {
    throw new OutboxValidationError("id", "Outbox id must not contain CR or LF");
  }
  if (id.trim() !== id) {
    // NATS clients trim header values: ' a' would be published as Nats-Msg-Id 'a', and
    // JetStream would drop it as a duplicate of the message 'a' (or store it under the wrong id).
    throw new OutboxValidationError(
      "id",
      "Outbox id must not start or end with whitespace (it is published as the Nats-Msg-Id header, whose value NATS trims)",
    );
  }
  if (byteLength(id) > maxOutboxIdBytes) {
    throw new OutboxValidationError(
      "id",
      `Outbox id is longer than ${maxOutboxIdBytes} bytes (UTF-8)`,
    );
  }
  const kind = input.kind;
  if (typeof kind !== "string" || !outboxRecordKinds.includes(kind as OutboxRecordKind)) {
    throw new OutboxValidationError(
      "kind",
      `Unknown outbox record kind ${JSON.stringify(kind)}; expected one of ${
        outboxRecordKinds.join(", ")
      }`,
    );
  }
  const name = requireText("name", input.name);
  const subject = validateSubject(input.subject);
  const payload = requireText("payload", input.payload);
  if (kind === "event.publish") checkJson(payload);
  const headers = validateHeaders(input.headers, id);
  return { id, kind: kind as OutboxRecordKind, name, subject, payload, headers };
}

/**
 * Checks that `subject` is a literal NATS subject a message can be published to, and returns it.
 *
 * @example
 * ```ts
 * import { validateSubject } from "@outbox/nats";
 * validateSubject("orders.created"); // ok
 * // validateSubject("orders.*") throws OutboxValidationError
 * ```
 */
export function validateSubject(subject: unknown, field = "subject"): string {
  const text = requireText(field, subject);
  if (text.length === 0) throw new OutboxValidationError(field, "Subject must not be empty");
  if (controlOrSpace.test(text)) {
    throw new OutboxValidationError(
      field,
      `Subject ${JSON.stringify(text)} contains whitespace or a control character`,
    );
  }
  if (byteLength(text) > maxSubjectBytes) {
    throw new OutboxValidationError(field, `Subject is longer than ${maxSubjectBytes} bytes`);
  }
  for (const token of text.split(".")) {
    if (token.length === 0) {
      throw new OutboxValidationError(
        field,
        `Subject ${JSON.stringify(text)} has an empty token`,
      );
    }
    if (token === "*" || token === ">") {
      throw new OutboxValidationError(
        field,
        `Subject ${
          JSON.stringify(text)
        } has a wildcard token '${token}'; publish needs a literal subject`,
      );
    }
  }
  return text;
}

function checkJson(payload: string): void {
  try {
    JSON.parse(payload);
  } catch (error) {
    throw new OutboxValidationError(
      "payload",
      `An event.publish payload must be JSON text (for example JSON.stringify(value)): ${
        error instanceof Error ? error.message : String(error)
      }`,
      { cause: error },
    );
  }
}

/**
 * Default of `maxPayloadBytes` (SQL and memory stores): 1 MiB, NATS's default `max_payload`,
 * less 64 KiB left for the headers the dispatcher and telemetry add (`Nats-Msg-Id`, trace
 * context) and for the protocol's own framing.
 *
 * @example
 * ```ts
 * import { defaultMaxPayloadBytes } from "@outbox/nats";
 * console.log(defaultMaxPayloadBytes); // 983040
 * ```
 */
export const defaultMaxPayloadBytes: number = 1024 * 1024 - 64 * 1024;

/**
 * A record is larger than the store's `maxPayloadBytes`: NATS would refuse to publish it, so it
 * is refused at enqueue instead of going dead later. An {@linkcode OutboxValidationError} with
 * field `payload`.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, OutboxPayloadTooLargeError } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository({ maxPayloadBytes: 16 });
 * try {
 *   await outbox.enqueue({
 *     id: "m-1", kind: "event.publish", name: "x", subject: "a.b",
 *     payload: JSON.stringify("x".repeat(100)), headers: {},
 *   });
 * } catch (error) {
 *   if (error instanceof OutboxPayloadTooLargeError) console.log(error.bytes, error.limit);
 * }
 * ```
 */
export class OutboxPayloadTooLargeError extends OutboxValidationError {
  /** The id of the refused record. */
  readonly id: string;
  /** Its size: payload plus headers, in bytes as NATS counts them. */
  readonly bytes: number;
  /** The store's `maxPayloadBytes`. */
  readonly limit: number;
  /** Creates the error for record `id` of `bytes` bytes over `limit`. */
  constructor(id: string, bytes: number, limit: number) {
    super(
      "payload",
      `Outbox record '${id}' is ${bytes} bytes (payload and headers), over the store's maxPayloadBytes of ${limit}; NATS would refuse to publish it (raise maxPayloadBytes only if your server's max_payload is larger)`,
    );
    this.name = "OutboxPayloadTooLargeError";
    this.id = id;
    this.bytes = bytes;
    this.limit = limit;
  }
}

/**
 * Returns `maxPayloadBytes` (an integer >= 1) or the default; throws `OutboxValidationError`
 * for anything else.
 */
export function checkedMaxPayloadBytes(value: number | undefined): number {
  if (value === undefined) return defaultMaxPayloadBytes;
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new OutboxValidationError(
      "maxPayloadBytes",
      `maxPayloadBytes must be an integer >= 1, got ${value}`,
    );
  }
  return value;
}

/**
 * Throws {@linkcode OutboxPayloadTooLargeError} when the payload plus headers of a validated
 * `record` (as NATS counts them: `name: value` lines) exceed `limit` bytes.
 */
export function checkRecordSize(record: OutboxRecord, limit: number): void {
  // Cheap bound first: a UTF-16 unit is at most 3 UTF-8 bytes.
  let upper = record.payload.length * 3;
  for (const [name, value] of Object.entries(record.headers)) {
    upper += name.length + value.length * 3 + 4;
  }
  if (upper <= limit) return;
  let bytes = byteLength(record.payload);
  for (const [name, value] of Object.entries(record.headers)) {
    bytes += name.length + byteLength(value) + 4; // "name: value\r\n"
  }
  if (bytes > limit) throw new OutboxPayloadTooLargeError(record.id, bytes, limit);
}

function validateHeaders(headers: unknown, id: string): Record<string, string> {
  if (headers === undefined) return {};
  if (headers === null || typeof headers !== "object" || Array.isArray(headers)) {
    throw new OutboxValidationError("headers", "Outbox headers must be a plain object");
  }
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(headers)) {
    const field = `headers.${key}`;
    if (!headerName.test(key)) {
      throw new OutboxValidationError(
        field,
        `Header name ${
          JSON.stringify(key)
        } is not valid; use printable ASCII without spaces or ':'`,
      );
    }
    const text = requireText(field, value);
    if (/[\r\n]/.test(text)) {
      throw new OutboxValidationError(field, `Header ${key} must not contain CR or LF`);
    }
    if (key.toLowerCase() === "nats-msg-id" && text !== id) {
      throw new OutboxValidationError(
        field,
        `Header ${key} must equal the outbox id (it is the JetStream dedupe key)`,
      );
    }
    out[key] = text;
  }
  return out;
}

function requireText(field: string, value: unknown): string {
  if (typeof value !== "string") {
    throw new OutboxValidationError(
      field,
      `Outbox ${field} must be a string, got ${typeOf(value)}`,
    );
  }
  if (value.includes("\u0000")) {
    throw new OutboxValidationError(field, `Outbox ${field} must not contain NUL characters`);
  }
  if (!value.isWellFormed()) {
    throw new OutboxValidationError(
      field,
      `Outbox ${field} is not well-formed Unicode (lone surrogate)`,
    );
  }
  return value;
}

function typeOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

/** UTF-8 length of a well-formed string, without allocating. */
function byteLength(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit < 0x80) bytes += 1;
    else if (unit < 0x800) bytes += 2;
    else if (unit >= 0xd800 && unit <= 0xdbff) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}
