/**
 * The outbox model: records, messages, states, claims, and the interfaces every store and
 * runtime implements. This file has no runtime dependencies.
 *
 * @module
 */

/**
 * What an outbox row asks the dispatcher to do.
 *
 * - `event.publish`: publish `payload` to `subject` on JetStream.
 * - `job.create` / `job.submit`: hand the message to the runtime's `dispatchJobSubmission`.
 *
 * @example
 * ```ts
 * import type { OutboxRecordKind } from "@outbox/nats";
 * const kind: OutboxRecordKind = "event.publish";
 * ```
 */
export type OutboxRecordKind = "event.publish" | "job.create" | "job.submit";

/**
 * Lifecycle state of an outbox message.
 *
 * `pending -> claimed -> dispatched` is the happy path. A failed attempt moves a claimed message
 * to `failed` (due again at `nextAttemptAt`); a message whose attempts are exhausted or that can
 * never be delivered moves to `dead` until an operator requeues it.
 *
 * @example
 * ```ts
 * import type { OutboxState } from "@outbox/nats";
 * const terminal: OutboxState[] = ["dispatched", "dead"];
 * ```
 */
export type OutboxState = "pending" | "claimed" | "dispatched" | "failed" | "dead";

/**
 * Any value that survives `JSON.stringify` / `JSON.parse` unchanged.
 *
 * @example
 * ```ts
 * import type { JsonValue } from "@outbox/nats";
 * const outcome: JsonValue = { kind: "accepted", jobId: "j-1" };
 * ```
 */
export type JsonValue =
  | string
  | number
  | boolean
  | null
  | JsonValue[]
  | { [key: string]: JsonValue };

/**
 * What a caller enqueues: the immutable content of an outbox message.
 *
 * @example
 * ```ts
 * import type { OutboxRecord } from "@outbox/nats";
 * const record: OutboxRecord = {
 *   id: "order-42-created",
 *   kind: "event.publish",
 *   name: "order.created",
 *   subject: "orders.created",
 *   payload: JSON.stringify({ orderId: 42 }),
 *   headers: {},
 * };
 * ```
 */
export interface OutboxRecord {
  /** Unique message id; also published as `Nats-Msg-Id`, so JetStream drops re-publishes. */
  id: string;
  /** What the dispatcher does with the message. */
  kind: OutboxRecordKind;
  /** Logical name (the event or job name); used in errors and telemetry. */
  name: string;
  /** NATS subject to publish to (a literal subject: no `*` or `>` tokens). */
  subject: string;
  /** Encoded payload, normally JSON text. */
  payload: string;
  /** NATS headers published with the message. */
  headers: Record<string, string>;
  /**
   * Messages with the same ordering key reach the broker in enqueue order, one at a time,
   * whichever dispatcher (in whichever process) relays them: a message is never published while
   * an earlier message of its key is unsettled (pending, claimed or failed), and a key whose
   * oldest message went `dead` is blocked (its later messages wait) until an operator unblocks
   * it ({@linkcode OutboxAdmin.unblockKey}). Messages without a key are independent. A non-empty
   * string of at most 256 characters, checked like ids (see the README, "Ordering keys").
   */
  orderingKey?: string;
}

/**
 * Options for {@linkcode OutboxRepository.enqueue} and `enqueueMany`.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * const record = {
 *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}",
 * } as const;
 * await outbox.enqueue({ ...record, headers: { b3: "80f198ee56343ba8-e457b5a2e4d86bd1-1" } });
 * // A retry from another trace is the same message: b3 is request context, not content.
 * await outbox.enqueue({ ...record, headers: { b3: "a3ce929d0e0e4736-00f067aa0ba902b7-1" } }, {
 *   contextHeaders: ["b3"],
 * });
 * ```
 */
export interface OutboxEnqueueOptions {
  /**
   * Names of headers that describe the request that enqueued the message rather than the
   * message (the fields a trace propagator writes: `b3`, `uber-trace-id`, `baggage`...). They
   * are stored and published, but not compared when the id already exists, so an idempotent
   * re-enqueue from another trace returns the stored message instead of throwing
   * `OutboxDuplicateIdentityError`. Case-insensitive; `traceparent` and `tracestate` always
   * count. `OutboxTelemetry#instrumentOutbox` passes the fields of the registered
   * OpenTelemetry propagator.
   *
   * @default {["traceparent", "tracestate"]}
   */
  contextHeaders?: Iterable<string>;
}

