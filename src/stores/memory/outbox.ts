/**
 * An in-process outbox: for tests, local adapters and services whose outbox need not survive a
 * restart.
 *
 * @module
 */

import { assertOutboxIdentity } from "../../core/identity.ts";
import { fenceVerdict, newClaimToken } from "../../core/fence.ts";
import { addMs } from "../../core/time.ts";
import { storableMark } from "../../core/storable_text.ts";
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
import {
  checkedMaxPayloadBytes,
  checkRecordSize,
  validateOrderingKey,
  validateOutboxRecord,
} from "../../core/validate.ts";
import {
  checkedBatchSize,
  checkedDate,
  checkedLeaseMs,
  checkedLimit,
  checkedSequence,
  checkedUnblockAction,
} from "../../core/limits.ts";

interface Entry {
  seq: number;
  message: OutboxMessage;
}

/**
 * Options for {@linkcode MemoryOutboxRepository}.
 *
 * @example
 * ```ts
 * import type { MemoryOutboxRepositoryOptions } from "@outbox/nats";
 * const options: MemoryOutboxRepositoryOptions = { maxPayloadBytes: 8 * 1024 * 1024 };
 * ```
 */
export interface MemoryOutboxRepositoryOptions {
  /**
   * Largest record accepted at enqueue: payload plus headers, in bytes. A larger one is refused
   * with `OutboxPayloadTooLargeError` (NATS would refuse to publish it). Raise it only when your
   * server's `max_payload` is larger than NATS's default 1 MiB.
   *
   * @default {983040 (1 MiB less 64 KiB for the headers the dispatcher adds)}
   */
  maxPayloadBytes?: number;
}

/**
 * An outbox kept in process memory, with the same semantics as the durable stores (it passes the
 * same conformance suite). It never hands out its internal objects, and a claim only visits
 * messages still to dispatch, so its cost does not grow with the number of dispatched messages
 * kept.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * await outbox.enqueue({
 *   id: "order-1", kind: "event.publish", name: "order.created", subject: "orders.created",
 *   payload: JSON.stringify({ id: 1 }), headers: {},
 * });
 * const claimed = await outbox.claimDue(25, new Date());
 * for (const message of claimed) await outbox.markDispatched(message, new Date());
 * ```
 */
export class MemoryOutboxRepository implements OutboxRepository, OutboxAdmin {
  #all = new Map<string, Entry>();
  /** pending, claimed and failed entries, in enqueue order */
  #active = new Map<string, Entry>();
  #dispatched = new Map<string, Entry>();
  #dead = new Map<string, Entry>();
  /**
   * Per ordering key: its unsettled messages in enqueue order. The first is the key's head, the
   * only one a claim may take; a dead head stays first and blocks the key.
   */
  #keys = new Map<string, Entry[]>();
  /**
   * Per ordering key: the stream sequence its last message was stored at (the key fence's
   * `keySequence`), kept after the key's messages are settled or pruned.
   */
  #keySequences = new Map<string, number>();
  /**
   * Per ordering key: when its last message was dispatched (ISO). With `#keySequences`, the
   * per-key state `prune` retires once the key is idle (see `#retireIdleKeys`).
   */
  #keySettledAt = new Map<string, string>();
  #seq = 0;
  readonly #maxPayloadBytes: number;

  /** Creates an empty outbox; throws `OutboxValidationError` for a bad option. */
  constructor(options: MemoryOutboxRepositoryOptions = {}) {
    this.#maxPayloadBytes = checkedMaxPayloadBytes(options.maxPayloadBytes);
  }

