/**
 * An outbox on a NATS KV bucket (`@nats-io/kv`), with the semantics of the SQL stores.
 *
 * Layout (one bucket, keys from {@link ./keys.ts}):
 * - `m.<token>`: the canonical record of a message (JSON, schema in {@link ./records.ts}).
 *   Every state change is a revision compare-and-set (`update(key, value, revision)`), so two
 *   claimers never both win and a mark only applies to the claim it fences.
 * - `q.<token>`: an active-index marker that exists while the message is pending, claimed or
 *   failed. Claims find due work through a watch on `q.>` (see {@link ./active_index.ts}), never
 *   by listing records, so dispatched records kept for retention cost a claim nothing. A marker
 *   written after its record (a failed mark, requeue, repair) names the record revision; with
 *   `markerCopies: true` (then also enqueue's, written after the record) it carries, for a
 *   small record, a copy of it (`Marker.r`): a claim compares-and-sets the record from the copy
 *   without reading it, and reads it only when that fails. By default (`"deferred"`) an
 *   enqueue writes record and marker together and then, once both are acknowledged, rewrites
 *   the marker of an unkeyed record with the copy and the revision it now knows (a
 *   compare-and-set on the marker, keeping its enqueue order). Claims use copies whichever
 *   repository wrote them.
 * - `q._k.<token>`: the entry of an ordering key: its head (the only message of the key a claim
 *   may take) and its last stream sequence. Written only by compare-and-set: a keyed enqueue
 *   joins its key after its marker is written (creating the head, or rewriting the entry so a
 *   concurrent hand-over reads again), a settled head hands over to the oldest marker of its key
 *   in the index, and a claim checks the head against the entry as of after its record read.
 *
 * Crash safety: the record is the truth, the marker only a pointer (its copy only a guess, checked
 * by the compare-and-set). Every state between the two writes heals itself: a marker whose record
 * is terminal, corrupt or (after a grace period) missing is deleted by the next claim that sees it;
 * a record left active without a marker (an enqueue that crashed during its one flush, or with
 * `markerCopies` one that stopped between its record write and its marker write) is
 * re-indexed by a duplicate `enqueue` of the same id or by {@linkcode NatsKvOutboxRepository.repair}
 * (sooner when it heads its key: see below). A key's head that has no marker in the index (a
 * settled message named head through a marker whose delete was late or lost, or an active head
 * whose marker write failed) is read by the next claim that runs out of due messages (under a
 * backlog, by a full claim at most once a second), which hands the key over or writes the marker
 * again; a dead head keeps blocking its key.
 *
 * @module
 */

import type { KV, KvEntry } from "@nats-io/kv";
import { KvRequests } from "./kv_requests.ts";
import {
  errorMessage,
  OutboxOutcomeRefusedError,
  OutboxStorageConflictError,
  OutboxValidationError,
} from "../../core/errors.ts";
import { assertOutboxIdentity } from "../../core/identity.ts";
import {
  checkedBatchSize,
  checkedDate,
  checkedLeaseMs,
  checkedLimit,
  checkedSequence,
  checkedUnblockAction,
  nonNegative,
} from "../../core/limits.ts";
import { type FenceVerdict, fenceVerdict, newClaimToken } from "../../core/fence.ts";
import { addMs } from "../../core/time.ts";
import { storableErrorText, storableMark } from "../../core/storable_text.ts";
import type {
  JsonValue,
  OutboxAdmin,
  OutboxBlockedKey,
  OutboxBlockedKeysOptions,
  OutboxClaim,
  OutboxClaimOptions,
  OutboxDeadLetter,
  OutboxDispatchedOptions,
  OutboxEnqueueOptions,
  OutboxFailure,
  OutboxListDeadOptions,
  OutboxMark,
  OutboxMessage,
  OutboxPruneOptions,
  OutboxPruneResult,
  OutboxRecord,
  OutboxRepository,
  OutboxStats,
  OutboxUnblockKeyOptions,
} from "../../core/types.ts";
import { validateOrderingKey, validateOutboxRecord } from "../../core/validate.ts";
import { type ActiveEntry, ActiveIndex, type ActiveWork, type KeyState } from "./active_index.ts";
import { isTooLargeWrite, isWrongLastSequence, NatsKvOrderingKeyError } from "./errors.ts";
import {
  decodeToken,
  isKeyEntryKey,
  keyEntryKey,
  markerKeyOf,
  markerPrefix,
  outboxRecordKey,
  recordPrefix,
  tokenOf,
} from "./keys.ts";
import {
  corruptMessage,
  encodeJson,
  type KeyEntry,
  loadedRecordCodec,
  type Marker,
  markerOf,
  type RecordCodec,
  recordCodec,
  type StoredOutboxRecord,
  toMessage,
} from "./records.ts";
import {
  mapInFlight,
  rawRemover,
  removalsInFlight,
  removeIfUnchanged,
  type Remover,
  scanLatest,
} from "./scan.ts";

/**
 * Options of {@linkcode NatsKvOutboxRepository}.
 *
 * @example
 * ```ts
 * import type { NatsKvOutboxOptions } from "@outbox/nats";
 * const options: NatsKvOutboxOptions = { orphanGraceMs: 120_000, syncTimeoutMs: 10_000 };
 * ```
 */
export interface NatsKvOutboxOptions {
  /**
   * How old a marker must be before a claim that finds no record behind it deletes it (a
   * record write still in flight must not lose its marker). Measured on the NATS server's clock
   * only: the marker's write time against the newest write time the watch has shown (the
   * claims' own sync writes keep that current), so a skewed process clock changes nothing.
   * Also how long a claimer trusts its read of a dead key head (blocked on purpose) before it
   * reads the record again (a retry that failed or died before writing the head's marker).
   *
   * @default {60000}
   */
  orphanGraceMs?: number;
  /**
   * How long the watch on the markers may deliver nothing while a claim waits for its own
   * barrier write; then the watch is rebuilt once, and then the claim gives up with
   * `NatsKvIndexError`. A long snapshot that keeps delivering is waited for.
   *
   * @default {5000}
   */
  syncTimeoutMs?: number;
  /**
   * How many of its own claims the repository remembers (record and revision), so settling one
   * of them needs a single write instead of a read and a write.
   *
   * @default {10000}
   */
  claimCacheSize?: number;
  /**
   * Whether markers carry a copy of their record (records up to 8 KiB) and the record revision
   * it is, so the first claim of a message compares-and-sets the record without reading it first:
   * one JetStream request less per relayed message (bench/README.md: the relay at 0.44x against
   * 0.35x a raw `js.publish` loop in a same-run A/B, about a fifth less CPU per message in the
   * relay and in nats-server).
   *
   * - `"deferred"` (the default): `enqueue` writes record and marker together (one round trip, as
   *   without copies) and returns; then, once both writes are acknowledged, it rewrites the
   *   marker of an unkeyed record with the copy and the record's revision, by compare-and-set on
   *   the marker (so nothing is written when a claim, a mark or a requeue changed it meanwhile),
   *   keeping the message's enqueue order. One more write per message for the producer and the
   *   server; a claim that comes before the rewrite reads the record. {@linkcode close} waits for
   *   the rewrites still in flight. Failed marks, requeues, `repair()` and keyed records write
   *   markers without a copy.
   * - `true`: the markers this repository writes (`enqueue`, a failed mark, `requeue`,
   *   `repair()`) carry a copy. The price: `enqueue` must know the record's revision before it
   *   writes the marker, so it writes the record, waits for its acknowledgement, then writes the
   *   marker (one more round trip before `enqueue` returns), and a process that stops between the
   *   two writes leaves an active record without a marker, unclaimable until a retried `enqueue`
   *   of the same id, a `requeue` of it or `repair()` indexes it again (otherwise that takes a
   *   crash during the one flush).
   * - `false`: markers carry no copy, and every claim reads its record.
   *
   * Markers with a copy are about the record's size larger, and the watch delivers them to every
   * claimer (with `"deferred"` each marker twice); each repository's index keeps at most 32 MiB of
   * copies (beyond that, markers are indexed without theirs and their records are read). Claims
   * use the copies they find whatever this option says: repositories with different settings can
   * share a bucket (a copy is only a guess, checked by the claim's compare-and-set).
   *
   * @default {"deferred"}
   */
  markerCopies?: boolean | "deferred";
}

/**
 * What a work listener registered with {@linkcode NatsKvOutboxRepository.watch} is told.
 *
 * @example
 * ```ts
 * import type { NatsKvWork } from "@outbox/nats";
 * const onWork = (work: NatsKvWork) => console.log(work.id, work.dueAt ?? "due now");
 * ```
 */
export interface NatsKvWork {
  /** The message id (empty when the marker is damaged and the id is too long to be in its key). */
  id: string;
  /** When the message becomes due, if not now (a failed message waiting for its retry). */
  dueAt?: string;
}

/**
 * A work listener: called (synchronously, from the watch) whenever a message becomes active or
 * is rescheduled in any process using the bucket.
 *
 * @example
 * ```ts
 * import type { NatsKvWorkListener } from "@outbox/nats";
 * const listener: NatsKvWorkListener = (work) => {
 *   if (work.dueAt === undefined) console.log("new work", work.id);
 * };
 * ```
 */
export type NatsKvWorkListener = (work: NatsKvWork) => void;

/**
 * What {@linkcode NatsKvOutboxRepository.repair} found and fixed.
 *
 * @example
 * ```ts
 * import type { NatsKvRepairResult } from "@outbox/nats";
 * const result: NatsKvRepairResult = { records: 10, markersCreated: 1, markersRemoved: 0 };
 * ```
 */
export interface NatsKvRepairResult {
  /** Records scanned. */
  records: number;
  /** Active records that had lost their marker and got it back. */
  markersCreated: number;
  /** Markers removed because their record is settled, corrupt or missing. */
  markersRemoved: number;
}

interface Cached {
  revision: number;
  record: StoredOutboxRecord;
  /** The record's size as written (encoded), for `outcomeRoomBytes`. */
  bytes?: number;
}

/** A settled message's record revision as read by the caller of a hand-over (`dead`: its state). */
interface Settled {
  revision: number;
  dead?: boolean;
}

/**
 * Whether the key's head was named by a hand-over that ran after the head's record reached
 * `revision` (its settled state): it settled before it was head (see `#handOver`).
 */
function settledBeforeHead(entry: KeyEntry, revision: number): boolean {
  return entry.at !== undefined && revision < entry.at;
}

/** `{ seq }` when the key has a sequence, else `{}`. */
function pick(seq: number | undefined): { seq?: number } {
  return seq === undefined ? {} : { seq };
}

/** A message as `enqueue` stored (or found) it, with the revision of the marker it wrote. */
interface Stored {
  message: OutboxMessage;
  markerRevision?: number;
}

/**
 * What `#store` writes (a new record, as stored and encoded) and where (its key and its
 * marker's), and the codec to read what it finds.
 */
interface StoreWrite {
  stored: StoredOutboxRecord;
  bytes: Uint8Array;
  codec: RecordCodec;
  key: string;
  markerKey: string;
}

type Claimed = { order: number; message: OutboxMessage };

/** An ordering key's entry as read (or as the index knows it); revision 0: no entry. */
interface KeyRead {
  entryKey: string;
  revision: number;
  value?: KeyEntry;
}

/**
 * An outbox stored in a NATS KV bucket: `enqueue`, `claimDue` and the fenced marks of
 * {@linkcode OutboxRepository}, plus the retention and administration of
 * {@linkcode OutboxAdmin}, a cross-process wake-up ({@linkcode NatsKvOutboxRepository.watch})
 * and a crash repair scan. Create the bucket with `createOutboxBucket` (history 1, file storage)
 * and share it between every process of the service; call `close()` when done.
 *
 * A claim reads at most about `limit` records (none while markers carry current copies of them:
 * see `NatsKvOutboxOptions.markerCopies`) whatever the number of dispatched records kept in the
 * bucket: due work is found through an in-process index fed by a watch on the active-index
 * markers. Message ids of any form round-trip (keys are base64url, or a SHA-256 for ids over 768
 * bytes). Duplicates and lost races are recognised by JetStream error codes.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { Kvm } from "@nats-io/kv";
 * import { createOutboxBucket, NatsKvOutboxRepository } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const kv = await createOutboxBucket(new Kvm(nc), "orders_outbox");
 * const outbox = new NatsKvOutboxRepository(kv);
 * await outbox.enqueue({
 *   id: "order-1-created", kind: "event.publish", name: "order.created",
 *   subject: "orders.created", payload: JSON.stringify({ id: 1 }), headers: {},
 * });
 * const claimed = await outbox.claimDue(25, new Date());
 * for (const message of claimed) await outbox.markDispatched(message, new Date());
 * await outbox.close();
 * await nc.close();
 * ```
 */
