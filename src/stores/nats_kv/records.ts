/**
 * What the NATS KV stores keep in their entries, and the strict decoding of
 * entries: anything that does not match (bad UTF-8, bad JSON, a missing field, an invalid
 * subject, a claimed record without lease) is reported as an {@linkcode OutboxCorruptRecordError}
 * instead of being trusted.
 *
 * @module
 */

import { OutboxCorruptRecordError, OutboxValidationError } from "../../core/errors.ts";
import type { JsonValue, OutboxMessage, OutboxRecordKind, OutboxState } from "../../core/types.ts";
import { outboxRecordKinds, validateOutboxRecord } from "../../core/validate.ts";

const isoPattern = "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}\\.\\d{3}Z$";
const iso = new RegExp(isoPattern);
const kinds: readonly string[] = outboxRecordKinds;
const states: readonly string[] = ["pending", "claimed", "dispatched", "failed", "dead"];

// The shapes below are checked by hand (they are small and fixed). A schema library cost ~20 µs
// per record interpreted, and ~13 MB of resident memory in every process that imports this
// package, KV stores used or not.

/** A plain JSON object (not null, not an array). */
function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function isText(value: unknown, minLength = 0): value is string {
  return typeof value === "string" && value.length >= minLength;
}

function isInteger(value: unknown, minimum: number): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= minimum;
}

function isIso(value: unknown): value is string {
  return typeof value === "string" && iso.test(value);
}

/**
 * Why `raw` is not a stored record (`"<path> <problem>"`), or `undefined` when it is one. The
 * shape: `v` 1; `id` and `subject` non-empty strings; `kind` and `state` known values; `name`
 * and `payload` strings; `headers` an object of strings; `attempts` an integer >= 0;
 * `createdAt` / `updatedAt` (and `nextAttemptAt` when present) ISO timestamps as
 * `Date#toISOString()` writes them; `lastError` a string and `seq` an integer >= 1 when present;
 * `outcome` anything. Other properties are allowed.
 */
export function storedRecordProblem(raw: unknown): string | undefined {
  if (!isObject(raw)) return "/ must be an object";
  if (raw.v !== 1) return "/v must be 1";
  if (!isText(raw.id, 1)) return "/id must be a non-empty string";
  if (typeof raw.kind !== "string" || !kinds.includes(raw.kind)) {
    return `/kind must be one of ${kinds.join(", ")}`;
  }
  if (!isText(raw.name)) return "/name must be a string";
  if (!isText(raw.subject, 1)) return "/subject must be a non-empty string";
  if (!isText(raw.payload)) return "/payload must be a string";
  if (!isObject(raw.headers)) return "/headers must be an object";
  for (const [name, value] of Object.entries(raw.headers)) {
    if (typeof value !== "string") return `/headers/${name} must be a string`;
  }
  if (typeof raw.state !== "string" || !states.includes(raw.state)) {
    return `/state must be one of ${states.join(", ")}`;
  }
  if (!isInteger(raw.attempts, 0)) return "/attempts must be an integer >= 0";
  if (!isIso(raw.createdAt)) return "/createdAt must be an ISO timestamp";
  if (!isIso(raw.updatedAt)) return "/updatedAt must be an ISO timestamp";
  if (raw.nextAttemptAt !== undefined && !isIso(raw.nextAttemptAt)) {
    return "/nextAttemptAt must be an ISO timestamp";
  }
  if (raw.lastError !== undefined && !isText(raw.lastError)) return "/lastError must be a string";
  if (raw.seq !== undefined && !isInteger(raw.seq, 1)) return "/seq must be an integer >= 1";
  return undefined;
}

/** The canonical record of an outbox message. */
export interface StoredOutboxRecord {
  v: 1;
  id: string;
  kind: OutboxRecordKind;
  name: string;
  subject: string;
  payload: string;
  headers: Record<string, string>;
  state: OutboxState;
  attempts: number;
  createdAt: string;
  updatedAt: string;
  nextAttemptAt?: string;
  lastError?: string;
  outcome?: JsonValue;
  seq?: number;
}

/** An active-index marker (`q.<token>`). */
export interface Marker {
  v: 1;
  id: string;
  /** Enqueue order; absent on the first marker of a message, whose own revision is its order. */
  seq?: number;
  /** When the message is due (a failed message waiting for its retry). */
  due?: string;
  /** The record revision this marker describes. */
  rev?: number;
}

function isMarker(raw: unknown): raw is Marker {
  return isObject(raw) && raw.v === 1 && isText(raw.id, 1) &&
    (raw.seq === undefined || isInteger(raw.seq, 1)) &&
    (raw.due === undefined || isIso(raw.due)) &&
    (raw.rev === undefined || isInteger(raw.rev, 1));
}

/** An inbox entry (`i.<consumer token>.<id token>`). */
export interface InboxEntry {
  v: 1;
  id: string;
  consumer: string;
  receivedAt: string;
}

