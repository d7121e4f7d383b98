/**
 * Rows to messages, tolerant of what real drivers return: `Date` or text timestamps, numbers,
 * bigints or numeric text, JSON as text or as already-parsed values. Anything else is a corrupt
 * row, reported as {@linkcode OutboxCorruptRecordError}.
 *
 * @module
 */

import { OutboxCorruptRecordError } from "../../core/errors.ts";
import { toIsoTimestamp } from "../../core/time.ts";
import type { JsonValue, OutboxMessage, OutboxRecordKind, OutboxState } from "../../core/types.ts";
import { outboxRecordKinds } from "../../core/validate.ts";
import type { SqlRow } from "./executors.ts";

const states: readonly OutboxState[] = ["pending", "claimed", "dispatched", "failed", "dead"];

/**
 * What a claim wrote into every row it took: a claimed row's `state`, `updated_at`,
 * `next_attempt_at` and `claim_token` are these, so SQLite's claim does not return them.
 */
export interface ClaimWrite {
  /** `updated_at`: the claim's `now` (ISO-8601). */
  readonly updatedAt: string;
  /** `next_attempt_at`: the lease expiry (ISO-8601). */
  readonly nextAttemptAt: string;
  /** `claim_token`. */
  readonly claimToken: string;
}

/**
 * Decodes one outbox row; throws `OutboxCorruptRecordError` naming what is wrong. With `claim`,
 * the row is one a claim returned without the columns it wrote (see {@linkcode ClaimWrite}).
 */
export function decodeOutboxRow(row: SqlRow, claim?: ClaimWrite): OutboxMessage {
  const id = row.id;
  if (typeof id !== "string") throw corrupt(undefined, `id is ${describe(id)}`);
  const fail = (reason: string): never => {
    throw corrupt(id, reason);
  };
  const kind = text(row.kind) ?? fail(`kind is ${describe(row.kind)}`);
  if (!outboxRecordKinds.includes(kind as OutboxRecordKind)) {
    fail(`unknown kind ${JSON.stringify(kind)}`);
  }
  const state = claim ? "claimed" : text(row.state) ?? fail(`state is ${describe(row.state)}`);
  if (!claim && !states.includes(state as OutboxState)) {
    fail(`unknown state ${JSON.stringify(state)}`);
  }
  const message: OutboxMessage = {
    id,
    kind: kind as OutboxRecordKind,
    name: text(row.name) ?? fail(`name is ${describe(row.name)}`),
    subject: text(row.subject) ?? fail(`subject is ${describe(row.subject)}`),
    payload: text(row.payload) ?? fail(`payload is ${describe(row.payload)}`),
    headers: decodeHeaders(row.headers, fail),
    state: state as OutboxState,
    attempts: integer(row.attempts) ?? fail(`attempts is ${describe(row.attempts)}`),
    createdAt: toIsoTimestamp(row.created_at) ?? fail(`created_at is ${describe(row.created_at)}`),
    updatedAt: claim?.updatedAt ??
      toIsoTimestamp(row.updated_at) ?? fail(`updated_at is ${describe(row.updated_at)}`),
  };
  if (claim) {
    message.nextAttemptAt = claim.nextAttemptAt;
  } else if (row.next_attempt_at !== null && row.next_attempt_at !== undefined) {
    message.nextAttemptAt = toIsoTimestamp(row.next_attempt_at) ??
      fail(`next_attempt_at is ${describe(row.next_attempt_at)}`);
  }
  if (row.last_error !== null && row.last_error !== undefined) {
    message.lastError = text(row.last_error) ?? fail(`last_error is ${describe(row.last_error)}`);
  }
  if (row.ordering_key !== null && row.ordering_key !== undefined) {
    message.orderingKey = text(row.ordering_key) ??
      fail(`ordering_key is ${describe(row.ordering_key)}`);
  }
  if (claim) message.claimToken = claim.claimToken;
  else if (typeof row.claim_token === "string") message.claimToken = row.claim_token;
  if (row.outcome !== null && row.outcome !== undefined) {
    const outcome = decodeJson(row.outcome, "outcome", fail);
    message.outcome = typeof outcome === "string" ? unwrapStructuredJsonText(outcome) : outcome;
  }
  return message;
}

/**
 * Decodes what can be decoded of a row that {@linkcode decodeOutboxRow} rejects, for listings
 * of dead messages: undecodable fields get neutral values (empty text, no headers).
 */