export class NatsKvOutboxRepository implements OutboxRepository, OutboxAdmin {
  readonly #kv: KV;
  /** The hot operations (pipelined for a plain `Bucket`). */
  readonly #requests: KvRequests;
  readonly #index: ActiveIndex;
  readonly #orphanGraceMs: number;
  readonly #claimCacheSize: number;
  /** `NatsKvOutboxOptions.markerCopies` is `true`. */
  readonly #markerCopies: boolean;
  /** `NatsKvOutboxOptions.markerCopies` is `"deferred"`. */
  readonly #deferredCopies: boolean;
  /** Deferred copies being written (`#copyLater`), which `close()` waits for. */
  readonly #copying = new Set<Promise<void>>();
  readonly #claims = new Map<string, Cached>();
  readonly #inFlight = new Set<string>();
  /**
   * Keys whose head has no marker and needs nothing done (a dead head: blocked on purpose), with
   * the key entry revision that was read and when (this process's clock): an idle claim does not
   * read them again while the entry is unchanged, for `orphanGraceMs` (see `#repairKeys`).
   */
  #quietHeads = new Map<string, Quiet>();
  /** When a full claim last ran `#repairKeys` (this process's clock, epoch ms). */
  #busyRepairAtMs = 0;
  /**
   * The bucket's largest value (its stream's `max_msg_size`), read once from `kv.status()`:
   * `undefined` while unread, `0` for none (or when the KV object cannot tell).
   */
  #bucketMaxValue: number | undefined;
  #bucketMaxValueRead: Promise<void> | undefined;

  /** Uses `kv` (a bucket from `Kvm#create` / `Kvm#open`, or `createOutboxBucket`). */
  constructor(kv: KV, options: NatsKvOutboxOptions = {}) {
    this.#kv = kv;
    this.#requests = new KvRequests(kv);
    this.#orphanGraceMs = nonNegative("orphanGraceMs", options.orphanGraceMs ?? 60_000);
    this.#claimCacheSize = nonNegative("claimCacheSize", options.claimCacheSize ?? 10_000);
    const copies = options.markerCopies ?? "deferred";
    if (typeof copies !== "boolean" && copies !== "deferred") {
      throw new OutboxValidationError(
        "markerCopies",
        `markerCopies must be true, false or "deferred", got ${String(options.markerCopies)}`,
      );
    }
    this.#markerCopies = copies === true;
    this.#deferredCopies = copies === "deferred";
    this.#index = new ActiveIndex(kv, nonNegative("syncTimeoutMs", options.syncTimeoutMs ?? 5_000));
  }