function isInboxEntry(raw: unknown): raw is InboxEntry {
  return isObject(raw) && raw.v === 1 && isText(raw.id, 1) && isText(raw.consumer) &&
    isIso(raw.receivedAt);
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Serialises a record (or marker, or inbox entry) for a KV value. */
export function encodeJson(value: StoredOutboxRecord | Marker | InboxEntry): Uint8Array {
  return encoder.encode(JSON.stringify(value));
}

/** A decoded record, or why it could not be decoded. */
export type RecordDecoding =
  | { ok: true; record: StoredOutboxRecord }
  | { ok: false; error: OutboxCorruptRecordError; raw: unknown };

/**
 * Decodes and validates a stored record. `expectedId`, when known (from the caller, a marker or
 * the key), must equal the stored id.
 */
export function decodeRecord(value: Uint8Array, expectedId?: string): RecordDecoding {
  let raw: unknown;
  try {
    raw = JSON.parse(decoder.decode(value));
  } catch (error) {
    return corrupt(expectedId, "the entry is not UTF-8 JSON", undefined, error);
  }
  const rawId = typeof (raw as { id?: unknown })?.id === "string"
    ? (raw as { id: string }).id
    : undefined;
  const id = expectedId ?? rawId;
  const problem = storedRecordProblem(raw);
  if (problem !== undefined) return corrupt(id, problem, raw);
  const record = raw as StoredOutboxRecord;
  if (expectedId !== undefined && record.id !== expectedId) {
    return corrupt(id, `stored id ${JSON.stringify(record.id)} does not match its key`, raw);
  }
  if ((record.state === "claimed" || record.state === "failed") && !record.nextAttemptAt) {
    return corrupt(id, `a ${record.state} record has no nextAttemptAt`, raw);
  }
  try {
    validateOutboxRecord(record);
  } catch (error) {
    if (!(error instanceof OutboxValidationError)) throw error;
    return corrupt(id, `${error.field}: ${error.message}`, raw, error);
  }
  return { ok: true, record };
}

function corrupt(
  id: string | undefined,
  reason: string,
  raw: unknown,
  cause?: unknown,
): RecordDecoding {
  return {
    ok: false,
    error: new OutboxCorruptRecordError(id, reason, cause === undefined ? undefined : { cause }),
    raw,
  };
}

/** The public message of a stored record (a detached copy). */
export function toMessage(record: StoredOutboxRecord): OutboxMessage {
  const message: OutboxMessage = {
    id: record.id,
    kind: record.kind,
    name: record.name,
    subject: record.subject,
    payload: record.payload,
    headers: { ...record.headers },
    state: record.state,
    attempts: record.attempts,
    createdAt: record.createdAt,
    updatedAt: record.updatedAt,
  };
  if (record.nextAttemptAt !== undefined) message.nextAttemptAt = record.nextAttemptAt;
  if (record.lastError !== undefined) message.lastError = record.lastError;
  if (record.outcome !== undefined) message.outcome = structuredClone(record.outcome);
  return message;
}

/**
 * A best-effort `dead` message for an entry that cannot be decoded, so listings never throw:
 * fields that can be read are kept, the rest are empty; `lastError` says why it is corrupt.
 */
export function corruptMessage(
  raw: unknown,
  id: string,
  entryTime: string,
  error: OutboxCorruptRecordError,
): OutboxMessage {
  const source = raw !== null && typeof raw === "object" && !Array.isArray(raw)
    ? raw as Record<string, unknown>
    : {};
  const text = (key: string): string => typeof source[key] === "string" ? source[key] : "";
  const kind = ["event.publish", "job.create", "job.submit"].includes(text("kind"))
    ? text("kind") as OutboxRecordKind
    : "event.publish";
  const createdAt = iso.test(text("createdAt")) ? text("createdAt") : entryTime;
  const headers: Record<string, string> = {};
  if (source.headers !== null && typeof source.headers === "object") {
    for (const [name, value] of Object.entries(source.headers)) {
      if (typeof value === "string") headers[name] = value;
    }
  }
  return {
    id,
    kind,
    name: text("name"),
    subject: text("subject"),
    payload: text("payload"),
    headers,
    state: "dead",
    attempts: Number.isSafeInteger(source.attempts) ? source.attempts as number : 0,
    createdAt,
    updatedAt: entryTime,
    lastError: error.message,
  };
}

/** Decodes a marker; `undefined` when it is not one. */
export function decodeMarker(value: Uint8Array): Marker | undefined {
  try {
    const raw = JSON.parse(decoder.decode(value));
    return isMarker(raw) ? raw : undefined;
  } catch {
    return undefined;
  }
}

/** Decodes an inbox entry; `undefined` when it is not one. */
export function decodeInboxEntry(value: Uint8Array): InboxEntry | undefined {
  try {
    const raw = JSON.parse(decoder.decode(value));
    return isInboxEntry(raw) ? raw : undefined;
  } catch {
    return undefined;
  }
}
