/**
 * The shared pieces of the NATS KV stress scenarios (kv_prune_stress_test.ts,
 * kv_lost_delete_stress_test.ts): a fresh bucket opened over several connections, and a run in
 * which keyed producers, relays and pruners loop until they are told to stop, in the order the
 * scenarios stop them.
 *
 * @module
 */

import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { createOutboxBucket, type NatsKvOutboxRepository, type OutboxMessage } from "../../mod.ts";
import { keyedRecord } from "../conformance/records.ts";
import { connectNats, sleep, uniqueName } from "../kit/mod.ts";

/** A fresh outbox bucket, open over each of `connections` (`kvs[0]` is `kv`). */
export interface StressBucket {
  connections: NatsConnection[];
  kv: KV;
  kvs: KV[];
}

/**
 * Opens `count` connections and a fresh outbox bucket named after `prefix` over each.
 *
 * @example
 * ```ts
 * const bucket = await openStressBucket("kvps", 6);
 * ```
 */
export async function openStressBucket(prefix: string, count: number): Promise<StressBucket> {
  const connections: NatsConnection[] = await Promise.all(
    Array.from({ length: count }, () => connectNats()),
  );
  const name = uniqueName(prefix);
  const kv = await createOutboxBucket(new Kvm(connections[0]), name);
  const kvs = [
    kv,
    ...await Promise.all(connections.slice(1).map((nc) => new Kvm(nc).open(name))),
  ];
  return { connections, kv, kvs };
}

/**
 * Closes `repositories`, destroys the bucket and closes its connections.
 *
 * @example
 * ```ts
 * await closeStressBucket(bucket, repositories);
 * ```
 */
export async function closeStressBucket(
  { connections, kv }: StressBucket,
  repositories: NatsKvOutboxRepository[],
): Promise<void> {
  await Promise.all(repositories.map((repository) => repository.close()));
  await kv.destroy().catch(() => {});
  await Promise.all(connections.map((nc) => nc.close()));
}

/** How a stress run's loops treat a failed step. */
export interface StressRunOptions {
  /** Pause after a failed step, in ms. */
  pauseMs: number;
  /** An injected failure, not recorded in `errors`. */
  expected?: (error: unknown) => boolean;
}

/** The loops a stress run started, in the order `finish` stops them. */
export interface StressLoops {
  producers: Promise<void>[];
  pruners: Promise<void>[];
  relays: Promise<void>[];
}

/**
 * One stress run: its keyed enqueues (per key, in enqueue order), the failed calls, and the
 * flags that stop its producers, pruners and relays.
 *
 * @example
 * ```ts
 * const run = new StressRun({ pauseMs: 50 });
 * const producers = ["key-0"].map((key) => run.produce(producer, "stress", key));
 * ```
 */
export class StressRun {
  enqueueing = true;
  pruning = true;
  relaying = true;
  lastClaimMs: number = Date.now();
  /** Per key, the ids in enqueue order. */
  readonly enqueued: Map<string, string[]> = new Map();
  /** Per id, its key and its index in the key's enqueue order. */
  readonly position: Map<string, { key: string; index: number }> = new Map();
  readonly errors: string[] = [];
  readonly #options: StressRunOptions;

  constructor(options: StressRunOptions) {
    this.#options = options;
  }

  /** Runs `step` until `running()` says stop; a failed step is recorded, and the loop goes on. */
  async loop(running: () => boolean, step: () => Promise<void>): Promise<void> {
    while (running()) {
      try {
        await step();
      } catch (error) {
        if (!this.#options.expected?.(error)) this.errors.push(String(error));
        await sleep(this.#options.pauseMs);
      }
    }
  }

  /** Enqueues records of `key` one at a time (the key's order) while `enqueueing`. */
  produce(producer: NatsKvOutboxRepository, prefix: string, key: string): Promise<void> {
    const ids: string[] = [];
    this.enqueued.set(key, ids);
    return this.loop(() => this.enqueueing, async () => {
      const record = keyedRecord(prefix, key);
      this.position.set(record.id, { key, index: ids.length });
      ids.push(record.id);
      await producer.enqueue(record); // one at a time per key: the key's order
      await sleep(Math.random() * 20);
    });
  }

  /** Claims (10 at a time) while `relaying` and hands each non-empty claim to `settle`. */
  relay(
    repository: NatsKvOutboxRepository,
    leaseMs: number,
    settle: (claimed: OutboxMessage[]) => Promise<void>,
  ): Promise<void> {
    return this.loop(() => this.relaying, async () => {
      const claimed = await repository.claimDue(10, new Date(), { leaseMs });
      if (claimed.length === 0) {
        await sleep(10);
        return;
      }
      this.lastClaimMs = Date.now();
      await settle(claimed);
    });
  }

  /** Prunes everything dispatched up to now while `pruning`; `count` gets each prune's count. */
  prune(repository: NatsKvOutboxRepository, count?: (dispatched: number) => void): Promise<void> {
    return this.loop(() => this.pruning, async () => {
      const pruned = await repository.prune({ dispatchedBefore: new Date() });
      count?.(pruned.dispatched);
      await sleep(Math.random() * 50);
    });
  }

  /**
   * After `seconds` of enqueues: stops the producers, then the pruners, then (once no claim got
   * anything for `idleMs`) the relays.
   */
  async finish(seconds: number, idleMs: number, loops: StressLoops): Promise<void> {
    await sleep(seconds * 1_000);
    this.enqueueing = false;
    await Promise.all(loops.producers);
    this.pruning = false;
    await Promise.all(loops.pruners);
    while (Date.now() - this.lastClaimMs < idleMs) await sleep(200);
    this.relaying = false;
    await Promise.all(loops.relays);
  }

  /** How many records were enqueued. */
  total(): number {
    return [...this.enqueued.values()].reduce((sum, ids) => sum + ids.length, 0);
  }
}