  /** Stores a record as `pending`; see {@linkcode OutboxRepository.enqueue}. */
  async enqueue(record: OutboxRecord, options: OutboxEnqueueOptions = {}): Promise<OutboxMessage> {
    const valid = validateOutboxRecord(record);
    if (this.#bucketMaxValue === undefined) await this.#readBucketMaxValue();
    const prepared = this.#prepare(valid, new Date());
    const stored = await this.#store(valid, prepared, undefined, options.contextHeaders);
    await this.#joinIfActive(stored);
    return stored.message;
  }

  /**
   * Stores many records, validated first; see {@linkcode OutboxRepository.enqueueMany}. Ids
   * already stored with other content are detected before anything is written (a concurrent
   * writer can still win between the check and the write; that record then throws alone).
   */
  async enqueueMany(
    records: readonly OutboxRecord[],
    options: OutboxEnqueueOptions = {},
  ): Promise<OutboxMessage[]> {
    // contextHeaders may be a one-shot iterator, and it is read once per comparison.
    options = { ...options, contextHeaders: options.contextHeaders && [...options.contextHeaders] };
    const valid = records.map((record) => validateOutboxRecord(record));
    if (valid.length === 0) return [];
    const first = new Map<string, OutboxRecord>();
    for (const record of valid) {
      const earlier = first.get(record.id);
      if (earlier) assertOutboxIdentity(earlier, record, options.contextHeaders);
      else first.set(record.id, record);
    }
    const unique = [...first.values()];
    if (this.#bucketMaxValue === undefined) await this.#readBucketMaxValue();
    const now = new Date();
    // Sizes before anything is written: a record the server cannot take fails the whole batch.
    const prepared = unique.map((record) => this.#prepare(record, now));
    if (unique.length > 1) {
      const existing = await Promise.all(unique.map((record) => this.#read(record.id)));
      existing.forEach((stored, i) => {
        if (stored?.ok) assertOutboxIdentity(stored.record, unique[i], options.contextHeaders);
      });
    }
    // Keys first (hashing is asynchronous), then every write issued in one go, in input order,
    // so the enqueue order (the marker revisions) follows the input.
    const keys = await Promise.all(unique.map((record) => outboxRecordKey(record.id)));
    const stored = await Promise.all(
      unique.map((record, i) => this.#store(record, prepared[i], keys[i], options.contextHeaders)),
    );
    // Then each keyed message joins its key, in input order per key (the first of a key without
    // a head becomes the head); keys at once.
    const byKey = new Map<string, Stored[]>();
    for (const item of stored) {
      const orderingKey = item.message.orderingKey;
      if (orderingKey === undefined) continue;
      const queue = byKey.get(orderingKey);
      if (queue) queue.push(item);
      else byKey.set(orderingKey, [item]);
    }
    await Promise.all([...byKey.values()].map(async (queue) => {
      for (const item of queue) await this.#joinIfActive(item);
    }));
    const byId = new Map(stored.map(({ message }) => [message.id, message]));
    return valid.map((record) => structuredClone(byId.get(record.id)!));
  }

  /**
   * Reads one message, or `undefined`. A stored entry that cannot be decoded is returned as a
   * best-effort `dead` message whose `lastError` says why it is corrupt.
   */
  async get(id: string): Promise<OutboxMessage | undefined> {
    const codec = await recordCodec();
    const key = await outboxRecordKey(id);
    const entry = await this.#requests.get(key);
    if (!entry || entry.operation !== "PUT") return undefined;
    const decoded = codec.decodeRecord(entry.value, id);
    return decoded.ok
      ? toMessage(decoded.record)
      : corruptMessage(decoded.raw, id, entry.created.toISOString(), decoded.error);
  }

  /**
   * Claims up to `limit` due messages, oldest first; see {@linkcode OutboxRepository.claimDue}.
   * Reads at most about `limit` records (plus one per stale hint or lost race; none for a
   * message whose marker carries a current copy of its record); when the index cannot fill the
   * claim it first syncs with the bucket (one small write), so a claim that returns fewer than
   * `limit` messages has seen every message enqueued before it started.
   */
  async claimDue(
    limit: number,
    now: Date,
    options: OutboxClaimOptions = {},
  ): Promise<OutboxMessage[]> {
    const max = checkedLimit(limit);
    const leaseMs = checkedLeaseMs(options.leaseMs);
    // Known by the time a mark asks how much room a job's outcome has (never throws).
    if (this.#bucketMaxValue === undefined) void this.#readBucketMaxValue();
    checkedDate(now, "now");
    if (max === 0) return [];
    let synced = await this.#index.ready();
    const codec = await recordCodec();
    const nowMs = now.getTime();
    const nowIso = now.toISOString();
    const leaseUntil = addMs(now, leaseMs).toISOString();
    const claimToken = newClaimToken();
    const tried = new Set<string>();
    const claimed: Claimed[] = [];
    const failures: unknown[] = [];
    let readAhead = max;
    while (claimed.length < max) {
      const want = max - claimed.length;
      const candidates = this.#index.candidates(
        nowMs,
        Math.max(want, readAhead),
        (entry) => tried.has(entry.markerKey) || this.#inFlight.has(entry.markerKey),
      );
      if (candidates.length === 0) {
        if (synced) {
          await this.#repairKeys();
          break;
        }
        await this.#index.sync();
        synced = true;
        continue;
      }
      for (const entry of candidates) this.#inFlight.add(entry.markerKey);
      try {
        // Phase 1: read every candidate at once (a marker's copy of its record stands in for a
        // read); phase 2: claim the oldest `want` due ones.
        const read = await Promise.all(
          candidates.map((entry) =>
            (this.#copied(entry, codec) ?? this.#inspect(entry)).catch((error) => {
              failures.push(error);
              return "failed" as const;
            })
          ),
        );
        const due: Array<
          { entry: ActiveEntry; record: StoredOutboxRecord; revision: number; copied?: true }
        > = [];
        read.forEach((outcome, i) => {
          const entry = candidates[i];
          if (typeof outcome === "string") {
            tried.add(entry.markerKey);
            return;
          }
          const dueAt = outcome.record.nextAttemptAt;
          if (outcome.record.state !== "pending" && Date.parse(dueAt!) > nowMs) {
            if ("copied" in outcome) {
              // Only a compare-and-set tells whether a copy is current: one that says "not due"
              // (a marker written by repair, a requeue or a duplicate enqueue carries no due
              // time) may be stale, the record due since. A next round reads it.
              this.#index.dropCopy(entry.markerKey);
              return;
            }
            this.#index.hint(entry.markerKey, Date.parse(dueAt!), outcome.revision);
            tried.add(entry.markerKey);
          } else if (due.length < want) {
            due.push({ entry, ...outcome });
            tried.add(entry.markerKey);
          }
          // Due but beyond `want`: left untried, a next round may claim it.
        });
        const won = await Promise.all(
          due.map(({ entry, record, revision, copied }) =>
            this.#claimHead(entry, record, revision, nowIso, leaseUntil, claimToken, copied)
              .catch(
                (error) => {
                  failures.push(error);
                  return undefined;
                },
              )
          ),
        );
        let gained = 0;
        won.forEach((result, i) => {
          if (result === "stale") {
            // The record changed since its marker's copy: a next round reads it.
            this.#index.dropCopy(due[i].entry.markerKey);
            tried.delete(due[i].entry.markerKey);
          } else if (result) {
            claimed.push(result);
            gained += 1;
          }
        });
        // Stale hints (a process start, other claimers' leases): read further ahead next time.
        if (gained < want) readAhead = Math.min(Math.max(readAhead, want) * 2, maxReadAhead);
      } finally {
        for (const entry of candidates) this.#inFlight.delete(entry.markerKey);
      }
      if (failures.length > 0) break;
    }
    // A full claim did not run out of due messages, so it did not look at the keys above: under
    // a backlog that never drains, a key whose head has no marker would wait for it. At most
    // once per busyRepairMs (free while every key with messages has a marked head).
    if (claimed.length === max && Date.now() - this.#busyRepairAtMs >= busyRepairMs) {
      this.#busyRepairAtMs = Date.now();
      await this.#repairKeys();
    }
    // Claims that succeeded are returned even if others failed (they hold leases).
    if (claimed.length === 0 && failures.length > 0) throw failures[0];
    return claimed.sort((a, b) => a.order - b.order).map((result) => result.message);
  }

  /**
   * Settles a claim as dispatched (fenced); `false` when the claim was superseded. For a keyed
   * message, `options.sequence` (the PubAck's) becomes its key's sequence, written with the
   * hand-over of the key in one compare-and-set. An `outcome` larger than the record has room
   * for (see {@linkcode NatsKvOutboxRepository.outcomeRoomBytes}), or whose record the server
   * refuses as too large (a bucket's `max_msg_size` below max_payload), settles the claim `dead`
   * instead (`lastError` starting `outcome: `) and throws `OutboxOutcomeRefusedError`: a record
   * over the server's max_payload could never be written, and a claim left claimed would run
   * its job again after its lease.
   */
  async markDispatched(
    claim: OutboxClaim,
    now: Date,
    outcome?: JsonValue,
    options: OutboxDispatchedOptions = {},
  ): Promise<boolean> {
    const sequence = checkedSequence(options?.sequence);
    return await this.#settle(storableMark({ claim, state: "dispatched", outcome, sequence }), now);
  }

  /** Records a failed attempt (fenced); `false` when the claim was superseded. */
  markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean> {
    return this.#settle(
      storableMark({
        claim,
        state: "failed",
        error: failure?.error,
        nextAttemptAt: failure?.nextAttemptAt,
      }),
      failure?.now,
    );
  }

  /** Moves a claimed message to `dead` (fenced); `false` when the claim was superseded. */
  markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean> {
    return this.#settle(storableMark({ claim, state: "dead", error: dead?.error }), dead?.now);
  }

  /**
   * How many bytes of job outcome (UTF-8 bytes of its JSON text) a dispatched mark of this
   * claimed message can carry: the largest entry the bucket takes (the server's max_payload,
   * or the bucket's `max_msg_size` when lower, read at the first enqueue or claim) less the
   * message's record as the mark writes it and {@linkcode writeHeadersBytes} for the write's headers (see
   * {@linkcode OutboxRepository.outcomeRoomBytes}). A larger outcome is refused by
   * `markDispatched` / `markMany`, which store the message `dead`. Exact for a claim this
   * repository made (it remembers the record and its size, so a large payload is not encoded
   * again); for another one's, a bound a little below (the record's enqueue position is counted
   * as the largest), and the record is encoded once. `undefined` when neither limit is known
   * (nor checked). Enqueue keeps only 2 KiB of room, so a job whose
   * payload is near the limit has room for about 2 KiB of outcome.
   *
   * @example
   * ```ts ignore
   * import { connect } from "@nats-io/transport-node";
   * import { Kvm } from "@nats-io/kv";
   * import { createOutboxBucket, NatsKvOutboxRepository } from "@outbox/nats";
   *
   * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
   * const outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), "jobs_outbox"));
   * const [claimed] = await outbox.claimDue(1, new Date());
   * if (claimed) console.log(outbox.outcomeRoomBytes(claimed)); // about max_payload less the record
   * await outbox.close();
   * await nc.close();
   * ```
   */
  outcomeRoomBytes(message: OutboxMessage): number | undefined {
    const maxPayload = this.#entryLimit()?.bytes;
    if (maxPayload === undefined) return undefined;
    const cached = this.#claims.get(message.id);
    const own = cached !== undefined && cached.record.claimToken === message.claimToken &&
      cached.record.attempts === message.attempts;
    const record = own ? cached.record : claimedRecordOf(message);
    // The record as the mark writes it, with a one-byte outcome (`0`): its key is counted.
    const settle = (claimed: StoredOutboxRecord) =>
      applyMark(claimed, { claim: message, state: "dispatched", outcome: 0 }, record.updatedAt);
    let bytes: number;
    if (own && cached.bytes !== undefined && record.payload.length > 4_096) {
      // The payload is encoded alike in both records: only the rest is encoded again (a large
      // payload is not), the claim's write told the whole record's size.
      const light: StoredOutboxRecord = { ...record, payload: "" };
      bytes = cached.bytes - encodeJson(light).length + encodeJson(settle(light)).length;
    } else bytes = encodeJson(settle(record)).length;
    return Math.max(0, maxPayload - writeHeadersBytes - (bytes - 1));
  }

  /**
   * Settles many claims; one boolean per mark (see {@linkcode OutboxClaim} for the rules). The
   * marks of different ids are issued at once (one write each for claims made by this
   * repository, a read and a write otherwise), so a batch costs about one round trip, plus one
   * for the marker updates. Marks of the same id are settled one after the other in input
   * order, so the first decides and the later ones see its effect. Rejects if the KV reports an
   * error other than a lost race, after every mark has settled; calling it again with the same
   * marks then reports the ones that had applied as `true`. A dispatched mark whose outcome does
   * not fit settles its claim `dead` and makes it reject with `OutboxOutcomeRefusedError` (as
   * `markDispatched` does), again on every call with that mark; a `dead` mark of the claim
   * reports `true`.
   */
  async markMany(marks: readonly OutboxMark[], now: Date): Promise<boolean[]> {
    // Every sequence and outcome is checked, and every error text made storable, before any
    // mark applies.
    for (const mark of marks) {
      if (mark?.state === "dispatched") checkedSequence(mark.sequence);
      if (mark?.state === "failed") checkedDate(mark.nextAttemptAt, "nextAttemptAt");
    }
    const ready = marks.map(storableMark);
    const chains = new Map<string, number[]>();
    marks.forEach((mark, index) => {
      const key = typeof mark?.claim?.id === "string" ? mark.claim.id : `\u0000${index}`;
      const chain = chains.get(key);
      if (chain) chain.push(index);
      else chains.set(key, [index]);
    });
    const results = new Array<PromiseSettledResult<boolean>>(marks.length);
    await Promise.all([...chains.values()].map(async (chain) => {
      for (const index of chain) {
        try {
          results[index] = { status: "fulfilled", value: await this.#settle(ready[index], now) };
        } catch (reason) {
          results[index] = { status: "rejected", reason };
        }
      }
    }));
    const failed = results.find((result) => result.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    return results.map((result) => (result as PromiseFulfilledResult<boolean>).value);
  }

  /**
   * Deletes old `dispatched` (and `dead`) records in batches of `batchSize` concurrent deletes.
   * Scans the records once (admin cost: proportional to the bucket). A record that changed
   * since the scan (a requeue) is kept. On a `Bucket` from `@nats-io/kv` the entries are removed
   * without tombstones (and the marker tombstone with them), so a restarted claimer's watch
   * does not replay them; on other KV objects a delete tombstone stays. Never by a purge, which
   * makes running watches skip markers (see `rawRemover`).
   */
  async prune(options: OutboxPruneOptions): Promise<OutboxPruneResult> {
    const codec = await recordCodec();
    const batchSize = checkedBatchSize(options.batchSize);
    const result: OutboxPruneResult = { dispatched: 0, dead: 0 };
    const dispatchedBefore = options.dispatchedBefore?.toISOString();
    const deadBefore = options.deadBefore?.toISOString();
    if (dispatchedBefore === undefined && deadBefore === undefined) return result;
    // The index knows the keys' heads: a dead head blocks its key and stays until unblocked.
    if (deadBefore !== undefined) await this.#index.sync();
    const victims = { dispatched: [] as KvEntry[], dead: [] as KvEntry[] };
    await scanLatest(this.#kv, `${recordPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") return;
      const decoded = codec.decodeRecord(entry.value, decodeToken(tokenOf(entry.key)));
      if (!decoded.ok) {
        if (deadBefore !== undefined && entry.created.toISOString() < deadBefore) {
          victims.dead.push(entry);
        }
        return;
      }
      const { state, updatedAt } = decoded.record;
      if (
        state === "dispatched" && dispatchedBefore !== undefined && updatedAt < dispatchedBefore
      ) {
        victims.dispatched.push(entry);
      } else if (
        state === "dead" && deadBefore !== undefined && updatedAt < deadBefore &&
        (decoded.record.orderingKey === undefined || !this.#headsKey(decoded.record))
      ) {
        victims.dead.push(entry);
      }
    });
    const remove = rawRemover(this.#kv);
    for (const state of ["dispatched", "dead"] as const) {
      const entries = victims[state];
      for (let start = 0; start < entries.length; start += batchSize) {
        const batch = entries.slice(start, start + batchSize);
        if (options.dryRun) result[state] += batch.length;
        else {
          const removed = await mapInFlight(
            batch,
            removalsInFlight,
            (entry) => this.#remove(entry, remove),
          );
          result[state] += removed.filter(Boolean).length;
        }
        options.onProgress?.({ ...result });
      }
    }
    if (!options.dryRun && (remove !== undefined || dispatchedBefore !== undefined)) {
      await this.#sweepMarkers(dispatchedBefore, batchSize, remove);
    }
    return result;
  }

  /**
   * One scan of the markers' prefix (`q.>`: markers, key entries). With `cutoff`, retires the
   * entries of ordering keys idle since then: an entry that names no head (its
   * last message was settled and handed over to nobody) whose settle time (`KeyEntry.t`, else
   * the entry's write time: every join and hand-over rewrites it) is before `cutoff`. Each
   * removal is conditional on the revision the scan read (as the records' removals are): a join
   * that wrote the entry since keeps it; a join that lands after the removal finds a tombstone
   * (its compare-and-set on the old revision fails), reads again and creates the head. The key's
   * next message is then its first: no `keySequence` (published without the broker fence).
   *
   * The entry is deleted with a tombstone (a revision-checked KV delete), not removed outright:
   * every running claimer's watch sees the tombstone and forgets the key (removed without one,
   * the key stayed in the memory of every running index until it restarted: one state per key
   * ever used). With `remove`, every tombstone the scan finds (the previous prune's retirements;
   * a marker deleted after its record was pruned: a lost or late delete dropped by a claim) is
   * removed without one, exactly the revision the scan saw, so a new claimer's watch does not
   * replay them. Returns how many keys were retired.
   */
  async #sweepMarkers(
    cutoff: string | undefined,
    batchSize: number,
    remove: Remover | undefined,
  ): Promise<number> {
    const codec = await recordCodec();
    const idle: KvEntry[] = [];
    const tombstones: KvEntry[] = [];
    await scanLatest(this.#kv, `${markerPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") {
        if (remove) tombstones.push(entry);
        return;
      }
      if (cutoff === undefined || !isKeyEntryKey(entry.key)) return;
      const value = codec.decodeKeyEntry(entry.value);
      if (value === undefined || value.head !== undefined) return;
      if ((value.t ?? entry.created.toISOString()) < cutoff) idle.push(entry);
    });
    for (let start = 0; start < tombstones.length; start += batchSize) {
      await mapInFlight(
        tombstones.slice(start, start + batchSize),
        removalsInFlight,
        (entry) => remove!(entry.key, entry.revision),
      );
    }
    let retired = 0;
    for (let start = 0; start < idle.length; start += batchSize) {
      const done = await mapInFlight(
        idle.slice(start, start + batchSize),
        removalsInFlight,
        (entry) => removeIfUnchanged(this.#kv, undefined, entry.key, entry.revision),
      );
      retired += done.filter(Boolean).length;
    }
    return retired;
  }

  /**
   * Counts per state and the backlog at `now`. Scans the records (admin cost: proportional to
   * the bucket). Entries that cannot be decoded count as `dead`.
   */
  async stats(now: Date = new Date()): Promise<OutboxStats> {
    const codec = await recordCodec();
    const nowMs = now.getTime();
    const stats: OutboxStats = {
      pending: 0,
      claimed: 0,
      failed: 0,
      dispatched: 0,
      dead: 0,
      due: 0,
    };
    stats.blockedKeys = (await this.#blocked()).length; // syncs the index
    await scanLatest(this.#kv, `${recordPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") return;
      const decoded = codec.decodeRecord(entry.value, decodeToken(tokenOf(entry.key)));
      if (!decoded.ok) {
        stats.dead += 1;
        return;
      }
      const record = decoded.record;
      stats[record.state] += 1;
      if (record.state === "dispatched" || record.state === "dead") return;
      if (record.state !== "pending" && Date.parse(record.nextAttemptAt!) > nowMs) return;
      // A message waiting behind its key's head is not due.
      if (record.state === "pending" && !this.#headsKey(record)) return;
      stats.due += 1;
      if (stats.oldestDueCreatedAt === undefined || record.createdAt < stats.oldestDueCreatedAt) {
        stats.oldestDueCreatedAt = record.createdAt;
      }
    });
    if (stats.oldestDueCreatedAt !== undefined) {
      stats.oldestDueAgeMs = Math.max(0, nowMs - Date.parse(stats.oldestDueCreatedAt));
    }
    return stats;
  }

  /**
   * Lists `dead` messages, oldest first (enqueue order). Entries that cannot be decoded are
   * listed as best-effort `dead` messages (never a throw). Scans the records.
   */
  async listDead(options: OutboxListDeadOptions = {}): Promise<OutboxMessage[]> {
    const codec = await recordCodec();
    const limit = checkedLimit(options.limit ?? 100);
    if (limit === 0) return [];
    const dead: Claimed[] = [];
    await scanLatest(this.#kv, `${recordPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") return;
      const keyId = decodeToken(tokenOf(entry.key));
      const decoded = codec.decodeRecord(entry.value, keyId);
      if (decoded.ok) {
        if (decoded.record.state === "dead") {
          dead.push({
            order: decoded.record.seq ?? entry.revision,
            message: toMessage(decoded.record),
          });
        }
        return;
      }
      const rawId = (decoded.raw as { id?: unknown } | null)?.id;
      const id = keyId ?? (typeof rawId === "string" ? rawId : entry.key);
      dead.push({
        order: entry.revision,
        message: corruptMessage(decoded.raw, id, entry.created.toISOString(), decoded.error),
      });
    });
    return dead.sort((a, b) => a.order - b.order).slice(0, limit).map((item) => item.message);
  }

  /**
   * Lists blocked ordering keys (dead heads), longest blocked first; see
   * {@linkcode OutboxAdmin.blockedKeys}. Syncs the index, then reads the head record of each key
   * whose head has no marker (a dead head; few), so its cost grows with the blocked keys, not
   * with the bucket.
   */
  async blockedKeys(options: OutboxBlockedKeysOptions = {}): Promise<OutboxBlockedKey[]> {
    const limit = checkedLimit(options.limit ?? 100);
    if (limit === 0) return [];
    return (await this.#blocked()).slice(0, limit);
  }

  /**
   * Retries (requeues) or skips the dead head of a blocked key; `false` when the key is not
   * blocked. A skip hands the head over to the key's next message with a compare-and-set on the
   * key's entry, so of two concurrent skips one applies.
   */
  async unblockKey(key: string, options: OutboxUnblockKeyOptions): Promise<boolean> {
    const valid = validateOrderingKey(key, "key");
    const action = checkedUnblockAction(options);
    const now = options.now ?? new Date();
    checkedDate(now, "now");
    const entry = (await this.#readKey(valid)).value;
    const headId = entry?.head;
    if (headId === undefined) return false;
    const head = await this.#read(headId);
    if (!head?.ok || head.record.orderingKey !== valid) return false;
    if (head.record.state !== "dead") {
      // An earlier retry may have failed after the record was pending again and before its
      // marker was written: the key is no longer blocked, but without a marker no claim would
      // ever take its head. Retrying again finishes it (requeue of an active record).
      if (action === "retry" && head.record.state !== "dispatched") await this.requeue([headId]);
      return false;
    }
    if (settledBeforeHead(entry!, head.revision)) {
      // A skipped message back as head through a marker that outlived it: not blocked.
      await this.#handOver(valid, headId, undefined, { revision: head.revision, dead: true });
      return false;
    }
    if (action === "retry") return (await this.requeue([headId], now)) === 1;
    if (head.record.skipped) {
      // Skipped already, by a concurrent call (read after its record write, before its
      // hand-over) or by an earlier attempt whose reply was lost: that one applied. Finish its
      // hand-over (a no-op once done); this call changes nothing.
      await this.#handOver(valid, headId, null, undefined, now.toISOString());
      return false;
    }
    // The skip is written into the dead record first (a compare-and-set on the revision read
    // dead), and only then is the key handed over: a retry (requeue) that brings the record
    // back before that write makes the skip fail, and one after it finds the record skipped
    // and finishes the hand-over before the record is pending again. Without it, a hand-over
    // landing after a concurrent retry moved the head past a message a claim had just taken.
    const skipped: StoredOutboxRecord = { ...head.record, skipped: true };
    try {
      await this.#requests.update(
        await outboxRecordKey(headId),
        encodeJson(skipped),
        head.revision,
      );
    } catch (error) {
      if (isWrongLastSequence(error)) return false; // retried, or skipped by another call
      throw error;
    }
    await this.#handOver(valid, headId, null, undefined, now.toISOString());
    return true;
  }

  /**
   * Moves `dead` messages back to `pending` (attempts 0, `lastError` kept, enqueue order kept)
   * and re-indexes them; returns how many changed. Unknown ids, settled messages and entries
   * that cannot be decoded are ignored; an id that is already active only gets its marker back
   * if it lost it (so after a crash in the middle of a requeue, requeue the same ids again).
   */
  async requeue(ids: readonly string[], now: Date = new Date()): Promise<number> {
    const codec = await recordCodec();
    const nowIso = now.toISOString();
    const found = await Promise.all([...new Set(ids)].map(async (id) => {
      const key = await outboxRecordKey(id);
      const entry = await this.#requests.get(key);
      if (!entry || entry.operation !== "PUT") return undefined;
      const decoded = codec.decodeRecord(entry.value, id);
      if (!decoded.ok || decoded.record.state === "dispatched") return undefined;
      return { key, revision: entry.revision, record: decoded.record };
    }));
    // Messages of one key one after the other, oldest first (the oldest of a key without a head
    // becomes its head); everything else at once.
    const queues = new Map<string, Array<NonNullable<(typeof found)[number]>>>();
    const single: Array<NonNullable<(typeof found)[number]>> = [];
    for (const item of found) {
      if (!item) continue;
      const orderingKey = item.record.orderingKey;
      if (orderingKey === undefined) single.push(item);
      else queues.set(orderingKey, [...(queues.get(orderingKey) ?? []), item]);
    }
    const order = (item: { record: StoredOutboxRecord; revision: number }) =>
      item.record.seq ?? item.revision;
    const changed = await Promise.all([
      ...single.map((item) => this.#requeueOne(item.key, item.record, item.revision, nowIso)),
      ...[...queues.values()].map(async (queue) => {
        let sum = 0;
        for (const item of queue.sort((a, b) => order(a) - order(b))) {
          sum += await this.#requeueOne(item.key, item.record, item.revision, nowIso);
        }
        return sum;
      }),
    ]);
    return changed.reduce<number>((sum, n) => sum + n, 0);
  }

  /**
   * Requeues one dead record: pending, then its marker, then (keyed) it joins its key again: a
   * dead head is still its key's head (retry); a skipped message waits behind the current head,
   * or heads a key that has none. An active record only gets its marker and key back if lost.
   */
  async #requeueOne(
    key: string,
    record: StoredOutboxRecord,
    revision: number,
    nowIso: string,
  ): Promise<number> {
    if (record.state !== "dead") {
      // Already active (perhaps an earlier requeue crashed before writing the marker):
      // make sure it is indexed, so running requeue again is the way to recover.
      await this.#ensureMarker(key, record, revision);
      if (record.orderingKey !== undefined) await this.#joinKey(record.orderingKey, record.id);
      return 0;
    }
    // A skip of this message may not have handed its key over yet (a crash, or this requeue
    // runs inside it): finish it before the record is pending again, so the message comes back
    // behind the key's next message and is never claimable while another message heads its key.
    if (record.orderingKey !== undefined && record.skipped) {
      await this.#handOver(record.orderingKey, record.id, null);
    }
    // A dead head has forgotten its key's sequence (see OutboxMark): no claim can observe that
    // before a retry (here, first, so no requeued head is ever claimed with it) or a skip (its
    // hand-over drops it), so that is when the key entry is rewritten, not at every dead mark.
    if (record.orderingKey !== undefined) await this.#forgetSequence(record.orderingKey, record.id);
    const next: StoredOutboxRecord = {
      ...record,
      state: "pending",
      attempts: 0,
      updatedAt: nowIso,
    };
    delete next.nextAttemptAt;
    delete next.skipped;
    // A requeue ends every earlier claim: an older library version's claim (which copies the
    // record and writes no token) must not inherit the token of the claim before the requeue.
    delete next.claimToken;
    let written: number;
    try {
      written = await this.#requests.update(key, encodeJson(next), revision);
    } catch (error) {
      if (isWrongLastSequence(error)) return 0;
      throw error;
    }
    const marked = await this.#writeMarker(
      this.#markerWithCopy(next, { rev: written }),
      (value) => this.#requests.put(markerKeyOf(key), value),
    );
    if (next.orderingKey !== undefined) await this.#joinKey(next.orderingKey, next.id, marked);
    return 1;
  }

  /**
   * Calls `onWork` whenever a message becomes active (enqueued, requeued, or rescheduled after a
   * failure: then `dueAt` is set) in ANY process using the bucket, so a dispatcher can claim at
   * once instead of polling. The callback runs after this repository's index already holds the
   * message, so a `claimDue` started from it sees the message. Keep polling as a fallback (a
   * listener is not called for work that was already there when it was added, nor while the
   * watch is being rebuilt). Resolves, once the watch runs, to a function that removes the
   * listener.
   *
   * @example
   * ```ts ignore
   * import { Kvm } from "@nats-io/kv";
   * import { connect } from "@nats-io/transport-node";
   * import { createOutboxBucket, NatsKvOutboxRepository } from "@outbox/nats";
   *
   * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
   * const outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), "outbox"));
   * const unwatch = await outbox.watch((work) => {
   *   if (work.dueAt === undefined) console.log("claim now, new work:", work.id);
   * });
   * // ... later
   * await unwatch();
   * await outbox.close();
   * ```
   */
  async watch(onWork: NatsKvWorkListener): Promise<() => Promise<void>> {
    const listener = (work: ActiveWork) => onWork(work);
    this.#index.addListener(listener);
    try {
      await this.#index.ready();
    } catch (error) {
      this.#index.removeListener(listener);
      throw error;
    }
    return () => {
      this.#index.removeListener(listener);
      return Promise.resolve();
    };
  }

  /**
   * The repair scan, for after crashes or manual edits of the bucket: re-creates the marker of
   * every active record that lost it (a crash between the record write and the marker write)
   * and removes markers whose record is settled, corrupt or missing. Reads every record once
   * (admin cost); safe to run at any time, concurrently with claims.
   *
   * @example
   * ```ts ignore
   * import { Kvm } from "@nats-io/kv";
   * import { connect } from "@nats-io/transport-node";
   * import { createOutboxBucket, NatsKvOutboxRepository } from "@outbox/nats";
   *
   * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
   * const outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), "outbox"));
   * const { markersCreated, markersRemoved } = await outbox.repair();
   * await outbox.close();
   * ```
   */
  async repair(): Promise<NatsKvRepairResult> {
    const codec = await recordCodec();
    await this.#index.sync();
    const result: NatsKvRepairResult = { records: 0, markersCreated: 0, markersRemoved: 0 };
    const active = new Set<string>();
    const missing: Array<Promise<void>> = [];
    const headless = new Map<string, Array<{ order: number; id: string }>>();
    await scanLatest(this.#kv, `${recordPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") return;
      result.records += 1;
      const decoded = codec.decodeRecord(entry.value, decodeToken(tokenOf(entry.key)));
      if (!decoded.ok) return;
      const { state } = decoded.record;
      if (state === "dispatched" || state === "dead") return;
      const markerKey = markerKeyOf(entry.key);
      active.add(markerKey);
      const orderingKey = decoded.record.orderingKey;
      if (
        orderingKey !== undefined && this.#index.keyState(orderingKey)?.value.head === undefined
      ) {
        // An active keyed message whose key has no head (its join failed and was not retried).
        const order = this.#index.get(markerKey)?.order ?? decoded.record.seq ?? entry.revision;
        headless.set(orderingKey, [
          ...(headless.get(orderingKey) ?? []),
          { order, id: decoded.record.id },
        ]);
      }
      if (this.#index.get(markerKey)) return;
      missing.push(
        this.#ensureMarker(entry.key, decoded.record, entry.revision).then((created) => {
          if (created) result.markersCreated += 1;
        }),
      );
    });
    await Promise.all(missing);
    await Promise.all([...headless].map(async ([orderingKey, records]) => {
      records.sort((a, b) => a.order - b.order);
      for (const record of records) await this.#joinKey(orderingKey, record.id);
    }));
    await this.#blocked(); // hands over heads left behind by failed hand-overs
    const suspects = this.#index.entries().filter((entry) => !active.has(entry.markerKey));
    const removed = await Promise.all(suspects.map((entry) => this.#inspect(entry)));
    result.markersRemoved = removed.filter((outcome) => outcome === "dropped").length;
    return result;
  }

  /**
   * Waits for the deferred marker copies still being written (see
   * `NatsKvOutboxOptions.markerCopies`) and stops the watch this repository keeps on the bucket
   * (claims and `watch` start it). Call it before closing the NATS connection, once your enqueues
   * have returned: an `enqueue` still in flight starts its copy after `close()` looked, and if the
   * connection closes first that copy is not written (harmless: the claim reads the record).
   */
  async close(): Promise<void> {
    while (this.#copying.size > 0) await Promise.all(this.#copying);
    await this.#index.close();
  }

  /** The marker of `record`, stored at revision `extra.rev`, with its copy when it fits. */
  #markerWithCopy(record: StoredOutboxRecord, extra: Partial<Marker>): Marker {
    if (!this.#markerCopies) return markerOf(record, extra);
    return this.#withCopy(markerOf(record, extra), record, encodeJson(record).length);
  }

  /**
   * Writes `marker` with `write`; when the bucket refuses its size (its `max_msg_size` lowered
   * since it was read), again without its copy.
   */
  async #writeMarker(
    marker: Marker,
    write: (value: Uint8Array) => Promise<number>,
  ): Promise<number> {
    try {
      return await write(encodeJson(marker));
    } catch (error) {
      if (marker.r === undefined || !isTooLargeWrite(error)) throw error;
      const plain: Marker = { ...marker };
      delete plain.r;
      return await write(encodeJson(plain));
    }
  }

  /** Creates the marker of an active record unless one exists. */
  async #ensureMarker(key: string, record: StoredOutboxRecord, revision: number): Promise<boolean> {
    const marker = this.#markerWithCopy(record, { rev: revision });
    try {
      await this.#writeMarker(marker, (value) => this.#requests.create(markerKeyOf(key), value));
      return true;
    } catch (error) {
      if (isWrongLastSequence(error)) return false;
      throw error;
    }
  }

  async #read(
    id: string,
  ): Promise<
    { ok: true; record: StoredOutboxRecord; revision: number } | { ok: false } | undefined
  > {
    const codec = await recordCodec();
    const entry = await this.#requests.get(await outboxRecordKey(id));
    if (!entry || entry.operation !== "PUT") return undefined;
    const decoded = codec.decodeRecord(entry.value, id);
    return decoded.ok ? { ...decoded, revision: entry.revision } : { ok: false };
  }

  /**
   * The record as stored at enqueue, encoded. Throws `OutboxValidationError` (field `payload`)
   * when it would not leave {@linkcode updateHeadroomBytes} below the largest entry the bucket
   * takes (the server's max_payload, or the bucket's `max_msg_size` when lower): the
   * claim and the marks rewrite the record with more fields, and a record that can be stored but
   * never claimed would be stuck for good.
   */
  #prepare(record: OutboxRecord, now: Date): { stored: StoredOutboxRecord; bytes: Uint8Array } {
    const nowIso = now.toISOString();
    const stored: StoredOutboxRecord = {
      v: 1,
      ...record,
      headers: { ...record.headers },
      state: "pending",
      attempts: 0,
      createdAt: nowIso,
      updatedAt: nowIso,
    };
    const bytes = encodeJson(stored);
    const limit = this.#entryLimit();
    if (limit !== undefined && bytes.length + updateHeadroomBytes > limit.bytes) {
      throw new OutboxValidationError(
        "payload",
        `Outbox record '${record.id}' is ${bytes.length} bytes as a NATS KV entry; it must stay ${updateHeadroomBytes} bytes below the ${limit.name} (${limit.bytes}) so claims and marks can rewrite it`,
      );
    }
    return { stored, bytes };
  }

  /**
   * Writes a new record and its marker: together (`#storeTogether`), or with `markerCopies` the
   * record first and then its marker with a copy (`#storeThenMark`). No await before the writes
   * when the key is known: callers rely on the issue order.
   */
  async #store(
    record: OutboxRecord,
    prepared: { stored: StoredOutboxRecord; bytes: Uint8Array },
    knownKey?: string,
    contextHeaders?: Iterable<string>,
  ): Promise<Stored> {
    const codec = await recordCodec();
    // No await before the writes when the key is known: callers rely on the issue order.
    const key = knownKey ?? await outboxRecordKey(record.id);
    const write: StoreWrite = { ...prepared, codec, key, markerKey: markerKeyOf(key) };
    return await (this.#markerCopies
      ? this.#storeThenMark(record, write, contextHeaders)
      : this.#storeTogether(record, write, contextHeaders));
  }

  /**
   * `#store` with copies off (`markerCopies: false`): record and marker (without a copy) leave
   * together, in one flush.
   */
  async #storeTogether(
    record: OutboxRecord,
    { stored, bytes, codec, key, markerKey }: StoreWrite,
    contextHeaders?: Iterable<string>,
  ): Promise<Stored> {
    // No await before the writes (the caller's issue order).
    // Record and marker are written together (one round trip). The marker's revision is the
    // message's enqueue order. A marker whose record write failed is an orphan that claims
    // delete after `orphanGraceMs`.
    const marker = enqueueMarker(record);
    const [created, indexed] = await Promise.allSettled([
      this.#requests.create(key, bytes),
      this.#requests.create(markerKey, encodeJson(marker)),
    ]);
    if (created.status === "fulfilled") {
      if (indexed.status === "rejected" && !isWrongLastSequence(indexed.reason)) {
        // The record is stored but not indexed yet: without its marker no claim would find
        // it. Try again a few times; if the bucket still refuses, the error reaches the
        // caller, whose retried enqueue (same id) or repair() re-creates the marker.
        await this.#indexAgain(markerKey, marker);
      }
      const message = toMessage(stored);
      if (indexed.status !== "fulfilled") return { message };
      if (this.#deferredCopies && record.orderingKey === undefined) {
        this.#copyLater(markerKey, stored, bytes.length, created.value, indexed.value);
      }
      return { message, markerRevision: indexed.value };
    }
    if (!isWrongLastSequence(created.reason)) {
      const refused = errorNamed(created.reason, "InvalidArgumentError");
      if (refused && indexed.status === "fulfilled") {
        // nats.js refused the record write itself, so nothing was stored: take the marker back
        // instead of leaving an orphan for the grace. After any other failure (a timeout, say)
        // the record may have landed: keep the marker, which makes it claimable if it did and
        // is dropped as an orphan after orphanGraceMs if it did not.
        await this.#requests.delete(markerKey, { previousSeq: indexed.value }).catch(() => {});
      }
      // nats.js refused the write itself (above the server's max_payload, when the server's
      // limit was not known to #prepare).
      if (refused) throw refusedRecord(record, created.reason);
      throw created.reason;
    }
    // The id exists: identical content returns the stored message, other content throws.
    const { record: existing } = await this.#readExisting(record, key, created.reason, codec);
    const terminal = existing.state === "dispatched" || existing.state === "dead";
    if (terminal && indexed.status === "fulfilled") {
      // The marker written with the attempt points at a settled record: take it back.
      await this.#requests.delete(markerKey, { previousSeq: indexed.value }).catch(() => {});
    }
    assertOutboxIdentity(existing, record, contextHeaders);
    return { message: toMessage(existing) };
  }

  /**
   * `#store` with `markerCopies`: the record, then (once its revision is known) its marker with
   * a copy of it.
   */
  async #storeThenMark(
    record: OutboxRecord,
    { stored, bytes, codec, key, markerKey }: StoreWrite,
    contextHeaders?: Iterable<string>,
  ): Promise<Stored> {
    // No await before the record write (the caller's issue order).
    // The record first, then its marker with a copy of it and its revision (so the first claim
    // needs no read: see `Marker.r`). The marker's revision is the message's enqueue order (the
    // record writes are acknowledged in the order they were issued, so are the markers).
    let written: number;
    try {
      written = await this.#requests.create(key, bytes);
    } catch (error) {
      return await this.#storeFailed(record, key, error, codec, contextHeaders);
    }
    const plain = markerOf(stored);
    const marker = this.#withCopy(markerOf(stored, { rev: written }), stored, bytes.length);
    let markerRevision: number | undefined;
    try {
      markerRevision = await this.#requests.create(markerKey, encodeJson(marker));
    } catch (error) {
      // The record is stored but not indexed yet: without its marker no claim would find it.
      // Try again a few times (without the copy, in case its size was refused); if the bucket
      // still refuses, the error reaches the caller, whose retried enqueue (same id) or
      // repair() re-creates the marker.
      if (!isWrongLastSequence(error)) await this.#indexAgain(markerKey, plain);
    }
    const message = toMessage(stored);
    return markerRevision === undefined ? { message } : { message, markerRevision };
  }