/**
 * A stored outbox message: the record plus its delivery state. Timestamps are ISO-8601 strings
 * (`Date#toISOString()` form) whatever the store or driver returned.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, type OutboxMessage } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * const message: OutboxMessage = await outbox.enqueue({
 *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
 * });
 * console.log(message.state, message.createdAt); // "pending", an ISO string
 * ```
 */
export interface OutboxMessage extends OutboxRecord {
  /** Current lifecycle state. */
  state: OutboxState;
  /** How many times the message has been claimed since it was enqueued or last requeued. */
  attempts: number;
  /** When the message was enqueued. */
  createdAt: string;
  /** When the message last changed state. */
  updatedAt: string;
  /**
   * For `claimed`: when the lease expires. For `failed`: when the next attempt is due.
   * Absent for `pending`, `dispatched` and `dead`.
   */
  nextAttemptAt?: string;
  /** The last failure, for `failed` and `dead` messages. */
  lastError?: string;
  /** The job outcome stored by `markDispatched` for job kinds. */
  outcome?: JsonValue;
  /**
   * The fencing token of the message's latest claim: written fresh by every `claimDue` (an
   * opaque string, unique per message and claim) and kept after the claim is settled, so a
   * retried mark can tell "already applied by this claim" from "superseded". Absent until the
   * message is first claimed, and again after a `requeue` (which ends every earlier claim). See
   * {@linkcode OutboxClaim}.
   */
  claimToken?: string;
  /**
   * Set by `claimDue` on a keyed message when the store knows it: the JetStream stream sequence
   * at which the message's key last had a message stored, as recorded by the `sequence` of the
   * dispatched mark that settled it (see {@linkcode OutboxMark}). The dispatcher's broker-side
   * key fence (`keyFence: "subject"`) publishes the message with
   * `Nats-Expected-Last-Subject-Sequence` set to it. Absent for messages without a key, for the
   * first message of a key, and when the key's last settlement recorded no sequence it could
   * trust (a `dead` message of the key forgets it). Stores keep it per key, so knowing it costs
   * a claim the same however long ago the key's previous message was dispatched (and survives
   * `prune`).
   */
  keySequence?: number;
}

/**
 * The fence of a claim: what a `markDispatched` / `markFailed` / `markDead` / `markMany` mark
 * must present to settle a message. Every claimed `OutboxMessage` is a valid claim.
 *
 * **With `claimToken`** (every message `claimDue` returns carries one), the stores decide
 * exactly, the same way on every store (`attempts` must match as well: it guards against
 * writers that claim without writing a token, such as older library versions during a rolling
 * upgrade):
 *
 * 1. The stored message is `claimed` with this `claimToken`: the mark applies, returns `true`.
 * 2. The stored message is already in the mark's target state (`dispatched`, `failed` or
 *    `dead`) with this `claimToken`: the mark was applied before by this same claim (a retry
 *    after a lost reply, a partial batch failure, or a second mark of the same id). It
 *    returns `true` and changes nothing (the first mark's `updatedAt`, error, due time and
 *    outcome stay).
 * 3. Anything else returns `false` (superseded) and changes nothing: the lease expired and
 *    another claim took the message (a new token), the message was requeued, or this claim
 *    was already settled to a *different* state (a `failed` claim cannot later be marked
 *    `dead`). Once a later claim has taken the message, marks of the earlier claim return
 *    `false` even if one of them had applied.
 *
 * `nextAttemptAt` is then not compared. Tokens are compared as opaque strings;
 * the library never decodes a timestamp to fence, so a database session's DateStyle or time
 * zone cannot break it.
 *
 * **Without `claimToken`** (claims built by hand before tokens existed), the fence is the
 * version 2 one: the stored message must be `claimed` with the same `attempts` and, when
 * `nextAttemptAt` is given, the same lease expiry. Such a mark cannot recognise its own
 * earlier success: a retry after a lost reply returns `false`.
 *
 * **Several marks of one id in one `markMany`** are settled in input order, each seeing the
 * effect of the ones before it: the first applies (rule 1), a later one with the same token
 * and target state is rule 2 (`true`), one with another target state is rule 3 (`false`).
 *
 * @example
 * ```ts
 * import type { OutboxClaim } from "@outbox/nats";
 * const claim: OutboxClaim = { id: "m-1", attempts: 1, claimToken: "c0a8…" };
 * const legacy: OutboxClaim = { id: "m-1", attempts: 1, nextAttemptAt: "2026-01-01T00:00:30.000Z" };
 * ```
 */
