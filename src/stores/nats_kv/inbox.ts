/**
 * An inbox on a NATS KV bucket: one key per (consumer, message id), created with a
 * create-if-absent write, so exactly one `record()` per pair returns `true`.
 *
 * @module
 */

import type { KV, KvEntry } from "@nats-io/kv";
import { KvRequests } from "./kv_requests.ts";
import { OutboxValidationError } from "../../core/errors.ts";
import { resolveInboxRecordOptions } from "../../core/inbox.ts";
import { checkedBatchSize } from "../../core/limits.ts";
import type {
  InboxAdmin,
  InboxPruneOptions,
  InboxRecordOptions,
  InboxRepository,
} from "../../core/types.ts";
import { isWrongLastSequence } from "./errors.ts";
import { inboxKey, inboxPrefix } from "./keys.ts";
import { encodeJson, type InboxEntry, recordCodec } from "./records.ts";
import {
  mapInFlight,
  rawRemover,
  removalsInFlight,
  removeIfUnchanged,
  scanLatest,
} from "./scan.ts";

/**
 * Options of {@linkcode NatsKvInboxRepository}.
 *
 * @example
 * ```ts
 * import type { NatsKvInboxOptions } from "@outbox/nats";
 * const options: NatsKvInboxOptions = { retentionMs: 7 * 86_400_000 };
 * ```
 */
export interface NatsKvInboxOptions {
  /**
   * How long recorded ids are remembered (the duplicate window). On a bucket that allows
   * per-message TTLs (NATS 2.11+, `allow_msg_ttl`) every id is written with this TTL; otherwise
   * the bucket's `max_age` applies (see `createInboxBucket`), or call `expire()` periodically.
   * Unset: ids are kept until `prune()` or the bucket's `max_age` removes them.
   */
  retentionMs?: number;
}

/**
 * How an inbox bucket forgets ids, from {@linkcode NatsKvInboxRepository.retention}.
 *
 * - `message-ttl`: each id is written with a per-message TTL of `windowMs` (server-side).
 * - `bucket-max-age`: the bucket's `max_age` (`windowMs`) removes ids (server-side).
 * - `prune`: nothing expires by itself; call `expire()` (or `prune()`) periodically.
 *
 * @example
 * ```ts
 * import type { NatsKvInboxRetention } from "@outbox/nats";
 * const retention: NatsKvInboxRetention = { mode: "bucket-max-age", windowMs: 86_400_000 };
 * ```
 */
export interface NatsKvInboxRetention {
  /** Which mechanism forgets ids. */
  mode: "message-ttl" | "bucket-max-age" | "prune";
  /** The window, when known. */
  windowMs?: number;
}

/**
 * An inbox stored in a NATS KV bucket: `record()` is `true` once per `(consumer, messageId)`,
 * decided by the server (a create-if-absent write; a lost race is recognised by its JetStream
 * error code and returns `false`). Ids of any form round-trip. Use its own bucket (see
 * `createInboxBucket`), whose `max_age` is the duplicate window.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { Kvm } from "@nats-io/kv";
 * import { createInboxBucket, NatsKvInboxRepository } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const kv = await createInboxBucket(new Kvm(nc), "billing_inbox", { retentionMs: 86_400_000 });
 * const inbox = new NatsKvInboxRepository(kv);
 * if (await inbox.record("evt-1", { consumer: "billing" })) {
 *   // first delivery: apply the side effect
 * }
 * await nc.close();
 * ```
 */
export class NatsKvInboxRepository implements InboxRepository, InboxAdmin {
  /** `record()` writes to the bucket at once: no database transaction can undo it. */
  readonly recordsImmediately = true;
  readonly #kv: KV;
  /** The hot operations (pipelined for a plain `Bucket`). */
  readonly #requests: KvRequests;
  readonly #retentionMs: number | undefined;
  #retention: Promise<NatsKvInboxRetention> | undefined;

  /** Uses `kv` (a bucket from `Kvm#create` / `Kvm#open`, or `createInboxBucket`). */
  constructor(kv: KV, options: NatsKvInboxOptions = {}) {
    const retentionMs = options.retentionMs;
    if (retentionMs !== undefined && (!Number.isFinite(retentionMs) || retentionMs < 1_000)) {
      throw new OutboxValidationError(
        "retentionMs",
        `retentionMs must be a number >= 1000, got ${retentionMs}`,
      );
    }
    this.#kv = kv;
    this.#requests = new KvRequests(kv);
    this.#retentionMs = retentionMs;
  }