  /** `#store` after its record write failed: the id exists, or the write was refused or lost. */
  async #storeFailed(
    record: OutboxRecord,
    key: string,
    error: unknown,
    codec: RecordCodec,
    contextHeaders: Iterable<string> | undefined,
  ): Promise<Stored> {
    const markerKey = markerKeyOf(key);
    if (!isWrongLastSequence(error)) {
      // nats.js refused the write itself (above the server's max_payload, when the server's
      // limit was not known to #prepare): nothing was stored.
      if (errorNamed(error, "InvalidArgumentError")) throw refusedRecord(record, error);
      // Any other failure (a timeout, say): the record may have landed. A marker (without a
      // copy: its revision is unknown) makes it claimable if it did, and is dropped as an orphan
      // after orphanGraceMs if it did not.
      await this.#requests.create(markerKey, encodeJson(enqueueMarker(record))).catch(() => {});
      throw error;
    }
    // The id exists: identical content returns the stored message, other content throws.
    const { record: existing, revision } = await this.#readExisting(record, key, error, codec);
    if (existing.state !== "dispatched" && existing.state !== "dead") {
      // An active record that lost its marker (a crash) is indexed again by a duplicate enqueue.
      await this.#ensureMarker(key, existing, revision).catch(() => {});
    }
    assertOutboxIdentity(existing, record, contextHeaders);
    return { message: toMessage(existing) };
  }

  /**
   * The record already stored under `key` (an enqueue's create found the id taken: `cause`),
   * or `OutboxStorageConflictError` when it is gone or cannot be decoded.
   */
  async #readExisting(
    record: OutboxRecord,
    key: string,
    cause: unknown,
    codec: RecordCodec,
  ): Promise<{ record: StoredOutboxRecord; revision: number }> {
    const entry = await this.#requests.get(key);
    if (!entry || entry.operation !== "PUT") {
      throw new OutboxStorageConflictError(record.id, { cause });
    }
    const decoded = codec.decodeRecord(entry.value, record.id);
    if (!decoded.ok) throw new OutboxStorageConflictError(record.id, { cause: decoded.error });
    return { record: decoded.record, revision: entry.revision };
  }

  /**
   * `marker` (with its `rev`) carrying a copy of `record` (`Marker.r`; `bytes`: its encoded
   * size) when the record is small and the marker fits the bucket's known entry limit; else
   * `marker` as is (claims then read the record). Callers decide whether markers get copies
   * (`#markerWithCopy`, `#storeThenMark`: `markerCopies: true`; `#copyLater`: `"deferred"`).
   */
  #withCopy(marker: Marker, record: StoredOutboxRecord, bytes: number): Marker {
    // Only once the bucket's own limit has been read (an enqueue or a claim reads it).
    const limit = this.#bucketMaxValue === undefined ? undefined : this.#entryLimit();
    if (marker.rev === undefined || bytes > maxCopyRecordBytes || limit === undefined) {
      return marker;
    }
    const copied: Marker = { ...marker, r: record };
    return encodeJson(copied).length + writeHeadersBytes <= limit.bytes ? copied : marker;
  }

  /**
   * A deferred copy (`markerCopies: "deferred"`): rewrites the marker this enqueue wrote (at
   * `markerRevision`) with a copy of the record it wrote (`record`, `bytes` long, at
   * `recordRevision`), by compare-and-set on the marker: when anything rewrote or deleted the
   * marker since (a failed mark, a requeue, a settle), nothing is written. The marker keeps its
   * enqueue order (`seq`: its first revision). Never fails: a marker left without its copy only
   * costs its claim a read. Tracked for `close()`.
   */
  #copyLater(
    markerKey: string,
    record: StoredOutboxRecord,
    bytes: number,
    recordRevision: number,
    markerRevision: number,
  ): void {
    const marker = this.#withCopy(
      markerOf(record, { rev: recordRevision, seq: markerRevision }),
      record,
      bytes,
    );
    if (marker.r === undefined) return;
    const writing = this.#requests.update(markerKey, encodeJson(marker), markerRevision).then(
      () => {},
      () => {},
    );
    this.#copying.add(writing);
    void writing.then(() => this.#copying.delete(writing));
  }

  /** Writes a missing marker, retrying with a short backoff (three more attempts). */
  async #indexAgain(markerKey: string, marker: Marker): Promise<void> {
    for (const delayMs of [0, 50, 250, 1_000]) {
      if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
      try {
        await this.#requests.create(markerKey, encodeJson(marker));
        return;
      } catch (error) {
        if (isWrongLastSequence(error)) return; // it exists
        if (delayMs === 1_000) throw error;
      }
    }
  }

  /** Claims one due record with a revision CAS; `undefined` when another writer won. */
  async #claimOne(
    entry: ActiveEntry,
    record: StoredOutboxRecord,
    revision: number,
    nowIso: string,
    leaseUntil: string,
    claimToken: string,
    copied?: true,
  ): Promise<Claimed | undefined | "stale"> {
    const next: StoredOutboxRecord = {
      ...record,
      state: "claimed",
      attempts: record.attempts + 1,
      updatedAt: nowIso,
      nextAttemptAt: leaseUntil,
      seq: record.seq ?? entry.order,
      claimToken,
    };
    const value = encodeJson(next);
    let written: number;
    try {
      written = await this.#requests.update(entry.recordKey, value, revision);
    } catch (error) {
      // Another claimer won; or, for a marker's copy, the record changed since (read it).
      if (isWrongLastSequence(error)) return copied ? "stale" : undefined;
      throw error;
    }
    this.#index.hint(entry.markerKey, Date.parse(leaseUntil), written);
    this.#remember(next, written, value.length);
    return { order: next.seq!, message: toMessage(next) };
  }

  /**
   * The record behind a marker as the marker's copy has it (`Marker.r`), without reading it:
   * only an active record that passes the record schema, at the revision the copy is of (the
   * claim's compare-and-set on it fails, and the claim reads the record, when it changed since).
   * `undefined` when there is no usable copy: the caller reads the record.
   */
  #copied(
    entry: ActiveEntry,
    codec: RecordCodec,
  ): Promise<{ record: StoredOutboxRecord; revision: number; copied: true }> | undefined {
    const copy = this.#index.copyOf(entry);
    if (copy === undefined) return undefined;
    const decoded = codec.checkRecord(copy.record, entry.id);
    if (!decoded.ok || decoded.record.state === "dispatched" || decoded.record.state === "dead") {
      this.#index.dropCopy(entry.markerKey);
      return undefined;
    }
    return Promise.resolve({ record: decoded.record, revision: copy.revision, copied: true });
  }

  /**
   * Reads the record behind a marker. Returns it when it is active; otherwise drops the
   * marker when it is useless (record settled, corrupt, or missing for longer than the grace
   * period) and says what happened.
   */
  async #inspect(
    entry: ActiveEntry,
  ): Promise<{ record: StoredOutboxRecord; revision: number } | "dropped" | "waiting"> {
    const codec = loadedRecordCodec() ?? await recordCodec();
    // The marker as seen before the read: the watch may rewrite this entry meanwhile (a
    // requeue's new marker), and only the marker observed here may be dropped.
    const observed = entry.markerRevision;
    const writtenMs = entry.markerWrittenMs;
    const got = await this.#requests.get(entry.recordKey);
    if (!got || got.operation !== "PUT") {
      // One clock: the marker's server timestamp against the server time the watch last showed.
      if (this.#index.serverTimeMs() - writtenMs < this.#orphanGraceMs) return "waiting";
      // No message behind it: a key it heads moves on first (the marker stays if that fails).
      if (!await this.#passOn(entry.key, entry.id)) return "waiting";
      await this.#dropMarker(entry.markerKey, observed);
      return "dropped";
    }
    const decoded = codec.decodeRecord(got.value, entry.id);
    if (!decoded.ok || decoded.record.state === "dispatched" || decoded.record.state === "dead") {
      // A corrupt record loses its marker: it is dead from now on (get/listDead/stats say so),
      // but never blocks its key. A dispatched head whose hand-over did not happen (a crash, a
      // failed write) hands over now; a dead head keeps its key (blocked).
      // A settled message that came back as head through a marker that outlived its
      // settlement (a crash or a failed delete after its hand-over) hands over too, keeping
      // the key's sequence.
      const key = decoded.ok ? decoded.record.orderingKey : entry.key;
      if (!decoded.ok) {
        if (!await this.#passOn(key, entry.id)) return "waiting";
      } else {
        const { state, sequence } = decoded.record;
        const settled = { revision: got.revision, dead: state === "dead" };
        if (!await this.#passOn(key, entry.id, sequence, settled)) return "waiting";
      }
      await this.#dropMarker(entry.markerKey, observed);
      return "dropped";
    }
    return { record: decoded.record, revision: got.revision };
  }

  /** Drops exactly the marker revision `observed`; a newer marker (a requeue's) stays. */
  async #dropMarker(markerKey: string, observed: number): Promise<void> {
    try {
      await this.#requests.delete(markerKey, { previousSeq: observed });
    } catch (error) {
      // Changed meanwhile (requeued, rescheduled): the newer marker stays, as it should. Any
      // other failure (a timeout): the index keeps it, so a later claim reads it and deletes it
      // again (forgotten here, a marker left in the bucket would stay for every other index:
      // a dead head they would not list as blocked).
      if (!isWrongLastSequence(error)) return;
    }
    this.#index.forget(markerKey, observed);
  }

  async #settle(mark: OutboxMark, now: Date): Promise<boolean> {
    const codec = loadedRecordCodec() ?? await recordCodec();
    if (typeof mark?.claim !== "object" || mark.claim === null) return false;
    const { claim } = mark;
    if (!(now instanceof Date) || !Number.isFinite(now.getTime())) {
      throw new OutboxValidationError("now", "now must be a valid Date");
    }
    if (
      mark.state === "failed" &&
      (!(mark.nextAttemptAt instanceof Date) || !Number.isFinite(mark.nextAttemptAt.getTime()))
    ) {
      throw new OutboxValidationError("nextAttemptAt", "nextAttemptAt must be a valid Date");
    }
    const key = await outboxRecordKey(claim.id);
    const cached = this.#claims.get(claim.id);
    let current = cached && verdictOf(cached.record, mark) === "apply" ? cached : undefined;
    // Set when the server refused the dispatched record's size after all (see below).
    let tooLarge: string | undefined;
    for (let attempt = 0; attempt < 3; attempt++) {
      if (!current) {
        const got = await this.#requests.get(key);
        if (!got || got.operation !== "PUT") return false;
        const decoded = codec.decodeRecord(got.value, claim.id);
        if (!decoded.ok) return false;
        const verdict = verdictOf(decoded.record, mark);
        if (verdict === "superseded" && refusedOutcome(decoded.record, mark)) {
          // This claim's dispatched mark was refused for its outcome (a retry): say so again.
          throw new OutboxOutcomeRefusedError(claim.id, decoded.record.lastError!);
        }
        if (
          verdict === "applied" && mark.state === "dispatched" &&
          decoded.record.orderingKey !== undefined
        ) {
          // A retried mark whose first attempt applied (its reply lost): finish its hand-over.
          await this.#release(key, decoded.record, got.revision);
        }
        if (verdict !== "apply") return verdict === "applied";
        current = { record: decoded.record, revision: got.revision };
      }
      let next = applyMark(current.record, mark, now.toISOString());
      let value = encodeJson(next);
      const refusal = mark.state === "dispatched" && mark.outcome !== undefined
        ? tooLarge ?? this.#outcomeRefusal(next, value.length)
        : undefined;
      if (refusal !== undefined) {
        // A record over max_payload can never be written: were the claim left claimed, its
        // job would run again after every lease. It goes dead instead, as the dispatcher sends
        // a job whose outcome no store can keep.
        next = applyMark(current.record, { claim, state: "dead", error: refusal }, next.updatedAt);
        value = encodeJson(next);
      }
      let revision: number;
      try {
        revision = await this.#requests.update(key, value, current.revision);
      } catch (error) {
        if (
          refusal === undefined && mark.state === "dispatched" && mark.outcome !== undefined &&
          isTooLargeWrite(error)
        ) {
          // The server refused the record's size although the known limit has room for it (the
          // bucket's max_msg_size was lowered after it was read, or no limit is known): the same loop
          // as above, so it goes dead the same way, on the same revision (not a lost race).
          tooLarge = this.#outcomeRefusedBy(next, value.length, error);
          attempt -= 1;
          continue;
        }
        if (!isWrongLastSequence(error)) throw error;
        current = undefined; // someone else wrote it: read again and re-check the fence
        continue;
      }
      this.#claims.delete(claim.id);
      if (next.state === "dispatched") await this.#release(key, next, revision);
      else await this.#afterMark(key, next, revision);
      if (refusal !== undefined) throw new OutboxOutcomeRefusedError(claim.id, next.lastError!);
      return true;
    }
    return false;
  }

  /**
   * The `lastError` of a dispatched record (`bytes` long once encoded) that the bucket's entry
   * limit cannot take with its outcome, or `undefined` when it fits (or the limit is not
   * known).
   */
  #outcomeRefusal(next: StoredOutboxRecord, bytes: number): string | undefined {
    const limit = this.#entryLimit();
    if (limit === undefined || bytes + writeHeadersBytes <= limit.bytes) return undefined;
    const outcomeBytes = new TextEncoder().encode(JSON.stringify(next.outcome)).length;
    const room = Math.max(0, limit.bytes - writeHeadersBytes - (bytes - outcomeBytes));
    return `${outcomeRefusedPrefix}Outbox outcome is ${outcomeBytes} bytes of JSON, more than the ${room} bytes its NATS KV record has room for below the ${limit.name} (${limit.bytes})`;
  }

  /**
   * The largest entry this bucket takes: the server's max_payload, or the bucket's own
   * `max_msg_size` (its `maxValueSize`) when that is lower and has been read, with its name for
   * error texts; `undefined` when neither is known.
   */
  #entryLimit(): { bytes: number; name: string } | undefined {
    const maxPayload = serverMaxPayload(this.#kv);
    const bucket = this.#bucketMaxValue || undefined;
    if (bucket !== undefined && (maxPayload === undefined || bucket < maxPayload)) {
      return { bytes: bucket, name: "bucket's max_msg_size" };
    }
    return maxPayload === undefined
      ? undefined
      : { bytes: maxPayload, name: "server's max_payload" };
  }

  /**
   * Reads the bucket's `max_msg_size` once (enqueues wait for it, so a record the bucket could
   * store but no claim or mark could rewrite is refused up front; claims start it). When the
   * read fails (no permission for the stream's info) or the KV object has no `status()`, the
   * server's max_payload alone counts: enqueues do not wait on a read that keeps failing.
   */
  #readBucketMaxValue(): Promise<void> {
    this.#bucketMaxValueRead ??= (async () => {
      try {
        const status = typeof this.#kv.status === "function" ? await this.#kv.status() : undefined;
        const max = status?.maxValueSize;
        this.#bucketMaxValue = typeof max === "number" && max > 0 ? max : 0;
      } catch {
        this.#bucketMaxValue = 0;
      }
    })();
    return this.#bucketMaxValueRead;
  }

  /**
   * The `lastError` of a dispatched record (`bytes` long once encoded) whose write the server
   * refused as too large (`error`).
   */
  #outcomeRefusedBy(next: StoredOutboxRecord, bytes: number, error: unknown): string {
    const outcomeBytes = new TextEncoder().encode(JSON.stringify(next.outcome)).length;
    return `${outcomeRefusedPrefix}Outbox outcome is ${outcomeBytes} bytes of JSON; its NATS KV record (${bytes} bytes) was refused as too large: ${
      errorMessage(error)
    }`;
  }

  /** Keeps the marker in step with a settled record (best effort: claims heal the rest). */
  async #afterMark(key: string, record: StoredOutboxRecord, revision: number): Promise<void> {
    const markerKey = markerKeyOf(key);
    try {
      if (record.state === "failed") {
        const marker = this.#markerWithCopy(record, { due: record.nextAttemptAt, rev: revision });
        this.#index.hint(markerKey, Date.parse(record.nextAttemptAt!), revision);
        const written = await this.#writeMarker(
          marker,
          (value) => this.#requests.put(markerKey, value),
        );
        this.#index.wroteMarker(markerKey, written);
      } else if (record.state === "dispatched") {
        // Dispatched is final: nothing can revive the marker, so it is deleted unconditionally,
        // and without waiting for the acknowledgement (one reply less per message). A delete
        // that is lost leaves a marker whose record is dispatched, which the next claim that
        // reads it drops (after handing its key over, if it still heads one), as after a crash.
        // A peer whose index still holds the marker (the delete late or lost) may name the
        // message its key's head; once no index holds the marker (this one forgets it now), the
        // claims that run out of due messages read that head's record and hand over (#repairKeys).
        this.#index.forget(markerKey);
        await this.#requests.deleteUnconfirmed(markerKey);
      } else {
        // dead can be requeued, and a requeue right after this write puts a new marker that
        // describes a newer record revision (`rev`): delete only a marker from before this
        // write, exactly the revision read here (never the in-process index's idea of it).
        const codec = await recordCodec();
        const entry = await this.#requests.get(markerKey);
        if (entry?.operation !== "PUT") return;
        const marker = codec.decodeMarker(entry.value);
        if (marker?.rev !== undefined && marker.rev > revision) return;
        // Forgotten only once deleted: after a failed delete the marker stays in the bucket, and
        // in this index too (due now), so the next claim here reads it and deletes it again (see
        // `#dropMarker`).
        this.#index.hint(markerKey, -Infinity, revision);
        await this.#requests.delete(markerKey, { previousSeq: entry.revision });
        this.#index.forget(markerKey, entry.revision);
      }
    } catch {
      // The record is settled; a stale marker is removed by the next claim that reads it.
    }
  }

  async #remove(entry: KvEntry, remove: Remover | undefined): Promise<boolean> {
    if (!await removeIfUnchanged(this.#kv, remove, entry.key, entry.revision)) return false;
    if (remove) {
      // The settled record's marker tombstone goes too, keeping the watch's snapshot small.
      const markerKey = markerKeyOf(entry.key);
      const marker = await this.#requests.get(markerKey);
      if (marker && marker.operation !== "PUT") await remove(markerKey, marker.revision);
    }
    return true;
  }

  /**
   * After a dispatched mark: hands the message's key over (when it has one), then removes the
   * marker. When the hand-over fails the marker stays (and is due now), so the next claim that
   * reads it finds the record dispatched and hands over.
   */
  async #release(recordKey: string, record: StoredOutboxRecord, revision: number): Promise<void> {
    if (record.orderingKey !== undefined) {
      try {
        await this.#handOver(
          record.orderingKey,
          record.id,
          record.sequence,
          { revision },
          record.updatedAt,
        );
      } catch {
        // The write may have applied with its reply lost: the key entry says.
        const handedOver = await this.#readKey(record.orderingKey).then(
          (state) => state.value?.head !== record.id,
          () => false,
        );
        if (!handedOver) {
          this.#index.hint(markerKeyOf(recordKey), -Infinity, revision);
          return;
        }
      }
    }
    await this.#afterMark(recordKey, record, revision);
  }

  /**
   * Hands `key` over from `id` if `id` heads it (with the dispatched mark's `sequence`, if any);
   * `false` when that failed (retry later).
   */
  async #passOn(
    key: string | undefined,
    id: string | undefined,
    sequence?: number,
    settled?: Settled,
  ): Promise<boolean> {
    if (key === undefined || id === undefined) return true;
    try {
      await this.#handOver(key, id, sequence, settled);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Claims a due record; a keyed one only while it heads its key. The key's entry is taken
   * from the index when the index has seen past the record's revision (the common case: free),
   * else read after the record: either way it reflects the key as of after the record read, so
   * the claim's compare-and-set on the record succeeds only while the record still heads its
   * key (a head changes only when its record is settled, which moves the record's revision).
   */
  async #claimHead(
    entry: ActiveEntry,
    record: StoredOutboxRecord,
    revision: number,
    nowIso: string,
    leaseUntil: string,
    claimToken: string,
    copied?: true,
  ): Promise<Claimed | undefined | "stale"> {
    if (record.orderingKey === undefined) {
      return await this.#claimOne(entry, record, revision, nowIso, leaseUntil, claimToken, copied);
    }
    const state = this.#index.revision() > revision
      ? this.#index.keyState(record.orderingKey)
      : await this.#readKey(record.orderingKey);
    if (state?.value?.head !== record.id) return undefined;
    const claimed = await this.#claimOne(
      entry,
      record,
      revision,
      nowIso,
      leaseUntil,
      claimToken,
      copied,
    );
    // The key's sequence as of the entry that names this head: it changes only when the head
    // is settled, which this claim's write just fenced.
    if (typeof claimed === "object" && state.value.seq !== undefined) {
      claimed.message.keySequence = state.value.seq;
    }
    return claimed;
  }

  /**
   * Every blocked key, longest blocked first, as of a sync of the index: keys whose head has no
   * marker and whose head record is `dead`. A head left behind by a failed hand-over (its record
   * dispatched, corrupt or gone) is handed over on the way.
   */
  async #blocked(): Promise<OutboxBlockedKey[]> {
    await this.#index.sync();
    const found = await Promise.all(
      this.#index.unmarkedHeads().map((state) => this.#checkUnmarkedHead(state)),
    );
    return found.filter((item): item is OutboxBlockedKey => typeof item === "object")
      .sort((a, b) => a.since < b.since ? -1 : a.since > b.since ? 1 : a.key < b.key ? -1 : 1);
  }

  /**
   * Reads the record of a key's head that has no marker in the index (see
   * `ActiveIndex.unmarkedHeads`) and acts on it: a settled head that is not blocking its key on
   * purpose (dispatched, corrupt, gone, or settled before a hand-over named it through a marker
   * that outlived its settlement) hands the key over, as any stale head does; an active head
   * gets its marker back, so claims take it. Resolves to the blocked key when the head is dead
   * (it keeps blocking), `"quiet"` when there is nothing to do until the key entry changes, and
   * `undefined` when it acted (or failed to: a later call tries again).
   */
  async #checkUnmarkedHead(state: KeyState): Promise<OutboxBlockedKey | "quiet" | undefined> {
    const key = state.value.key;
    const headId = state.value.head!;
    const read = await this.#read(headId);
    if (
      read?.ok && (read.record.state === "dead" || read.record.state === "dispatched") &&
      settledBeforeHead(state.value, read.revision)
    ) {
      // Came back as head through a marker that outlived its settlement: not blocked.
      const settled = { revision: read.revision, dead: read.record.state === "dead" };
      await this.#passOn(key, headId, read.record.sequence, settled);
      return undefined;
    }
    if (
      read?.ok && read.record.orderingKey === key &&
      (read.record.state === "pending" || read.record.state === "failed" ||
        read.record.state === "claimed")
    ) {
      // An active head without a marker (a requeue or retry that failed before its marker
      // write): no claim would take it, and every message of its key would wait behind it.
      await this.#ensureMarker(await outboxRecordKey(headId), read.record, read.revision);
      return undefined;
    }
    if (read?.ok && read.record.state === "dead" && read.record.orderingKey === key) {
      const item: OutboxBlockedKey = {
        key,
        headId,
        since: read.record.updatedAt,
        waiting: this.#index.keyEntries(key).length,
      };
      if (read.record.lastError !== undefined) item.lastError = read.record.lastError;
      return item;
    }
    if (!read?.ok || read.record.state === "dispatched") {
      await this.#passOn(key, headId, read?.ok ? read.record.sequence : undefined);
      return undefined;
    }
    return "quiet"; // a record of another key: nothing this store can tell
  }

  /**
   * Run by a claim that found less than it wanted (every due message taken), after its sync,
   * and at most once per {@linkcode busyRepairMs} by a claim that filled its limit (a backlog):
   * keys with messages but no head are joined (see `#joinStranded`), and keys whose head has no
   * marker here are looked at (see `#checkUnmarkedHead`): a settled head named by a hand-over
   * whose marker delete reached this process only afterwards (or was lost) would otherwise stop
   * its key for good, since no claim reads a head without a marker. A dead head (blocked on
   * purpose) is read once per key entry revision, and again `orphanGraceMs` after (a retry that
   * made it pending and then failed or died before its marker write changes only the record,
   * which nothing here watches), so idle polls stay nearly free. Failures are left to the next
   * claim.
   */
  async #repairKeys(): Promise<void> {
    const unmarked = this.#index.unmarkedHeads(true);
    const quiet = new Map<string, Quiet>();
    const checks: Array<Promise<void>> = [];
    for (const state of unmarked) {
      const key = state.value.key;
      const known = this.#quietHeads.get(key);
      if (
        known?.revision === state.revision && Date.now() - known.atMs < this.#orphanGraceMs
      ) {
        quiet.set(key, known);
        continue;
      }
      checks.push(
        this.#checkUnmarkedHead(state).then((outcome) => {
          if (outcome !== undefined) {
            quiet.set(key, { revision: state.revision, atMs: Date.now() });
          }
        }, () => {}),
      );
    }
    await Promise.all([this.#joinStranded(), ...checks]);
    // Only keys still without a marked head are remembered: the cache stays as small as they.
    this.#quietHeads = quiet;
  }

  /**
   * Joins the oldest message of each key that has messages but no head, once its marker is
   * older than `orphanGraceMs` (server clock): a keyed enqueue that crashed or threw between its
   * marker write and its join, and was not retried, would otherwise wait until `repair()` (or be
   * overtaken by the key's next enqueue). Its record is read first: a marker that outlived a
   * settled record is dropped. Costs nothing while every key with messages has a head. Failures
   * are left to the next claim.
   */
  async #joinStranded(): Promise<void> {
    const stranded = this.#index.headless().filter((entry) =>
      entry.id !== undefined && entry.key !== undefined &&
      this.#index.serverTimeMs() - entry.markerWrittenMs >= this.#orphanGraceMs
    );
    await Promise.all(
      stranded.map(async (entry) => {
        // A marker that outlived its settled (or missing) record is dropped instead.
        const read = await this.#inspect(entry);
        if (typeof read === "object") await this.#joinKey(entry.key!, entry.id!);
      }).map((joined) => joined.catch(() => {})),
    );
  }

  /** Whether the index (synced by the caller) knows `record` as its key's head. */
  #headsKey(record: StoredOutboxRecord): boolean {
    return record.orderingKey === undefined ||
      this.#index.keyState(record.orderingKey)?.value.head === record.id;
  }

  /** Joins a stored message to its key when it is keyed and still unsettled. */
  async #joinIfActive({ message, markerRevision }: Stored): Promise<void> {
    if (message.orderingKey === undefined) return;
    if (message.state === "dispatched" || message.state === "dead") return;
    await this.#joinKey(message.orderingKey, message.id, markerRevision);
  }

  /**
   * Joins message `id` (stored and indexed) to its key: it becomes the key's head when the key
   * has none (a create or compare-and-set of the key entry), else the entry is rewritten as is
   * (a "touch"), so a hand-over that read the entry before cannot leave the key without a head
   * while this message waits: its compare-and-set fails, and it reads again and sees the
   * message. Idempotent: a retry after a lost reply finds itself head, or touches again.
   *
   * A join that lands late (its process paused after writing the marker, `markerRevision`) may
   * find its message already claimed, settled and handed over by others, the key without a
   * head: it must not name that settled message head again (its marker is gone, so no claim
   * would read it, and every later message of the key would wait behind it). So before it
   * creates a head over an entry written after the message's marker (or when that revision is
   * unknown), it reads the record and joins only if the message is still unsettled.
   */
  async #joinKey(key: string, id: string, markerRevision?: number): Promise<void> {
    let state = await this.#knownKey(key);
    let fresh = false;
    for (let round = 1;; round++) {
      if (state.value?.head === id) {
        // Trusted only as read now: an index behind the bucket may still name a message that
        // was skipped since (and is being requeued behind the key's new head).
        if (fresh) return;
        state = await this.#readKey(key);
        fresh = true;
        if (state.value?.head === id) return;
      }
      const value: KeyEntry = state.value?.head !== undefined
        ? state.value
        : { v: 1, key, head: id, ...pick(state.value?.seq) };
      // With no entry known (revision 0), the key may have been retired since the marker (prune
      // deletes an idle key's entry with a tombstone, which an index forgets and a create writes
      // over, and later removes it): the message may have been settled by others meanwhile. An
      // index that never ran (a producer that does not claim) cannot tell either. So the record
      // is read before the key's first head is created: one read per key that starts.
      if (
        value.head === id &&
        (state.revision === 0 || markerRevision === undefined || state.revision > markerRevision)
      ) {
        const read = await this.#read(id);
        if (!read?.ok || read.record.state === "dispatched" || read.record.state === "dead") return;
      }
      try {
        await this.#writeKey(state, value);
        return;
      } catch (error) {
        if (!isWrongLastSequence(error)) throw error;
      }
      await contention(key, round);
      state = await this.#readKey(key);
      fresh = true;
    }
  }

  /**
   * Hands `key` over from its head `from` (settled as dispatched, skipped, or gone) to the
   * key's next message in enqueue order, the oldest of the key's markers in the index once the
   * index has caught up with the key entry it read (every message that joined the key before
   * that entry's revision has its marker in the index by then); with no next message the key
   * keeps an entry without a head. A compare-and-set on the key entry: of two hand-overs only
   * one moves the head, and a concurrent join makes it read again. Resolves `true` when this
   * call moved the head, `false` when `from` was not (or no longer) the head.
   *
   * The entry keeps the revision the hand-over read (`at`): a message settled before it was
   * named head (a settled message whose marker outlived its settlement, picked as next) has a
   * record revision below `at`. `settled` (the revision at which the caller read `from`'s
   * record settled) tells such a head: its hand-over keeps the key's sequence (its own is
   * older), and a dead one is handed over too instead of blocking the key (with `dead`, only
   * such a dead head is handed over: a head that died as head keeps its key).
   */
  async #handOver(
    key: string,
    from: string,
    sequence?: number | null,
    settled?: Settled,
    settledAt?: string,
  ): Promise<boolean> {
    let state = await this.#knownKey(key);
    let fresh = false;
    for (let round = 1;; round++) {
      if (state.value?.head !== from) {
        if (fresh) return false;
        state = await this.#readKey(key);
        fresh = true;
        if (state.value?.head !== from) return false;
      }
      const stale = settled !== undefined && settledBeforeHead(state.value, settled.revision);
      if (settled?.dead && !stale) return false;
      await this.#index.caughtUp(state.revision);
      const next = this.#index.nextOf(key, from);
      const value: KeyEntry = { v: 1, key };
      // A sequence given replaces the key's; `null` forgets it (a skipped dead head's).
      const seq = sequence === undefined || stale ? state.value.seq : sequence ?? undefined;
      if (seq !== undefined) value.seq = seq;
      if (next?.id !== undefined) {
        value.head = next.id;
        value.at = state.revision;
      } else value.t = settledAt ?? new Date().toISOString();
      try {
        await this.#requests.update(state.entryKey, encodeJson(value), state.revision);
        return true;
      } catch (error) {
        if (!isWrongLastSequence(error)) throw error;
      }
      await contention(key, round);
      state = await this.#readKey(key);
      fresh = true;
    }
  }

  /** Drops the key's sequence while `headId` (a dead message) heads the key. */
  async #forgetSequence(key: string, headId: string): Promise<void> {
    let state = await this.#knownKey(key);
    for (let round = 1;; round++) {
      if (state.value?.head !== headId && round === 1) state = await this.#readKey(key);
      if (state.value?.head !== headId || state.value.seq === undefined) return;
      const value: KeyEntry = { ...state.value };
      delete value.seq;
      try {
        await this.#requests.update(state.entryKey, encodeJson(value), state.revision);
        return;
      } catch (error) {
        if (!isWrongLastSequence(error)) throw error;
      }
      await contention(key, round);
      state = await this.#readKey(key);
    }
  }

  /** The key's entry as the index knows it (revision 0 when it knows none). */
  async #knownKey(key: string): Promise<KeyRead> {
    return this.#index.keyState(key) ?? { entryKey: await keyEntryKey(key), revision: 0 };
  }

  /** The key's entry as stored now (revision 0: none; `value` absent: deleted or damaged). */
  async #readKey(key: string): Promise<KeyRead> {
    const codec = await recordCodec();
    const entryKey = await keyEntryKey(key);
    const got = await this.#requests.get(entryKey);
    if (!got) return { entryKey, revision: 0 };
    const value = got.operation === "PUT" ? codec.decodeKeyEntry(got.value) : undefined;
    return { entryKey, revision: got.revision, value: value?.key === key ? value : undefined };
  }

  /** Writes a key entry over exactly `state` (a create when there is none). */
  async #writeKey(state: KeyRead, value: KeyEntry): Promise<number> {
    return state.revision === 0
      ? await this.#requests.create(state.entryKey, encodeJson(value))
      : await this.#requests.update(state.entryKey, encodeJson(value), state.revision);
  }

  #remember(record: StoredOutboxRecord, revision: number, bytes?: number): void {
    if (this.#claimCacheSize === 0) return;
    this.#claims.delete(record.id);
    this.#claims.set(record.id, { record, revision, bytes });
    if (this.#claims.size > this.#claimCacheSize) {
      this.#claims.delete(this.#claims.keys().next().value!);
    }
  }
}