export interface OutboxClaim {
  /** The message id. */
  id: string;
  /** `attempts` as returned by `claimDue`. */
  attempts: number;
  /**
   * The lease expiry returned by `claimDue`. Without `claimToken`, when given, it is part of the
   * fence, so a claim from before a requeue can never settle the message again.
   */
  nextAttemptAt?: string;
  /** The claim's token as returned by `claimDue`; when given, it and `attempts` are the fence. */
  claimToken?: string;
}

/**
 * Options for {@linkcode OutboxRepository.claimDue}.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * const claimed = await outbox.claimDue(25, new Date(), { leaseMs: 10_000 });
 * ```
 */
export interface OutboxClaimOptions {
  /**
   * How long a claim is exclusive. When it expires, another claimer may take the message.
   *
   * @default {30000}
   */
  leaseMs?: number;
}

/**
 * A failed attempt, recorded by {@linkcode OutboxRepository.markFailed}.
 *
 * @example
 * ```ts
 * import type { OutboxFailure } from "@outbox/nats";
 * const now = new Date();
 * const failure: OutboxFailure = {
 *   error: "timeout", now, nextAttemptAt: new Date(now.getTime() + 1_000),
 * };
 * ```
 */
export interface OutboxFailure {
  /** Human-readable reason, stored as `lastError`. */
  error: string;
  /** When the message becomes due again. */
  nextAttemptAt: Date;
  /** The time of the failure. */
  now: Date;
}

/**
 * A permanent failure, recorded by {@linkcode OutboxRepository.markDead}.
 *
 * @example
 * ```ts
 * import type { OutboxDeadLetter } from "@outbox/nats";
 * const dead: OutboxDeadLetter = { error: "payload too large", now: new Date() };
 * ```
 */
export interface OutboxDeadLetter {
  /** Human-readable reason, stored as `lastError`. */
  error: string;
  /** The time of the decision. */
  now: Date;
}

/**
 * One settlement in a batch passed to {@linkcode OutboxRepository.markMany}.
 *
 * A `dispatched` mark may carry `sequence`: the stream sequence of the PubAck (a positive safe
 * integer; anything else is refused with `OutboxValidationError` before any mark applies). When
 * the mark applies to a keyed message, the store remembers it as its key's last sequence (the
 * `keySequence` of the key's next claimed message). Per key, a store applies these rules, only
 * for marks that apply (rule 1 of {@linkcode OutboxClaim}; a replayed or superseded mark
 * changes nothing): `dispatched` with `sequence` sets the key's sequence; `dispatched` without
 * one leaves it as it was (a job publishes nothing to the stream); `dead` forgets it (so an
 * operator's retry or skip publishes the key's next message without a fence, and the fence
 * resumes from that message's PubAck); `failed` leaves it. Marks of unkeyed messages ignore it.
 *
 * @example
 * ```ts
 * import type { OutboxMark } from "@outbox/nats";
 * const marks: OutboxMark[] = [
 *   { claim: { id: "a", attempts: 1 }, state: "dispatched" },
 *   { claim: { id: "b", attempts: 1 }, state: "failed", error: "timeout", nextAttemptAt: new Date() },
 *   { claim: { id: "c", attempts: 3 }, state: "dead", error: "no stream" },
 * ];
 * ```
 */
