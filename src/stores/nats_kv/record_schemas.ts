/**
 * The typebox schemas of what the NATS KV stores keep in their entries, compiled on first use, and
 * the strict decoding of entries: anything that does not match (bad UTF-8, bad JSON, a missing
 * field, an invalid subject, a claimed record without lease) is reported as an
 * {@linkcode OutboxCorruptRecordError} instead of being trusted.
 *
 * Loaded on demand by the KV repositories (see `records.ts`): processes that use other stores
 * never load typebox.
 *
 * @module
 */

import Type from "typebox";
import { Compile } from "typebox/compile";
import Value from "typebox/value";
import { OutboxCorruptRecordError, OutboxValidationError } from "../../core/errors.ts";
import { validateOutboxRecord } from "../../core/validate.ts";
import {
  type InboxEntry,
  isoPattern,
  type KeyEntry,
  type Marker,
  type RecordDecoding,
  type StoredOutboxRecord,
} from "./records.ts";

const Iso = Type.String({ pattern: isoPattern });

/** Schema of the canonical record of an outbox message (`m.<token>`). */
export const StoredOutboxRecordSchema = Type.Object({
  v: Type.Literal(1),
  id: Type.String({ minLength: 1 }),
  kind: Type.Union([
    Type.Literal("event.publish"),
    Type.Literal("job.create"),
    Type.Literal("job.submit"),
  ]),
  name: Type.String(),
  subject: Type.String({ minLength: 1 }),
  payload: Type.String(),
  headers: Type.Record(Type.String(), Type.String()),
  state: Type.Union([
    Type.Literal("pending"),
    Type.Literal("claimed"),
    Type.Literal("dispatched"),
    Type.Literal("failed"),
    Type.Literal("dead"),
  ]),
  attempts: Type.Integer({ minimum: 0 }),
  createdAt: Iso,
  updatedAt: Iso,
  nextAttemptAt: Type.Optional(Iso),
  lastError: Type.Optional(Type.String()),
  outcome: Type.Optional(Type.Unknown()),
  /** Enqueue order (a stream sequence), written on the first claim; keeps FIFO across requeue. */
  seq: Type.Optional(Type.Integer({ minimum: 1 })),
  /** The fencing token of the latest claim, written by every claim, compared by every mark. */
  claimToken: Type.Optional(Type.String({ minLength: 1 })),
  /** The ordering key (validated with the rest of the record by `validateOutboxRecord`). */
  orderingKey: Type.Optional(Type.String({ minLength: 1 })),
  /** The PubAck sequence of the dispatched mark of a keyed message. */
  sequence: Type.Optional(Type.Integer({ minimum: 1 })),
  /** A dead head skipped by `unblockKey` (written before its key is handed over). */
  skipped: Type.Optional(Type.Literal(true)),
});

/** Schema of an active-index marker (`q.<token>`). */
export const MarkerSchema = Type.Object({
  v: Type.Literal(1),
  id: Type.String({ minLength: 1 }),
  /** Enqueue order; absent on the first marker of a message, whose own revision is its order. */
  seq: Type.Optional(Type.Integer({ minimum: 1 })),
  /** When the message is due (a failed message waiting for its retry). */
  due: Type.Optional(Iso),
  /** The record revision this marker describes. */
  rev: Type.Optional(Type.Integer({ minimum: 1 })),
  /** The message's ordering key. */
  key: Type.Optional(Type.String({ minLength: 1 })),
  /** The record as stored at revision `rev` (checked with the record schema when used). */
  r: Type.Optional(Type.Unknown()),
});

/** Schema of an ordering key's entry (`q._k.<token>`). */
export const KeyEntrySchema = Type.Object({
  v: Type.Literal(1),
  key: Type.String({ minLength: 1 }),
  /** The key's head: the only message of the key a claim may take. */
  head: Type.Optional(Type.String({ minLength: 1 })),
  /** The key's last stream sequence (the PubAck of its last dispatched message). */
  seq: Type.Optional(Type.Integer({ minimum: 1 })),
  /** The entry revision the hand-over that named the head read (see `KeyEntry.at`). */
  at: Type.Optional(Type.Integer({ minimum: 1 })),
  /** When the key's last message was settled, on an entry without a head (see `KeyEntry.t`). */
  t: Type.Optional(Type.String()),
});

/** Schema of an inbox entry (`i.<consumer token>.<id token>`). */
export const InboxEntrySchema = Type.Object({
  v: Type.Literal(1),
  id: Type.String({ minLength: 1 }),
  consumer: Type.String(),
  receivedAt: Iso,
});

/**
 * Compiled checkers, built on first use: `Value.Check` interprets the schema on every call
 * (~20 µs per record in the dispatch profile, on every claim), a compiled one is ~100x faster.
 * `Compile` falls back to the interpreter where code generation is not allowed.
 */
const checkers = {
  record: lazy(() => Compile(StoredOutboxRecordSchema)),
  marker: lazy(() => Compile(MarkerSchema)),
  inbox: lazy(() => Compile(InboxEntrySchema)),
  key: lazy(() => Compile(KeyEntrySchema)),
};

function lazy<T>(build: () => T): () => T {
  let built: T | undefined;
  return () => built ??= build();
}

const decoder = new TextDecoder("utf-8", { fatal: true });

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
  return checkRecord(raw, expectedId);
}

/**
 * Validates a record already parsed from JSON (a marker's copy, see `Marker.r`) as
 * {@linkcode decodeRecord} does.
 */
export function checkRecord(raw: unknown, expectedId?: string): RecordDecoding {
  const rawId = typeof (raw as { id?: unknown })?.id === "string"
    ? (raw as { id: string }).id
    : undefined;
  const id = expectedId ?? rawId;
  if (!checkers.record().Check(raw)) {
    const first = [...Value.Errors(StoredOutboxRecordSchema, raw)][0] as
      | { instancePath?: string; message?: string }
      | undefined;
    const where = first?.instancePath || "/";
    return corrupt(id, `${where} ${first?.message ?? "does not match the record schema"}`, raw);
  }
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

/** Decodes a marker; `undefined` when it does not match {@linkcode MarkerSchema}. */
export function decodeMarker(value: Uint8Array): Marker | undefined {
  try {
    const raw = JSON.parse(decoder.decode(value));
    return checkers.marker().Check(raw) ? raw as Marker : undefined;
  } catch {
    return undefined;
  }
}

/** Decodes an inbox entry; `undefined` when it does not match {@linkcode InboxEntrySchema}. */
export function decodeInboxEntry(value: Uint8Array): InboxEntry | undefined {
  try {
    const raw = JSON.parse(decoder.decode(value));
    return checkers.inbox().Check(raw) ? raw as InboxEntry : undefined;
  } catch {
    return undefined;
  }
}

/** Decodes an ordering key's entry; `undefined` when it does not match {@linkcode KeyEntrySchema}. */
export function decodeKeyEntry(value: Uint8Array): KeyEntry | undefined {
  try {
    const raw = JSON.parse(decoder.decode(value));
    return checkers.key().Check(raw) ? raw as KeyEntry : undefined;
  } catch {
    return undefined;
  }
}