/**
 * Room a record must leave below the server's max_payload at enqueue: what a claim adds (state,
 * attempts, lease, seq) and a `lastError` of up to {@linkcode maxLastErrorBytes}.
 */
const updateHeadroomBytes = 2_048;
/** Longest `lastError` a record keeps, in bytes of its JSON encoding (longer ones are cut). */
const maxLastErrorBytes = 1_024;
/**
 * Room a record write keeps below the server's max_payload for its headers (nats.js counts
 * them: the compare-and-set's `Nats-Expected-Last-Subject-Sequence: <n>` is about 70 bytes).
 */
const writeHeadersBytes = 128;
/** How the `lastError` of a job whose outcome was refused starts (the dispatcher's text too). */
const outcomeRefusedPrefix = "outcome: the job's outcome cannot be stored: ";

/**
 * Whether `record` is dead because a dispatched mark of the claim `mark` names was refused for
 * its outcome (see `#outcomeRefusal`), and `mark` is a dispatched mark of that claim.
 */
function refusedOutcome(record: StoredOutboxRecord, mark: OutboxMark): boolean {
  return mark.state === "dispatched" && record.state === "dead" &&
    mark.claim.claimToken !== undefined && record.claimToken === mark.claim.claimToken &&
    record.attempts === mark.claim.attempts &&
    record.lastError?.startsWith(outcomeRefusedPrefix) === true;
}