export type OutboxMark =
  | { claim: OutboxClaim; state: "dispatched"; outcome?: JsonValue; sequence?: number }
  | { claim: OutboxClaim; state: "failed"; error: string; nextAttemptAt: Date }
  | { claim: OutboxClaim; state: "dead"; error: string };

/**
 * Extra facts of a dispatched mark, for {@linkcode OutboxRepository.markDispatched} (the same
 * as the `sequence` of a `dispatched` {@linkcode OutboxMark}).
 *
 * @example
 * ```ts
 * import type { OutboxDispatchedOptions } from "@outbox/nats";
 * const options: OutboxDispatchedOptions = { sequence: 42 };
 * ```
 */
export interface OutboxDispatchedOptions {
  /** The stream sequence of the PubAck (a positive safe integer). */
  sequence?: number;
}

/**
 * The storage half of the outbox, as the dispatcher sees it. Every store implements it; the
 * conformance suite in `tests/conformance/` defines its exact semantics.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, type OutboxRepository } from "@outbox/nats";
 * const outbox: OutboxRepository = new MemoryOutboxRepository();
 * await outbox.enqueue({
 *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
 * });
 * const [claimed] = await outbox.claimDue(10, new Date());
 * await outbox.markDispatched(claimed, new Date());
 * ```
 */
export interface OutboxRepository {
  /**
   * Stores a record as a `pending` message. Enqueueing the same id again with identical content
   * returns the stored message; different content throws `OutboxDuplicateIdentityError`.
   * Invalid records throw `OutboxValidationError` and store nothing.
   */
  enqueue(record: OutboxRecord, options?: OutboxEnqueueOptions): Promise<OutboxMessage>;
  /**
   * Stores many records; all are validated before anything is stored. Returns the stored
   * messages in input order (duplicates resolved as in `enqueue`).
   */
  enqueueMany(
    records: readonly OutboxRecord[],
    options?: OutboxEnqueueOptions,
  ): Promise<OutboxMessage[]>;
  /** Reads one message, or `undefined` when the id is unknown. */
  get(id: string): Promise<OutboxMessage | undefined>;
  /**
   * Claims up to `limit` due messages, oldest first: `pending`, `failed` with `nextAttemptAt <=
   * now`, and `claimed` whose lease expired. (The SQL stores take the oldest by enqueue order
   * among the `limit` oldest pending messages and the `limit` earliest-due retries, so that a
   * claim never reads messages that are not due.) Each becomes `claimed` with `attempts + 1`,
   * `nextAttemptAt = now + leaseMs` and a fresh `claimToken` (the fence of its marks). Two concurrent claimers never receive the same message.
   * A stored message that cannot be decoded is moved to `dead` with the reason and skipped.
   */
  claimDue(limit: number, now: Date, options?: OutboxClaimOptions): Promise<OutboxMessage[]>;
  /**
   * Settles a claim as dispatched (fenced, see {@linkcode OutboxClaim}); `false` when the claim
   * was superseded, `true` when it applied now or had already been applied by this claim.
   */
  markDispatched(
    claim: OutboxClaim,
    now: Date,
    outcome?: JsonValue,
    options?: OutboxDispatchedOptions,
  ): Promise<boolean>;
  /** Records a failed attempt (fenced); `false` when the claim was superseded. */
  markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean>;
  /** Moves a claimed message to `dead` (fenced); `false` when the claim was superseded. */
  markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean>;
  /**
   * Settles many claims at once (one round trip where the store allows). The result has one
   * boolean per mark, in order, with the meaning of {@linkcode OutboxClaim}'s rules; marks of
   * the same id are settled in input order. When it throws, any subset of the marks may have
   * been applied: calling it again with the same marks is safe and reports those as `true`
   * (for claims with a `claimToken`). Stores without it are settled one mark at a time.
   */
  markMany?(marks: readonly OutboxMark[], now: Date): Promise<boolean[]>;
  /**
   * How many bytes of job outcome (UTF-8 bytes of its JSON text) a dispatched mark of this
   * claimed message can carry, for a store that keeps less next to some messages than the 64
   * KiB (and 256 levels) of JSON every store keeps; `undefined` when it keeps every such
   * outcome. A store without it keeps every such outcome (the SQL and memory stores).
   * The NATS KV store keeps a message in one entry below the server's `max_payload`, so its
   * room is what the dispatched record leaves of that. The dispatcher asks after a job ran and
   * sends a job whose outcome is larger `dead` (code `outcome`) instead of marking it; a store
   * that has this method refuses a larger outcome with `OutboxOutcomeRefusedError`, after
   * storing the message dead.
   */
  outcomeRoomBytes?(message: OutboxMessage): number | undefined;
}