  /** Records `messageId` for the consumer scope; `true` only for the call that inserted it. */
  async record(messageId: string, options?: Date | InboxRecordOptions): Promise<boolean> {
    const { now, consumer } = resolveInboxRecordOptions(messageId, options);
    const key = await inboxKey(consumer, messageId);
    const entry: InboxEntry = { v: 1, id: messageId, consumer, receivedAt: now.toISOString() };
    const ttl = this.#retentionMs !== undefined && (await this.retention()).mode === "message-ttl"
      ? `${Math.ceil(this.#retentionMs / 1000)}s`
      : undefined;
    try {
      await this.#requests.create(key, encodeJson(entry), ttl);
      return true;
    } catch (error) {
      if (isWrongLastSequence(error)) return false;
      throw error;
    }
  }

  /** Whether `messageId` is recorded for the consumer scope (one read). */
  async has(messageId: string, options?: InboxRecordOptions): Promise<boolean> {
    const { consumer } = resolveInboxRecordOptions(messageId, options);
    const entry = await this.#requests.get(await inboxKey(consumer, messageId));
    return entry !== null && entry.operation === "PUT";
  }

  /**
   * Forgets ids received before `receivedBefore`, `batchSize` concurrent deletes at a time;
   * returns how many were removed. Scans the inbox once (admin cost). An id recorded again
   * since the scan is kept.
   */
  async prune(options: InboxPruneOptions): Promise<number> {
    const batchSize = checkedBatchSize(options.batchSize);
    const cutoff = options.receivedBefore.toISOString();
    const victims: KvEntry[] = [];
    const codec = await recordCodec();
    await scanLatest(this.#kv, `${inboxPrefix}.>`, (entry) => {
      if (entry.operation !== "PUT") return;
      const receivedAt = codec.decodeInboxEntry(entry.value)?.receivedAt ??
        entry.created.toISOString();
      if (receivedAt < cutoff) victims.push(entry);
    });
    const remove = rawRemover(this.#kv);
    let removed = 0;
    for (let start = 0; start < victims.length; start += batchSize) {
      const batch = victims.slice(start, start + batchSize);
      const done = await mapInFlight(
        batch,
        removalsInFlight,
        (entry) => removeIfUnchanged(this.#kv, remove, entry.key, entry.revision),
      );
      removed += done.filter(Boolean).length;
    }
    return removed;
  }

  /**
   * Forgets ids older than `retentionMs` (the option) at `now`: the expiry to call
   * periodically when {@linkcode NatsKvInboxRepository.retention} says `prune`. Returns how
   * many were removed; 0 without `retentionMs`.
   *
   * @example
   * ```ts ignore
   * import { Kvm } from "@nats-io/kv";
   * import { connect } from "@nats-io/transport-node";
   * import { NatsKvInboxRepository } from "@outbox/nats";
   *
   * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
   * const inbox = new NatsKvInboxRepository(await new Kvm(nc).create("inbox"), {
   *   retentionMs: 86_400_000,
   * });
   * if ((await inbox.retention()).mode === "prune") await inbox.expire();
   * ```
   */
  async expire(now: Date = new Date()): Promise<number> {
    if (this.#retentionMs === undefined) return 0;
    return await this.prune({ receivedBefore: new Date(now.getTime() - this.#retentionMs) });
  }

  /**
   * How this inbox forgets ids, detected once from the bucket's configuration: per-message TTL
   * when the bucket allows it and `retentionMs` is set (NATS 2.11+), else the bucket's `max_age`,
   * else `prune`.
   *
   * @example
   * ```ts ignore
   * import { Kvm } from "@nats-io/kv";
   * import { connect } from "@nats-io/transport-node";
   * import { createInboxBucket, NatsKvInboxRepository } from "@outbox/nats";
   *
   * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
   * const kv = await createInboxBucket(new Kvm(nc), "inbox", { retentionMs: 3_600_000 });
   * console.log(await new NatsKvInboxRepository(kv).retention()); // { mode: "bucket-max-age", ... }
   * ```
   */
  retention(): Promise<NatsKvInboxRetention> {
    if (!this.#retention) {
      const detecting = this.#detect();
      this.#retention = detecting;
      detecting.catch(() => {
        if (this.#retention === detecting) this.#retention = undefined;
      });
    }
    return this.#retention;
  }

  async #detect(): Promise<NatsKvInboxRetention> {
    const status = await this.#kv.status();
    const config = status.streamInfo?.config as { allow_msg_ttl?: boolean } | undefined;
    if (config?.allow_msg_ttl === true && this.#retentionMs !== undefined) {
      return { mode: "message-ttl", windowMs: this.#retentionMs };
    }
    if (status.ttl > 0) return { mode: "bucket-max-age", windowMs: status.ttl };
    const retention: NatsKvInboxRetention = { mode: "prune" };
    if (this.#retentionMs !== undefined) retention.windowMs = this.#retentionMs;
    return retention;
  }
}