/**
 * The claimed record behind a message, as far as the message tells: its enqueue position
 * (`seq`, not in a message) counted as the largest, so its size is a bound from above.
 */
function claimedRecordOf(message: OutboxMessage): StoredOutboxRecord {
  const record: StoredOutboxRecord = {
    v: 1,
    id: message.id,
    kind: message.kind,
    name: message.name,
    subject: message.subject,
    payload: message.payload,
    headers: { ...message.headers },
    state: message.state,
    attempts: message.attempts,
    createdAt: message.createdAt,
    updatedAt: message.updatedAt,
    seq: Number.MAX_SAFE_INTEGER,
  };
  if (message.nextAttemptAt !== undefined) record.nextAttemptAt = message.nextAttemptAt;
  if (message.lastError !== undefined) record.lastError = message.lastError;
  if (message.claimToken !== undefined) record.claimToken = message.claimToken;
  if (message.orderingKey !== undefined) record.orderingKey = message.orderingKey;
  return record;
}

/** `error` cut to at most {@linkcode maxLastErrorBytes} once JSON-encoded. */
function boundedError(error: string): string {
  const text = storableErrorText(error);
  if (jsonBytes(text) <= maxLastErrorBytes) return text;
  let low = 0;
  let high = text.length;
  while (low < high) {
    const mid = (low + high + 1) >>> 1;
    if (jsonBytes(text.slice(0, mid) + "…") <= maxLastErrorBytes) low = mid;
    else high = mid - 1;
  }
  // Never end on half a surrogate pair.
  const cut = text.slice(0, low).replace(/[\ud800-\udbff]$/, "");
  return cut + "…";
}