/**
 * Counts and backlog figures of an outbox, from {@linkcode OutboxAdmin.stats}.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const stats = await new MemoryOutboxRepository().stats();
 * console.log(stats.due, stats.dead, stats.oldestDueAgeMs);
 * ```
 */
export interface OutboxStats {
  /** Messages never attempted. */
  pending: number;
  /** Messages under a claim (lease not necessarily expired). */
  claimed: number;
  /** Messages waiting for a retry. */
  failed: number;
  /** Messages delivered and kept for retention. */
  dispatched: number;
  /** Messages that need an operator. */
  dead: number;
  /** Messages a claim at `now` would consider. */
  due: number;
  /** `createdAt` of the oldest due message. */
  oldestDueCreatedAt?: string;
  /** `now - oldestDueCreatedAt` in milliseconds. */
  oldestDueAgeMs?: number;
  /**
   * Ordering keys blocked by a dead head (see {@linkcode OutboxAdmin.blockedKeys}); stores
   * without ordering keys leave it out.
   */
  blockedKeys?: number;
}

/**
 * Options for {@linkcode OutboxAdmin.prune}.
 *
 * @example
 * ```ts
 * import type { OutboxPruneOptions } from "@outbox/nats";
 * const day = 86_400_000;
 * const options: OutboxPruneOptions = {
 *   dispatchedBefore: new Date(Date.now() - 7 * day),
 *   deadBefore: new Date(Date.now() - 30 * day),
 * };
 * ```
 */
export interface OutboxPruneOptions {
  /** Delete `dispatched` messages last updated before this time. */
  dispatchedBefore?: Date;
  /** Delete `dead` messages last updated before this time. */
  deadBefore?: Date;
  /**
   * Rows deleted per statement; each batch is its own short statement.
   *
   * @default {1000}
   */
  batchSize?: number;
  /** Count what would be deleted without deleting anything. @default {false} */
  dryRun?: boolean;
  /** Called after every batch with the running totals. */
  onProgress?: (progress: OutboxPruneResult) => void;
}

/**
 * What {@linkcode OutboxAdmin.prune} deleted (or would delete, for a dry run).
 *
 * @example
 * ```ts
 * import type { OutboxPruneResult } from "@outbox/nats";
 * const result: OutboxPruneResult = { dispatched: 120, dead: 3 };
 * ```
 */
export interface OutboxPruneResult {
  /** Dispatched messages deleted. */
  dispatched: number;
  /** Dead messages deleted. */
  dead: number;
}

/**
 * Options for {@linkcode OutboxAdmin.listDead}.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const dead = await new MemoryOutboxRepository().listDead({ limit: 20 });
 * ```
 */
export interface OutboxListDeadOptions {
  /** Maximum number of messages returned, oldest first. @default {100} */
  limit?: number;
}

/**
 * A blocked ordering key, from {@linkcode OutboxAdmin.blockedKeys}: its oldest unsettled message
 * (the head) went `dead`, so its later messages wait.
 *
 * @example
 * ```ts
 * import type { OutboxBlockedKey } from "@outbox/nats";
 * const blocked: OutboxBlockedKey = {
 *   key: "order-42", headId: "order-42-paid", since: "2026-01-01T00:00:00.000Z",
 *   lastError: "permanent: no stream", waiting: 3,
 * };
 * ```
 */
export interface OutboxBlockedKey {
  /** The ordering key. */
  key: string;
  /** The dead message that blocks the key. */
  headId: string;
  /** When the head went `dead` (its `updatedAt`). */
  since: string;
  /** Why the head went `dead`. */
  lastError?: string;
  /** How many later messages of the key wait behind the head. */
  waiting: number;
}