export function decodeOutboxRowLoosely(row: SqlRow): OutboxMessage {
  try {
    return decodeOutboxRow(row);
  } catch {
    // fall through to the field-by-field best effort
  }
  const attempt = <T>(f: () => T, fallback: T): T => {
    try {
      return f() ?? fallback;
    } catch {
      return fallback;
    }
  };
  const never = (): never => {
    throw new Error("undecodable");
  };
  const epoch = new Date(0).toISOString();
  const message: OutboxMessage = {
    id: typeof row.id === "string" ? row.id : String(row.id),
    kind: (text(row.kind) ?? "") as OutboxRecordKind,
    name: text(row.name) ?? "",
    subject: text(row.subject) ?? "",
    payload: text(row.payload) ?? "",
    headers: attempt(() => decodeHeaders(row.headers, never), {}),
    state: (text(row.state) ?? "dead") as OutboxState,
    attempts: integer(row.attempts) ?? 0,
    createdAt: toIsoTimestamp(row.created_at) ?? epoch,
    updatedAt: toIsoTimestamp(row.updated_at) ?? epoch,
  };
  const next = toIsoTimestamp(row.next_attempt_at);
  if (next !== undefined) message.nextAttemptAt = next;
  const lastError = text(row.last_error);
  if (lastError !== undefined) message.lastError = lastError;
  const orderingKey = text(row.ordering_key);
  if (orderingKey !== undefined) message.orderingKey = orderingKey;
  if (typeof row.claim_token === "string") message.claimToken = row.claim_token;
  if (row.outcome !== null && row.outcome !== undefined) {
    const outcome = attempt(() => decodeJson(row.outcome, "outcome", never), undefined);
    if (outcome !== undefined) message.outcome = outcome;
  }
  return message;
}

/** Reads a count or integer column (number, bigint or numeric text, as drivers return them). */
export function integer(value: unknown): number | undefined {
  if (typeof value === "number") return Number.isSafeInteger(value) ? value : undefined;
  if (typeof value === "bigint") {
    return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value)
      : undefined;
  }
  if (typeof value === "string" && /^-?\d+$/.test(value)) {
    const number = Number(value);
    return Number.isSafeInteger(number) ? number : undefined;
  }
  return undefined;
}

function text(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

function decodeHeaders(value: unknown, fail: (reason: string) => never): Record<string, string> {
  if (value === "{}") return {}; // most messages: no JSON.parse for them
  const parsed = unwrapJsonText(decodeJson(value, "headers", fail), fail);
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    return fail("headers is not a JSON object");
  }
  const headers: Record<string, string> = {};
  for (const [key, entry] of Object.entries(parsed)) {
    if (typeof entry !== "string") return fail(`header ${JSON.stringify(key)} is not a string`);
    headers[key] = entry;
  }
  return headers;
}

/**
 * The reference, run on postgres.js, stored JSON text INTO jsonb as a string scalar (the driver
 * JSON-encodes parameters typed json/jsonb, and the reference passed text). Such a headers value
 * is a string holding the JSON object: decode it once more.
 */
function unwrapJsonText(value: JsonValue, fail: (reason: string) => never): JsonValue {
  if (typeof value !== "string") return value;
  try {
    return JSON.parse(value) as JsonValue;
  } catch {
    return fail("headers is not a JSON object");
  }
}

/** An outcome string that holds a JSON object or array is the reference's double encoding. */
function unwrapStructuredJsonText(value: string): JsonValue {
  const first = value.trimStart()[0];
  if (first !== "{" && first !== "[") return value;
  try {
    return JSON.parse(value) as JsonValue;
  } catch {
    return value;
  }
}

function decodeJson(
  value: unknown,
  field: string,
  fail: (reason: string) => never,
): JsonValue {
  if (typeof value === "string") {
    try {
      return JSON.parse(value) as JsonValue;
    } catch {
      return fail(`${field} is not valid JSON`);
    }
  }
  if (value instanceof Uint8Array) {
    return decodeJson(new TextDecoder().decode(value), field, fail);
  }
  if (value !== undefined && typeof value !== "function" && typeof value !== "symbol") {
    // A driver already parsed jsonb; copy it so callers never share the driver's objects.
    return structuredClone(value) as JsonValue;
  }
  return fail(`${field} is ${describe(value)}`);
}

function corrupt(id: string | undefined, reason: string): OutboxCorruptRecordError {
  return new OutboxCorruptRecordError(id, reason);
}

function describe(value: unknown): string {
  if (value === null) return "NULL";
  if (value instanceof Uint8Array) return "a blob";
  return typeof value === "string" ? `text ${JSON.stringify(value.slice(0, 40))}` : typeof value;
}
