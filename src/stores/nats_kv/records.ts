/**
 * What the NATS KV stores keep in their entries (types, encoding, messages), and the on-demand
 * loading of their typebox schemas (`record_schemas.ts`), which decode and validate entries.
 *
 * @module
 */

import type { OutboxCorruptRecordError } from "../../core/errors.ts";
import { encodeText } from "../../core/slab_encoder.ts";
import type { JsonValue, OutboxMessage, OutboxRecordKind, OutboxState } from "../../core/types.ts";

/** `Date#toISOString()` form. */
export const isoPattern = "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}\\.\\d{3}Z$";

/** The decoders of `record_schemas.ts` (typebox, compiled on first use). */
export type RecordCodec = typeof import("./record_schemas.ts");

let codec: Promise<RecordCodec> | undefined;
let loaded: RecordCodec | undefined;

/**
 * Loads the typebox schemas of the KV entries once per process, on first use by a KV repository,
 * so that importing this package for another store does not load typebox.
 */
export function recordCodec(): Promise<RecordCodec> {
  return codec ??= import("./record_schemas.ts").then((module) => loaded = module);
}

/** The codec once {@linkcode recordCodec} has loaded it (no promise to await on hot paths). */
export function loadedRecordCodec(): RecordCodec | undefined {
  return loaded;
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
  /** The fencing token of the latest claim (see `OutboxClaim`). */
  claimToken?: string;
  /** The message's ordering key (see `OutboxRecord.orderingKey`). */
  orderingKey?: string;
  /**
   * The PubAck's stream sequence of the dispatched mark that settled a keyed message, so a
   * hand-over finished later (a retried mark, a claim healing it) records the same key sequence.
   */
  sequence?: number;
  /** Set on a dead head by `unblockKey(key, { action: "skip" })` before it hands the key over. */
  skipped?: true;
}

/** An active-index marker. */
export interface Marker {
  v: 1;
  id: string;
  seq?: number;
  due?: string;
  rev?: number;
  /** The message's ordering key, so the index knows the key's messages without reading them. */
  key?: string;
  /**
   * The record exactly as stored at revision `rev` (written only with `rev`, by a writer that
   * wrote or read that revision, and only by a repository with `markerCopies` on), so a claim can
   * compare-and-set it without reading it first. A claim whose compare-and-set fails reads the
   * record as usual.
   */
  r?: StoredOutboxRecord;
}

/**
 * The entry of one ordering key (`q._k.<token>`): its head, the only message of the key a claim
 * may take (absent while the key has no unsettled message), and the key's last stream sequence.
 */
export interface KeyEntry {
  v: 1;
  key: string;
  head?: string;
  seq?: number;
  /**
   * The key entry revision the hand-over that named `head` read: every message settled before
   * that hand-over has a record revision below it (a settled message whose marker outlived its
   * settlement may be picked as next; its record then tells it apart).
   */
  at?: number;
  /**
   * When the key's last message was settled (the dispatched mark's or the skip's `now`), written
   * by a hand-over that leaves the key without a head: `prune` retires the entry once this is
   * before its `dispatchedBefore`. Entries written without it fall back to their write time.
   */
  t?: string;
}

/** An inbox entry. */
export interface InboxEntry {
  v: 1;
  id: string;
  consumer: string;
  receivedAt: string;
}

/** The marker of an active record (its key, its enqueue order once known, `extra` fields). */
export function markerOf(record: StoredOutboxRecord, extra: Partial<Marker> = {}): Marker {
  const marker: Marker = { v: 1, id: record.id, ...extra };
  if (record.seq !== undefined) marker.seq = record.seq;
  if (record.orderingKey !== undefined) marker.key = record.orderingKey;
  return marker;
}

/**
 * Serialises a record (or marker, or inbox entry) for a KV value: a view of a shared buffer (see
 * `slab_encoder.ts`), for a write; not to be kept.
 */
export function encodeJson(
  value: StoredOutboxRecord | Marker | InboxEntry | KeyEntry,
): Uint8Array {
  return encodeText(JSON.stringify(value));
}

/** A decoded record, or why it could not be decoded. */
export type RecordDecoding =
  | { ok: true; record: StoredOutboxRecord }
  | { ok: false; error: OutboxCorruptRecordError; raw: unknown };

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
  if (record.claimToken !== undefined) message.claimToken = record.claimToken;
  if (record.orderingKey !== undefined) message.orderingKey = record.orderingKey;
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
  const iso = new RegExp(isoPattern);
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