/**
 * Options for {@linkcode OutboxAdmin.blockedKeys}.
 *
 * @example
 * ```ts
 * import type { OutboxBlockedKeysOptions } from "@outbox/nats";
 * const options: OutboxBlockedKeysOptions = { limit: 20 };
 * ```
 */
export interface OutboxBlockedKeysOptions {
  /** Maximum number of keys returned, longest blocked first. @default {100} */
  limit?: number;
}

/**
 * What {@linkcode OutboxAdmin.unblockKey} does with a blocked key's dead head.
 *
 * - `retry`: requeue the head (`pending`, attempts reset); the key resumes with it.
 * - `skip`: leave the head `dead` (listed by `listDead`) and release the next message of the key.
 *
 * @example
 * ```ts
 * import type { OutboxUnblockKeyOptions } from "@outbox/nats";
 * const options: OutboxUnblockKeyOptions = { action: "skip" };
 * ```
 */
export interface OutboxUnblockKeyOptions {
  /** `retry` the dead head, or `skip` it. */
  action: "retry" | "skip";
  /** The time recorded on the changed messages. @default {new Date()} */
  now?: Date;
}

/**
 * Retention and administration, offered by every store next to {@linkcode OutboxRepository}.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * const dead = await outbox.listDead();
 * await outbox.requeue(dead.map((message) => message.id));
 * await outbox.prune({ dispatchedBefore: new Date(Date.now() - 86_400_000) });
 * ```
 */
export interface OutboxAdmin {
  /** Deletes old `dispatched` (and optionally `dead`) messages in bounded batches. */
  prune(options: OutboxPruneOptions): Promise<OutboxPruneResult>;
  /** Counts per state and the backlog at `now` (default: the current time). */
  stats(now?: Date): Promise<OutboxStats>;
  /** Lists `dead` messages, oldest first. */
  listDead(options?: OutboxListDeadOptions): Promise<OutboxMessage[]>;
  /**
   * Moves `dead` messages back to `pending` with `attempts` reset to 0 and `lastError` kept.
   * Ids that are unknown or not dead are ignored. Returns how many messages changed.
   */
  requeue(ids: readonly string[], now?: Date): Promise<number>;
  /** Lists blocked ordering keys (keys whose head is `dead`), longest blocked first. */
  blockedKeys(options?: OutboxBlockedKeysOptions): Promise<OutboxBlockedKey[]>;
  /**
   * Unblocks an ordering key: `retry` requeues its dead head, `skip` leaves the head `dead` and
   * releases the next message of the key. Resolves `true` when the key was blocked and is no
   * longer; `false` when it was not blocked (unknown key, or its head is not dead).
   */
  unblockKey(key: string, options: OutboxUnblockKeyOptions): Promise<boolean>;
}

/**
 * Options for {@linkcode InboxRepository.record}.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository } from "@outbox/nats";
 * const inbox = new MemoryInboxRepository();
 * await inbox.record("msg-1", { consumer: "billing" });
 * ```
 */
export interface InboxRecordOptions {
  /** When the message was received. @default {new Date()} */
  now?: Date;
  /**
   * The consumer scope: the same message id recorded by two consumers counts once for each.
   *
   * @default {""}
   */
  consumer?: string;
}

/**
 * The receiving half: remembers processed message ids so each takes effect once.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository, type InboxRepository } from "@outbox/nats";
 * const inbox: InboxRepository = new MemoryInboxRepository();
 * console.log(await inbox.record("msg-1")); // true: first time
 * console.log(await inbox.record("msg-1")); // false: duplicate
 * ```
 */
export interface InboxRepository {
  /**
   * Records a message id; `true` only for the call that inserted it. The second argument is
   * the receive time (as in the reference API) or an options object.
   */
  record(messageId: string, options?: Date | InboxRecordOptions): Promise<boolean>;
  /**
   * Whether the id is recorded for the consumer scope. Inboxes that cannot share the handler's
   * transaction (memory, NATS KV) need it: the consumer integration checks before running the
   * handler and records after it succeeded.
   */
  has?(messageId: string, options?: InboxRecordOptions): Promise<boolean>;
  /**
   * Whether `record()` writes at once, outside any transaction of the caller (memory, NATS KV:
   * `true`), so a rolled-back or failed piece of work cannot undo it. `processOnce` and
   * `consumeWithInbox` then check `has()` before the work and record after it succeeded
   * (at-least-once: never a lost message). Inboxes whose `record()` joins the caller's
   * transaction (SQL) leave it unset or `false`.
   *
   * @default {false}
   */
  readonly recordsImmediately?: boolean;
}

