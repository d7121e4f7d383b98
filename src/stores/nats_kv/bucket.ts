/**
 * Creating buckets with the settings the NATS KV stores expect.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";

/**
 * What the helpers need of a bucket: its status (a `KV` from `@nats-io/kv` has it).
 *
 * @example
 * ```ts
 * import type { KvBucketLike } from "@outbox/nats";
 * const bucket: KvBucketLike = { status: () => Promise.resolve({ ttl: 0 }) };
 * ```
 */
export interface KvBucketLike {
  /** The bucket's status; `ttl` is its `max_age` in milliseconds (0: entries never expire). */
  status(): Promise<{ ttl: number }>;
}

/**
 * The bucket settings the helpers ask for: a subset of `KvOptions` from `@nats-io/kv`.
 *
 * @example
 * ```ts
 * import type { KvBucketSettings } from "@outbox/nats";
 * const settings: KvBucketSettings = {
 *   history: 1, replicas: 1, storage: "file", allow_direct: true,
 * };
 * ```
 */
export interface KvBucketSettings {
  /** Revisions kept per key. */
  history: number;
  /** Stream replicas. */
  replicas: number;
  /** Storage of the stream. */
  storage: "file" | "memory";
  /** Whether any replica may answer reads. */
  allow_direct: boolean;
  /** `max_age` in milliseconds, when entries expire. */
  ttl?: number;
  /** Description of the stream. */
  description?: string;
  /** Size limit in bytes. */
  max_bytes?: number;
}

/**
 * Whatever creates or opens buckets: a `Kvm` from `@nats-io/kv` (`new Kvm(nc)`).
 *
 * @example
 * ```ts
 * import { Kvm } from "@nats-io/kv";
 * import type { NatsConnection } from "@nats-io/transport-node";
 * import type { KvBucketFactory } from "@outbox/nats";
 * const factoryFor = (nc: NatsConnection): KvBucketFactory => new Kvm(nc);
 * ```
 */
export interface KvBucketFactory<Bucket extends KvBucketLike = KvBucketLike> {
  /** Creates the bucket with `settings`, or opens it when it exists. */
  create(name: string, settings: KvBucketSettings): Promise<Bucket>;
}

/**
 * Options of {@linkcode createOutboxBucket} and {@linkcode createInboxBucket}.
 *
 * @example
 * ```ts
 * import type { KvBucketOptions } from "@outbox/nats";
 * const options: KvBucketOptions = { replicas: 3, description: "orders outbox" };
 * ```
 */
export interface KvBucketOptions {
  /** Stream replicas (1, 3 or 5). @default {1} */
  replicas?: number;
  /** Storage of the stream behind the bucket. @default {"file"} */
  storage?: "file" | "memory";
  /** Description of the stream. */
  description?: string;
  /** Size limit of the bucket in bytes; writes fail beyond it (-1: none). @default {-1} */
  maxBytes?: number;
  /**
   * Direct gets (any replica answers reads: faster, but a replica may lag behind a write).
   * The stores stay correct either way (every write is a revision CAS), but a lagging read can
   * make a mark report a superseded claim, so it is on only for a single replica.
   *
   * @default {replicas === 1}
   */
  allowDirect?: boolean;
}

/**
 * Options of {@linkcode createInboxBucket}.
 *
 * @example
 * ```ts
 * import type { InboxBucketOptions } from "@outbox/nats";
 * const options: InboxBucketOptions = { retentionMs: 7 * 86_400_000 };
 * ```
 */
export interface InboxBucketOptions extends KvBucketOptions {
  /**
   * The duplicate window: the bucket's `max_age`, after which the server forgets an id.
   * 0 keeps ids until `prune()`.
   *
   * @default {604800000}
   */
  retentionMs?: number;
}

/**
 * Creates (or opens) a bucket for `NatsKvOutboxRepository`: history 1, file storage, no expiry
 * (a pending message must never vanish; retention is `prune()`). Rejects with
 * `OutboxValidationError` when an existing bucket of that name expires entries.
 *
 * @example
 * ```ts ignore
 * import { Kvm } from "@nats-io/kv";
 * import { connect } from "@nats-io/transport-node";
 * import { createOutboxBucket, NatsKvOutboxRepository } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const kv = await createOutboxBucket(new Kvm(nc), "orders_outbox", { replicas: 1 });
 * const outbox = new NatsKvOutboxRepository(kv);
 * ```
 */
export async function createOutboxBucket<Bucket extends KvBucketLike>(
  kvm: KvBucketFactory<Bucket>,
  name: string,
  options: KvBucketOptions = {},
): Promise<Bucket> {
  const kv = await kvm.create(name, bucketOptions(options, 0));
  const status = await kv.status();
  if (status.ttl > 0) {
    throw new OutboxValidationError(
      "bucket",
      `Bucket ${name} expires entries after ${status.ttl} ms; an outbox bucket must not expire ` +
        "entries (pending messages would be lost)",
    );
  }
  return kv;
}

/**
 * Creates (or opens) a bucket for `NatsKvInboxRepository`: history 1, file storage, and
 * `max_age` = `retentionMs`, so the server forgets ids after the duplicate window on every
 * server version (per-message TTLs need NATS 2.11).
 *
 * @example
 * ```ts ignore
 * import { Kvm } from "@nats-io/kv";
 * import { connect } from "@nats-io/transport-node";
 * import { createInboxBucket, NatsKvInboxRepository } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const kv = await createInboxBucket(new Kvm(nc), "billing_inbox", { retentionMs: 86_400_000 });
 * const inbox = new NatsKvInboxRepository(kv);
 * ```
 */
export async function createInboxBucket<Bucket extends KvBucketLike>(
  kvm: KvBucketFactory<Bucket>,
  name: string,
  options: InboxBucketOptions = {},
): Promise<Bucket> {
  const retentionMs = options.retentionMs ?? 7 * 86_400_000;
  if (!Number.isSafeInteger(retentionMs) || retentionMs < 0) {
    throw new OutboxValidationError(
      "retentionMs",
      `retentionMs must be an integer >= 0, got ${retentionMs}`,
    );
  }
  return await kvm.create(name, bucketOptions(options, retentionMs));
}

function bucketOptions(options: KvBucketOptions, ttl: number): KvBucketSettings {
  const replicas = options.replicas ?? 1;
  if (![1, 3, 5].includes(replicas)) {
    throw new OutboxValidationError("replicas", `replicas must be 1, 3 or 5, got ${replicas}`);
  }
  const kvOptions: KvBucketSettings = {
    history: 1,
    replicas,
    storage: options.storage ?? "file",
    allow_direct: options.allowDirect ?? replicas === 1,
  };
  if (ttl > 0) kvOptions.ttl = ttl;
  if (options.description !== undefined) kvOptions.description = options.description;
  if (options.maxBytes !== undefined) kvOptions.max_bytes = options.maxBytes;
  return kvOptions;
}