  /** Stores a record as `pending`; see {@linkcode OutboxRepository.enqueue}. */
  enqueue(record: OutboxRecord, options: OutboxEnqueueOptions = {}): Promise<OutboxMessage> {
    try {
      const valid = validateOutboxRecord(record);
      checkRecordSize(valid, this.#maxPayloadBytes);
      return Promise.resolve(this.#enqueue(valid, new Date(), options.contextHeaders));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Stores many records, all or nothing on validation; see {@linkcode OutboxRepository.enqueueMany}. */
  enqueueMany(
    records: readonly OutboxRecord[],
    options: OutboxEnqueueOptions = {},
  ): Promise<OutboxMessage[]> {
    // contextHeaders may be a one-shot iterator, and it is read once per comparison.
    options = { ...options, contextHeaders: options.contextHeaders && [...options.contextHeaders] };
    try {
      const valid = records.map(validateOutboxRecord);
      for (const record of valid) checkRecordSize(record, this.#maxPayloadBytes);
      // Check identities first so a conflict stores nothing.
      const seen = new Map<string, OutboxRecord>();
      for (const record of valid) {
        const earlier = seen.get(record.id) ?? this.#all.get(record.id)?.message;
        if (earlier) assertOutboxIdentity(earlier, record, options.contextHeaders);
        seen.set(record.id, record);
      }
      const now = new Date();
      return Promise.resolve(
        valid.map((record) => this.#enqueue(record, now, options.contextHeaders)),
      );
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Reads one message (a copy). */
  get(id: string): Promise<OutboxMessage | undefined> {
    const entry = this.#all.get(id);
    return Promise.resolve(entry ? copy(entry.message) : undefined);
  }

  /** Claims due messages, oldest first; see {@linkcode OutboxRepository.claimDue}. */
  claimDue(limit: number, now: Date, options: OutboxClaimOptions = {}): Promise<OutboxMessage[]> {
    try {
      const max = checkedLimit(limit);
      const nowIso = checkedDate(now, "now");
      const leaseUntil = addMs(now, checkedLeaseMs(options.leaseMs)).toISOString();
      const claimToken = newClaimToken();
      const claimed: OutboxMessage[] = [];
      for (const entry of this.#active.values()) {
        if (claimed.length >= max) break;
        const message = entry.message;
        if (message.nextAttemptAt !== undefined && message.nextAttemptAt > nowIso) continue;
        if (!this.#isHead(entry)) continue;
        message.state = "claimed";
        message.attempts += 1;
        message.updatedAt = nowIso;
        message.nextAttemptAt = leaseUntil;
        message.claimToken = claimToken;
        const out = copy(message);
        const sequence = message.orderingKey === undefined
          ? undefined
          : this.#keySequences.get(message.orderingKey);
        if (sequence !== undefined) out.keySequence = sequence;
        claimed.push(out);
      }
      return Promise.resolve(claimed);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Settles a claim as dispatched; `false` when the claim was superseded. */
  markDispatched(
    claim: OutboxClaim,
    now: Date,
    outcome?: JsonValue,
    options: OutboxDispatchedOptions = {},
  ): Promise<boolean> {
    try {
      const sequence = checkedSequence(options?.sequence);
      const mark = storableMark({ claim, state: "dispatched", outcome, sequence });
      return Promise.resolve(this.#mark(mark, now));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Records a failed attempt; `false` when the claim was superseded. */
  markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean> {
    return this.markMany([{
      claim,
      state: "failed",
      error: failure?.error,
      nextAttemptAt: failure?.nextAttemptAt,
    }], failure?.now).then(([applied]) => applied);
  }

  /** Moves a claim to `dead`; `false` when the claim was superseded. */
  markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean> {
    return this.markMany([{ claim, state: "dead", error: dead?.error }], dead?.now)
      .then(([applied]) => applied);
  }

  /**
   * Settles many claims, in input order; one boolean per mark. Every mark is checked before
   * any is applied, so an invalid one (a bad `nextAttemptAt`) throws with nothing applied.
   */
  markMany(marks: readonly OutboxMark[], now: Date): Promise<boolean[]> {
    try {
      checkedDate(now, "now");
      for (const mark of marks) {
        if (mark?.state === "failed") checkedDate(mark.nextAttemptAt, "nextAttemptAt");
        if (mark?.state === "dispatched") checkedSequence(mark.sequence);
      }
      const ready = marks.map(storableMark);
      return Promise.resolve(ready.map((mark) => this.#mark(mark, now)));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Deletes old dispatched (and dead) messages in batches of `batchSize`. */
  async prune(options: OutboxPruneOptions): Promise<OutboxPruneResult> {
    const batchSize = checkedBatchSize(options.batchSize);
    const result: OutboxPruneResult = { dispatched: 0, dead: 0 };
    const plan: Array<[Map<string, Entry>, Date | undefined, "dispatched" | "dead"]> = [
      [this.#dispatched, options.dispatchedBefore, "dispatched"],
      [this.#dead, options.deadBefore, "dead"],
    ];
    for (const [map, before, key] of plan) {
      if (!before) continue;
      const cutoff = before.toISOString();
      const ids = [...map.values()]
        // A dead head blocks its key: it stays until an operator unblocks the key.
        .filter((entry) => entry.message.updatedAt < cutoff && !this.#isBlockingHead(entry))
        .map((entry) => entry.message.id);
      for (let start = 0; start < ids.length; start += batchSize) {
        const batch = ids.slice(start, start + batchSize);
        let removed = batch.length;
        if (!options.dryRun) {
          removed = 0;
          for (const id of batch) {
            // Only if it is still there: a requeue between batches took it back.
            const entry = map.get(id);
            if (entry && !this.#isBlockingHead(entry) && map.delete(id)) {
              this.#all.delete(id);
              removed += 1;
            }
          }
        }
        result[key] += removed;
        options.onProgress?.({ ...result });
        await Promise.resolve();
      }
    }
    if (options.dispatchedBefore && !options.dryRun) {
      this.#retireIdleKeys(options.dispatchedBefore.toISOString());
    }
    return result;
  }

  /**
   * Forgets the per-key state of the keys idle since `cutoff`: no unsettled message (no head,
   * so nothing waits either; a dead head that blocks its key keeps it) and none dispatched at or
   * after `cutoff`. The key's next message is then its first (published without the fence).
   */
  #retireIdleKeys(cutoff: string): void {
    for (const [key, settledAt] of this.#keySettledAt) {
      if (settledAt >= cutoff || this.#keys.has(key)) continue;
      this.#keySettledAt.delete(key);
      this.#keySequences.delete(key);
    }
    // A key whose messages went dead and were never dispatched has no settle time: it keeps no
    // sequence (a dead mark drops it), so there is nothing else to forget.
  }

  /** Counts per state and the backlog at `now`. */
  stats(now: Date = new Date()): Promise<OutboxStats> {
    const nowIso = now.toISOString();
    const stats: OutboxStats = {
      pending: 0,
      claimed: 0,
      failed: 0,
      dispatched: this.#dispatched.size,
      dead: this.#dead.size,
      due: 0,
    };
    for (const entry of this.#active.values()) {
      const message = entry.message;
      stats[message.state as "pending" | "claimed" | "failed"] += 1;
      if (
        (message.nextAttemptAt === undefined || message.nextAttemptAt <= nowIso) &&
        this.#isHead(entry)
      ) {
        stats.due += 1;
        if (
          stats.oldestDueCreatedAt === undefined || message.createdAt < stats.oldestDueCreatedAt
        ) {
          stats.oldestDueCreatedAt = message.createdAt;
        }
      }
    }
    if (stats.oldestDueCreatedAt !== undefined) {
      stats.oldestDueAgeMs = Math.max(0, now.getTime() - Date.parse(stats.oldestDueCreatedAt));
    }
    stats.blockedKeys = 0;
    for (const queue of this.#keys.values()) {
      if (queue[0].message.state === "dead") stats.blockedKeys += 1;
    }
    return Promise.resolve(stats);
  }

  /** Lists dead messages, oldest first. */
  listDead(options: OutboxListDeadOptions = {}): Promise<OutboxMessage[]> {
    try {
      const limit = checkedLimit(options.limit ?? 100);
      const entries = [...this.#dead.values()].sort((a, b) => a.seq - b.seq).slice(0, limit);
      return Promise.resolve(entries.map((entry) => copy(entry.message)));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Moves dead messages back to `pending` with `attempts` reset; returns how many changed. */
  requeue(ids: readonly string[], now: Date = new Date()): Promise<number> {
    let changed = 0;
    // In enqueue order, whatever the ids' order: the oldest skipped message of a key without a
    // head becomes its head (as on SQL).
    const entries = [...new Set(ids)].map((id) => this.#dead.get(id))
      .filter((entry): entry is Entry => entry !== undefined)
      .sort((a, b) => a.seq - b.seq);
    for (const entry of entries) {
      const id = entry.message.id;
      this.#dead.delete(id);
      const message = entry.message;
      message.state = "pending";
      message.attempts = 0;
      message.updatedAt = now.toISOString();
      delete message.nextAttemptAt;
      delete message.claimToken; // a requeue ends every earlier claim (see OutboxClaim)
      this.#active.set(id, entry);
      this.#rejoinKey(entry);
      changed += 1;
    }
    if (changed > 0) {
      // Keep enqueue order for claims: requeued messages are older than most active ones.
      this.#active = new Map([...this.#active].sort(([, a], [, b]) => a.seq - b.seq));
    }
    return Promise.resolve(changed);
  }

  /** Lists blocked ordering keys (dead heads), longest blocked first. */
  blockedKeys(options: OutboxBlockedKeysOptions = {}): Promise<OutboxBlockedKey[]> {
    try {
      const limit = checkedLimit(options.limit ?? 100);
      const blocked: OutboxBlockedKey[] = [];
      for (const [key, queue] of this.#keys) {
        const head = queue[0].message;
        if (head.state !== "dead") continue;
        const item: OutboxBlockedKey = {
          key,
          headId: head.id,
          since: head.updatedAt,
          waiting: queue.length - 1,
        };
        if (head.lastError !== undefined) item.lastError = head.lastError;
        blocked.push(item);
      }
      blocked.sort((a, b) => a.since < b.since ? -1 : a.since > b.since ? 1 : 0);
      return Promise.resolve(blocked.slice(0, limit));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Retries or skips the dead head of a blocked key; `false` when the key is not blocked. */
  async unblockKey(key: string, options: OutboxUnblockKeyOptions): Promise<boolean> {
    const valid = validateOrderingKey(key, "key");
    const action = checkedUnblockAction(options);
    const now = options.now ?? new Date();
    checkedDate(now, "now");
    const head = this.#keys.get(valid)?.[0];
    if (!head || head.message.state !== "dead") return false;
    if (action === "retry") return (await this.requeue([head.message.id], now)) === 1;
    head.message.updatedAt = now.toISOString();
    this.#leaveKey(head);
    return true;
  }

  /** Whether a claim may take `entry` as far as ordering goes. */
  #isHead(entry: Entry): boolean {
    const key = entry.message.orderingKey;
    return key === undefined || this.#keys.get(key)?.[0] === entry;
  }

  /** Whether `entry` is a dead head that blocks its key. */
  #isBlockingHead(entry: Entry): boolean {
    const key = entry.message.orderingKey;
    return key !== undefined && entry.message.state === "dead" &&
      this.#keys.get(key)?.[0] === entry;
  }

  /** Removes a settled (dispatched or skipped) entry from its key; the next becomes head. */
  #leaveKey(entry: Entry): void {
    const key = entry.message.orderingKey;
    if (key === undefined) return;
    const queue = this.#keys.get(key);
    const index = queue?.indexOf(entry) ?? -1;
    if (!queue || index < 0) return;
    queue.splice(index, 1);
    if (queue.length === 0) this.#keys.delete(key);
  }

  /**
   * A requeued entry that had left its key (it was skipped) comes back among the key's waiting
   * messages in enqueue order (after the current head, which keeps its place, as on SQL); one
   * that never left (a dead head) stays head.
   */
  #rejoinKey(entry: Entry): void {
    const key = entry.message.orderingKey;
    if (key === undefined) return;
    const queue = this.#keys.get(key);
    if (!queue) this.#keys.set(key, [entry]);
    else if (!queue.includes(entry)) {
      const at = queue.findIndex((other, index) => index > 0 && other.seq > entry.seq);
      queue.splice(at < 0 ? queue.length : at, 0, entry);
    }
  }

  /**
   * Copies of every stored message, in enqueue order (as the reference's `snapshot()`).
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository } from "@outbox/nats";
   * const outbox = new MemoryOutboxRepository();
   * console.log(outbox.snapshot().length); // 0
   * ```
   */
  snapshot(): OutboxMessage[] {
    return [...this.#all.values()].sort((a, b) => a.seq - b.seq).map((entry) =>
      copy(entry.message)
    );
  }

  #enqueue(record: OutboxRecord, now: Date, contextHeaders?: Iterable<string>): OutboxMessage {
    const existing = this.#all.get(record.id);
    if (existing) {
      assertOutboxIdentity(existing.message, record, contextHeaders);
      return copy(existing.message);
    }
    const nowIso = now.toISOString();
    const message: OutboxMessage = {
      ...record,
      headers: { ...record.headers },
      state: "pending",
      attempts: 0,
      createdAt: nowIso,
      updatedAt: nowIso,
    };
    const entry = { seq: ++this.#seq, message };
    this.#all.set(record.id, entry);
    this.#active.set(record.id, entry);
    if (message.orderingKey !== undefined) {
      const queue = this.#keys.get(message.orderingKey);
      if (queue) queue.push(entry);
      else this.#keys.set(message.orderingKey, [entry]);
    }
    return copy(message);
  }

  #mark(mark: OutboxMark, now: Date): boolean {
    if (typeof mark?.claim !== "object" || mark.claim === null) return false;
    const entry = this.#all.get(mark.claim.id);
    const verdict = fenceVerdict(entry?.message, mark.claim, mark.state);
    if (verdict !== "apply") return verdict === "applied";
    const message = entry!.message;
    const nowIso = checkedDate(now, "now");
    const nextAttemptAt = mark.state === "failed"
      ? checkedDate(mark.nextAttemptAt, "nextAttemptAt")
      : undefined;
    message.updatedAt = nowIso;
    message.state = mark.state;
    switch (mark.state) {
      case "dispatched":
        delete message.nextAttemptAt;
        delete message.lastError;
        if (mark.outcome !== undefined) message.outcome = mark.outcome; // a fresh copy (storableMark)
        if (message.orderingKey !== undefined) {
          if (mark.sequence !== undefined) {
            this.#keySequences.set(message.orderingKey, mark.sequence);
          }
          this.#keySettledAt.set(message.orderingKey, nowIso);
        }
        this.#move(entry!, this.#dispatched);
        this.#leaveKey(entry!);
        break;
      case "failed":
        message.nextAttemptAt = nextAttemptAt;
        message.lastError = mark.error;
        break;
      case "dead":
        delete message.nextAttemptAt;
        message.lastError = mark.error;
        // The key fence starts over: the key's next publish goes out without an expectation.
        if (message.orderingKey !== undefined) this.#keySequences.delete(message.orderingKey);
        this.#move(entry!, this.#dead);
        break;
    }
    return true;
  }

  #move(entry: Entry, to: Map<string, Entry>): void {
    this.#active.delete(entry.message.id);
    to.set(entry.message.id, entry);
  }
}

function copy(message: OutboxMessage): OutboxMessage {
  const out: OutboxMessage = { ...message, headers: { ...message.headers } };
  if (message.outcome !== undefined) out.outcome = cloneJson(message.outcome);
  return out;
}

function cloneJson(value: JsonValue): JsonValue {
  return value === null || typeof value !== "object" ? value : structuredClone(value);
}