/**
 * Options for {@linkcode InboxAdmin.prune}.
 *
 * @example
 * ```ts
 * import type { InboxPruneOptions } from "@outbox/nats";
 * const options: InboxPruneOptions = { receivedBefore: new Date(Date.now() - 86_400_000) };
 * ```
 */
export interface InboxPruneOptions {
  /** Delete ids received before this time. */
  receivedBefore: Date;
  /** Ids deleted per statement. @default {1000} */
  batchSize?: number;
}

/**
 * Retention for an inbox.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository } from "@outbox/nats";
 * const removed = await new MemoryInboxRepository().prune({ receivedBefore: new Date() });
 * ```
 */
export interface InboxAdmin {
  /** Deletes ids received before the cutoff; returns how many were deleted. */
  prune(options: InboxPruneOptions): Promise<number>;
}

/**
 * The header part of a prepared event: its identity and time.
 *
 * @example
 * ```ts
 * import type { PreparedEventHeader } from "@outbox/nats";
 * const header: PreparedEventHeader = { id: "evt-1", time: new Date().toISOString() };
 * ```
 */
export interface PreparedEventHeader {
  /** Event id, published as `Nats-Msg-Id`. */
  id: string;
  /** Event time, ISO-8601. */
  time: string;
}

/**
 * An event ready to publish, as the reference framework prepares it.
 *
 * @example
 * ```ts
 * import type { PreparedEvent } from "@outbox/nats";
 * const event: PreparedEvent = {
 *   event: "order.created",
 *   subject: "orders.created",
 *   header: { id: "evt-1", time: "2026-01-01T00:00:00.000Z" },
 *   payload: { orderId: 42 },
 *   encodedPayload: '{"orderId":42}',
 *   headers: {},
 * };
 * ```
 */
export interface PreparedEvent {
  /** Event name. */
  event: string;
  /** Descriptor identity (`Trellis-Event-Descriptor`); optional. */
  descriptorIdentity?: string;
  /** Subject to publish to. */
  subject: string;
  /** Identity and time. */
  header: PreparedEventHeader;
  /** Decoded payload. */
  payload: unknown;
  /** Payload exactly as it is published. */
  encodedPayload: string;
  /** Headers published with the event. */
  headers: Record<string, string>;
}

/**
 * What the dispatcher tells a runtime about one delivery.
 *
 * @example
 * ```ts
 * import type { OutboxDeliveryOptions } from "@outbox/nats";
 * const options: OutboxDeliveryOptions = { timeoutMs: 4_000 };
 * ```
 */
export interface OutboxDeliveryOptions {
  /**
   * How long the delivery may take before the claim's lease is at risk. A runtime should give up
   * (reject) within this time; the dispatcher stops waiting after it either way.
   */
  timeoutMs?: number;
  /**
   * The broker-side key fence (the dispatcher's `keyFence: "subject"`): publish only if the last
   * message stored on the event's subject has this stream sequence (JetStream:
   * `Nats-Expected-Last-Subject-Sequence`). A runtime that cannot fence ignores it. When the
   * broker refuses because another message is last, the runtime must check whether that last
   * message is this very event (an earlier attempt that was stored, its PubAck lost) and then
   * resolve with its receipt; otherwise reject with a `permanent` `OutboxPublishError` (code
   * `key_fence`).
   */
  expectedLastSubjectSequence?: number;
}

/**
 * What a runtime may report about a successful publish.
 *
 * @example
 * ```ts
 * import type { OutboxPublishReceipt } from "@outbox/nats";
 * const receipt: OutboxPublishReceipt = { stream: "ORDERS", seq: 42, duplicate: false };
 * ```
 */
