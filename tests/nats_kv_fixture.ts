/**
 * Fixtures for the NATS KV store tests: unique buckets on the test server, repositories on two
 * connections, a KV wrapper that counts the operations a repository issues, and clean-up.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { KV, KvEntry } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createInboxBucket,
  createOutboxBucket,
  type NatsKvInboxOptions,
  NatsKvInboxRepository,
  type NatsKvOutboxOptions,
  NatsKvOutboxRepository,
  type OutboxMessage,
  type OutboxRecord,
} from "../mod.ts";
import { keyEntryPrefix, markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { connectNats, uniqueName } from "./kit/mod.ts";

/** Per-method call counts, and entries delivered by watches and history scans. */
export interface KvCounts {
  calls: Record<string, number>;
  /** Entries delivered to the repository by `watch` iterators. */
  watched: number;
  /** Entries delivered by `history` iterators (admin scans). */
  scanned: number;
}

/** Sum of record/marker reads and writes a repository issued (watch entries not included). */
export function operations(counts: KvCounts): number {
  return Object.entries(counts.calls)
    .filter(([name]) => !["watch", "history", "status"].includes(name))
    .reduce((sum, [, n]) => sum + n, 0);
}

/** Wraps `kv` so every call and every delivered watch/history entry is counted in `counts`. */
export function countingKv(kv: KV, counts: KvCounts): KV {
  const wrapIterator = <T extends object>(iterator: T, field: "watched" | "scanned"): T =>
    new Proxy(iterator, {
      get(target, property) {
        if (property === Symbol.asyncIterator) {
          return async function* () {
            for await (const entry of target as unknown as AsyncIterable<KvEntry>) {
              counts[field] += 1;
              yield entry;
            }
          };
        }
        const value = Reflect.get(target, property, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  return new Proxy(kv, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      if (typeof value !== "function" || typeof property !== "string") return value;
      return (...args: unknown[]) => {
        counts.calls[property] = (counts.calls[property] ?? 0) + 1;
        const result = value.apply(target, args);
        if (property === "watch" || property === "history") {
          const field = property === "watch" ? "watched" : "scanned";
          return (result as Promise<object>).then((iterator) => wrapIterator(iterator, field));
        }
        return result;
      };
    },
  });
}

/** Fresh counters. */
export function newCounts(): KvCounts {
  return { calls: {}, watched: 0, scanned: 0 };
}

/** Buckets and repositories for one test. */
export interface KvFixture extends AsyncDisposable {
  nc: NatsConnection;
  peerNc: NatsConnection;
  outboxBucket: string;
  inboxBucket: string;
  kv: KV;
  peerKv: KV;
  inboxKv: KV;
  peerInboxKv: KV;
  /** Opens another repository on the outbox bucket (closed by the fixture). */
  outbox(options?: NatsKvOutboxOptions & { kv?: KV }): NatsKvOutboxRepository;
  /** Opens another inbox repository (closed by the fixture). */
  inbox(options?: NatsKvInboxOptions & { kv?: KV }): NatsKvInboxRepository;
  /** Writes garbage into the record of `id`. */
  corrupt(id: string): Promise<void>;
  close(): Promise<void>;
}

/**
 * Creates unique outbox and inbox buckets, opened on two connections. `defaults`: options of
 * every outbox repository the fixture opens (a test's own options win), e.g.
 * `{ markerCopies: true }`.
 */
export async function openKvFixture(defaults: NatsKvOutboxOptions = {}): Promise<KvFixture> {
  const nc = await connectNats();
  const peerNc = await connectNats();
  const outboxBucket = uniqueName("kvo");
  const inboxBucket = uniqueName("kvi");
  const kv = await createOutboxBucket(new Kvm(nc), outboxBucket);
  const inboxKv = await createInboxBucket(new Kvm(nc), inboxBucket, { retentionMs: 0 });
  const peerKv = await new Kvm(peerNc).open(outboxBucket);
  const peerInboxKv = await new Kvm(peerNc).open(inboxBucket);
  const repositories: NatsKvOutboxRepository[] = [];
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    await Promise.all(repositories.map((repository) => repository.close()));
    await kv.destroy().catch(() => {});
    await inboxKv.destroy().catch(() => {});
    await peerNc.close();
    await nc.close();
  };
  return {
    nc,
    peerNc,
    outboxBucket,
    inboxBucket,
    kv,
    peerKv,
    inboxKv,
    peerInboxKv,
    outbox(options = {}) {
      const repository = new NatsKvOutboxRepository(options.kv ?? kv, { ...defaults, ...options });
      repositories.push(repository);
      return repository;
    },
    inbox(options = {}) {
      return new NatsKvInboxRepository(options.kv ?? inboxKv, options);
    },
    async corrupt(id) {
      await kv.put(await outboxRecordKey(id), "{not json");
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** KV methods a test can intercept with {@linkcode intercept}. */
export type KvMethod = "update" | "create" | "put" | "get" | "delete" | "watch";

/** `kv` with `method` replaced by `wrap(original)` (everything else passes through). */
export function intercept<K extends KvMethod>(
  kv: KV,
  method: K,
  wrap: (original: KV[K]) => KV[K],
): KV {
  const original = (kv[method] as (...args: unknown[]) => unknown).bind(kv) as KV[K];
  const replaced = wrap(original);
  return new Proxy(kv, {
    get(target, property) {
      if (property === method) return replaced;
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/**
 * `kv` without its JetStream manager: a KV object that offers only the KV interface, so the stores
 * remove entries with KV calls (tombstones stay) instead of stream message deletes.
 */
export function withoutStreamAccess<T extends object>(kv: T): T {
  return new Proxy(kv, {
    get(target, property) {
      if (property === "jsm") return undefined;
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** Whether a bucket key is an ordering key's entry (`q._k.<token>`). */
export function isKeyEntry(key: string): boolean {
  return key.startsWith(`${keyEntryPrefix}.`);
}

/** One round of claims (up to 10, now) by each of `repositories` in turn: what they claimed. */
export async function claimEach(
  repositories: readonly NatsKvOutboxRepository[],
): Promise<OutboxMessage[]> {
  const claimed: OutboxMessage[] = [];
  for (const repository of repositories) {
    claimed.push(...await repository.claimDue(10, new Date()));
  }
  return claimed;
}

/**
 * Two instances over one bucket: `a` enqueues `records` (messages of one key; the first, d, its
 * head) and runs `deleteOfD` instead of each delete of d's marker (`send` makes the real delete);
 * `b`, on the peer connection, has read d's marker into its index.
 */
export async function twoInstancesOverKey(
  fixture: KvFixture,
  records: OutboxRecord[],
  deleteOfD: (send: () => Promise<void>) => Promise<void>,
): Promise<{ a: NatsKvOutboxRepository; b: NatsKvOutboxRepository }> {
  const dMarker = markerKeyOf(await outboxRecordKey(records[0].id));
  const kv = intercept(fixture.kv, "delete", (del) => (key, ...rest) => {
    if (key !== dMarker) return del(key, ...rest);
    return deleteOfD(() => del(key, ...rest));
  });
  const a = fixture.outbox({ kv });
  const b = fixture.outbox({ kv: fixture.peerKv });
  await a.enqueueMany(records);
  await b.blockedKeys(); // b's index knows d's marker
  return { a, b };
}

/**
 * The race of the late-join tests, run inside the producer's enqueue of the key's second
 * message: `dispatcher` dispatches its claim of the first message (handing the key over to the
 * second), claims and dispatches the second (no next: the key has no head), and prunes
 * everything dispatched a minute ago or earlier, retiring the idle key. The claims and marks are
 * dated two minutes ago.
 */
export async function dispatchBothAndRetire(
  dispatcher: NatsKvOutboxRepository,
  claimOfFirst: OutboxMessage,
  secondId: string,
): Promise<void> {
  const old = new Date(Date.now() - 120_000);
  assert.equal(await dispatcher.markDispatched(claimOfFirst, old), true);
  const [claim2] = await dispatcher.claimDue(10, old);
  assert.equal(claim2?.id, secondId);
  assert.equal(await dispatcher.markDispatched(claim2, old, undefined, { sequence: 3 }), true);
  const cutoff = new Date(Date.now() - 60_000);
  assert.equal((await dispatcher.prune({ dispatchedBefore: cutoff })).dispatched, 2);
}

/** The live entry of `key` (`null` when missing or deleted). */
export async function entryOf(kv: KV, key: string): Promise<KvEntry | null> {
  const entry = await kv.get(key);
  return entry?.operation === "PUT" ? entry : null;
}

/** The marker of message `id`, parsed (`undefined` when it has none). */
export async function markerOf(kv: KV, id: string): Promise<Record<string, unknown> | undefined> {
  const entry = await entryOf(kv, markerKeyOf(await outboxRecordKey(id)));
  return entry ? entry.json<Record<string, unknown>>() : undefined;
}

/**
 * A repository on a counting view of the peer connection (a relay of its own); `gets()` and
 * `updates()`: its record reads and compare-and-sets since creation.
 */
export function countingOutbox(
  fixture: KvFixture,
  options: NatsKvOutboxOptions = {},
): { outbox: NatsKvOutboxRepository; gets: () => number; updates: () => number } {
  const counts = newCounts();
  const outbox = fixture.outbox({ ...options, kv: countingKv(fixture.peerKv, counts) });
  return { outbox, gets: () => counts.calls.get ?? 0, updates: () => counts.calls.update ?? 0 };
}