function jsonBytes(text: string): number {
  return new TextEncoder().encode(JSON.stringify(text)).length;
}

/** The max_payload of the server the bucket's connection is on, when the KV object tells. */
function serverMaxPayload(kv: KV): number | undefined {
  const max = (kv as { js?: { nc?: { info?: { max_payload?: unknown } } } }).js?.nc?.info
    ?.max_payload;
  return typeof max === "number" && max > 0 ? max : undefined;
}

function errorNamed(error: unknown, name: string): boolean {
  for (let current = error, depth = 0; current && depth < 5; depth++) {
    if (typeof current !== "object") return false;
    if ((current as { name?: unknown }).name === name) return true;
    current = (current as { cause?: unknown }).cause;
  }
  return false;
}

/** Compare-and-set rounds on one key entry before a join or hand-over gives up. */
const maxKeyRounds = 64;

/**
 * After a lost compare-and-set on a key entry: gives up after {@linkcode maxKeyRounds}, else
 * waits a little (random, growing) from the third round on, so busy writers spread out.
 */
async function contention(key: string, round: number): Promise<void> {
  if (round >= maxKeyRounds) throw new NatsKvOrderingKeyError(key, round);
  if (round < 3) return;
  await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(100, 5 * round)));
}

/**
 * The marker an enqueue writes with its record, before the record's revision is known: no copy,
 * no revision (claims read the record).
 */