export interface OutboxPublishReceipt {
  /** `true` when the broker had already stored this message id (a re-publish). */
  duplicate?: boolean;
  /** The stream that stored the message. */
  stream?: string;
  /** Its sequence number in that stream. */
  seq?: number;
}

/**
 * Where a delivery failure lies, so the dispatcher pauses only what is affected:
 *
 * - `connection`: the NATS connection is down: everything waits.
 * - `jetstream`: JetStream is disabled or its API does not answer: everything waits.
 * - `stream`: one stream cannot take writes (no leader, full with `discard: new`): only messages
 *   for that stream wait; the others flow.
 * - `subject`: the subject's stream could not be identified (no stream captures it, or the
 *   JetStream API that would say which did not answer): only that subject is affected.
 *
 * Runtimes attach it to an `OutboxPublishError` (`error.scope`); a failure without a scope is
 * treated as broker-wide.
 *
 * @example
 * ```ts
 * import type { OutboxFailureScope } from "@outbox/nats";
 * const scope: OutboxFailureScope = { kind: "stream", stream: "ORDERS" };
 * ```
 */
export type OutboxFailureScope =
  | { kind: "connection" }
  | { kind: "jetstream" }
  | { kind: "stream"; stream: string }
  | { kind: "subject"; subject: string };

/**
 * Delivers outbox messages. Promise rejection is failure; reject with `OutboxPublishError` to say
 * whether the failure is permanent, retryable, or means the broker is unavailable.
 *
 * @example
 * ```ts
 * import type { OutboxRuntime } from "@outbox/nats";
 * const sent: string[] = [];
 * const runtime: OutboxRuntime = {
 *   publishPreparedEvent(event) {
 *     sent.push(event.header.id);
 *     return Promise.resolve();
 *   },
 * };
 * ```
 */
export interface OutboxRuntime {
  /**
   * Publishes one event; resolves once the broker acknowledged it, optionally with a receipt.
   * `options.timeoutMs` is the time left before the claim's lease is at risk.
   */
  publishPreparedEvent(
    event: PreparedEvent,
    options?: OutboxDeliveryOptions,
  ): Promise<void | OutboxPublishReceipt>;
  /**
   * Hands a `job.create` / `job.submit` message to the job system; its outcome (for example
   * `{ kind: "accepted", jobId }`) is stored on the message.
   */
  dispatchJobSubmission?(
    message: OutboxMessage,
    options?: OutboxDeliveryOptions,
  ): Promise<JsonValue>;
  /**
   * Checks that the broker answers, without publishing anything. The dispatcher calls it while
   * its circuit breaker is open to decide when to resume.
   */
  probe?(): Promise<boolean>;
  /**
   * Checks, without publishing, whether one `stream` or `subject` scope that failed as
   * `unavailable` would take writes again (for JetStream: the stream answers stream info, has a
   * leader and room). The dispatcher calls it for each parked scope, with backoff, and releases
   * the scope's waiting messages when it answers `true`. Without it a parked scope is simply
   * retried when its probe delay has passed.
   */
  probeScope?(scope: OutboxFailureScope): Promise<boolean>;
}

/**
 * Runs `work` in one database transaction: commit when it resolves, roll back when it rejects.
 * The inbox consumer uses it and ignores the value it resolves to, so drivers that wrap the
 * result (postgres.js `sql.begin` resolves to an unwrapped array type) fit as they are:
 * `(work) => sql.begin((tx) => work(tx))`.
 *
 * @example
 * ```ts
 * import postgres from "postgres";
 * import { postgresJsExecutor, type SqlExecutor, type TransactionRunner } from "@outbox/nats";
 * const db = postgresJsExecutor(postgres("postgres://postgres@127.0.0.1:5432/app"));
 * // Every executor offers transaction(work): BEGIN, work(tx), COMMIT (ROLLBACK when it throws).
 * const runInTransaction: TransactionRunner<SqlExecutor> = (work) => db.transaction!(work);
 * ```
 */
export type TransactionRunner<Tx> = <T>(work: (tx: Tx) => Promise<T>) => Promise<unknown>;