function enqueueMarker(record: OutboxRecord): Marker {
  const marker: Marker = { v: 1, id: record.id };
  if (record.orderingKey !== undefined) marker.key = record.orderingKey;
  return marker;
}

/** The error for a record nats.js refused to send (larger than the server's max_payload). */
function refusedRecord(record: OutboxRecord, cause: unknown): OutboxValidationError {
  return new OutboxValidationError(
    "payload",
    `Outbox record '${record.id}' cannot be stored in the NATS KV bucket: ${errorMessage(cause)}`,
    { cause },
  );
}

/** A key whose unmarked head needs nothing done, as last read (see `#repairKeys`). */
interface Quiet {
  /** The key entry revision it was read at. */
  revision: number;
  /** When (this process's clock, epoch ms). */
  atMs: number;
}

/**
 * Largest record (encoded) a marker carries a copy of (`Marker.r`): a larger one is read by its
 * claim, whose read then costs little beside the record's size.
 */
const maxCopyRecordBytes = 8_192;

/**
 * How often (at most) a claim that filled its limit looks at the keys whose head has no marker
 * and the keys with messages but no head, as a claim that runs out of due messages always does.
 */
const busyRepairMs = 1_000;

/** Most records a claim reads in one round when its index hints turn out stale. */
const maxReadAhead = 512;

function verdictOf(record: StoredOutboxRecord, mark: OutboxMark): FenceVerdict {
  return fenceVerdict(record, mark.claim, mark.state);
}

function applyMark(
  record: StoredOutboxRecord,
  mark: OutboxMark,
  nowIso: string,
): StoredOutboxRecord {
  // Fields a mark drops are left out by destructuring, not `delete`d: a delete turns the object
  // into a dictionary, which JSON.stringify (the write that follows) serialises ~2.5x slower.
  // The key order, and so the JSON, is the same.
  switch (mark.state) {
    case "dispatched": {
      const { nextAttemptAt: _due, lastError: _error, ...kept } = record;
      const next: StoredOutboxRecord = { ...kept, state: mark.state, updatedAt: nowIso };
      if (mark.outcome !== undefined) next.outcome = structuredClone(mark.outcome);
      if (mark.sequence !== undefined && record.orderingKey !== undefined) {
        next.sequence = mark.sequence;
      }
      return next;
    }
    case "failed":
      return {
        ...record,
        state: mark.state,
        updatedAt: nowIso,
        nextAttemptAt: mark.nextAttemptAt.toISOString(),
        lastError: boundedError(mark.error),
      };
    case "dead": {
      const { nextAttemptAt: _due, ...kept } = record;
      return { ...kept, state: mark.state, updatedAt: nowIso, lastError: boundedError(mark.error) };
    }
  }
  return { ...record, state: (mark as OutboxMark).state, updatedAt: nowIso };
}
