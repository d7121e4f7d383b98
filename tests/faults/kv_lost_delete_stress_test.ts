/**
 * NATS KV ordering keys under injected KV faults: three relays (lease 150 ms, some marks slower
 * than the lease) and a pruner at cutoff now, while a tenth of the relays' marker deletes are
 * dropped, a fifth land up to 300 ms late (after the writes that follow them), and one in twenty
 * of their KV updates applies but loses its reply (the caller gets an error; a mark is retried
 * as a dispatcher would). Then the enqueues stop and the relays run until idle. Every message
 * must be dispatched by the running relays (no key left waiting behind a head no claim takes),
 * and no message is claimed before the one enqueued before it on its key is dispatched.
 *
 * Before idle claims handed over key heads without a marker in their index (commit 739cefb), a
 * marker delete that was lost or landed late let a peer's hand-over name a dispatched message its
 * key's head again, and no claim ever read it: 352 and 1016 messages stayed pending in two 15 s
 * runs of this scenario. `OUTBOX_FAULT_STRESS_SECONDS` sets the enqueue time (default 5).
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import { NatsKvOutboxRepository, type OutboxMessage } from "../../mod.ts";
import { intercept } from "../nats_kv_fixture.ts";
import { sleep } from "../kit/mod.ts";
import { closeStressBucket, openStressBucket, StressRun } from "./kv_stress.ts";

const seconds = Number(Deno.env.get("OUTBOX_FAULT_STRESS_SECONDS") ?? 5);
const keyCount = 20;
const leaseMs = 150;
const idleMs = 3_000;
const options = { orphanGraceMs: 500 };

/** The error of an update that applied but whose reply was lost. */
class LostReplyError extends Error {
  constructor(key: string) {
    super(`injected: the reply of the update of ${key} was lost (the write applied)`);
    this.name = "LostReplyError";
  }
}

/**
 * `kv` whose marker deletes (`q.<id token>`) are dropped (10 %) or sent up to 300 ms late (20 %,
 * resolving at once, as the store's unconfirmed delete does), and whose updates lose their reply
 * after applying (5 %).
 */
function faultyKv(kv: KV): KV {
  const deletes = intercept(kv, "delete", (del) => (key, ...rest) => {
    if (!/^q\.[bh]/.test(key)) return del(key, ...rest);
    const roll = Math.random();
    if (roll < 0.1) return Promise.resolve();
    if (roll < 0.3) {
      setTimeout(() => del(key, ...rest).catch(() => {}), Math.random() * 300);
      return Promise.resolve();
    }
    return del(key, ...rest);
  });
  return intercept(deletes, "update", (update) => async (key, ...rest) => {
    const revision = await update(key, ...rest);
    if (Math.random() < 0.05) throw new LostReplyError(key);
    return revision;
  });
}

// "mixed": the producer and two of the relays write markers with copies of their records
// (`markerCopies`), the third relay without: stale copies (a record another relay claimed or
// settled since) meet the same faults.
for (const copies of ["off", "mixed"] as const) {
  Deno.test(`NATS KV fault stress${copies === "mixed" ? " (marker copies, mixed)" : ""}: dropped and late marker deletes and lost update replies leave no key waiting; keys stay in order`, async () => {
    const bucket = await openStressBucket("kvfs", 6);
    const kvs = bucket.kvs;
    const copying = { ...options, markerCopies: copies === "mixed" };
    const producer = new NatsKvOutboxRepository(kvs[0], copying);
    const relays = kvs.slice(1, 4).map((one, i) =>
      new NatsKvOutboxRepository(faultyKv(one), i === 1 ? options : copying)
    );
    const pruner = new NatsKvOutboxRepository(kvs[4], options);
    const observer = new NatsKvOutboxRepository(kvs[5], options);
    const repositories = [producer, ...relays, pruner, observer];
    try {
      const run = new StressRun({
        pauseMs: 20,
        expected: (error) => error instanceof LostReplyError,
      });
      const problems: string[] = [];
      let sequence = 0;
      /** The message enqueued before `message` on its key must be dispatched (or pruned). */
      const checkOrder = async (message: OutboxMessage) => {
        const { key, index } = run.position.get(message.id)!;
        if (index === 0) return;
        const before = await observer.get(run.enqueued.get(key)![index - 1]);
        if (before !== undefined && before.state !== "dispatched") {
          problems.push(`${key}: #${index} claimed while #${index - 1} is ${before.state}`);
        }
      };
      const settle = async (relay: NatsKvOutboxRepository, message: OutboxMessage) => {
        if (Math.random() < 0.1) await sleep(Math.random() * 300); // past the lease, at times
        const mark = { sequence: ++sequence };
        for (let attempt = 1;; attempt++) {
          try {
            await relay.markDispatched(message, new Date(), undefined, mark);
            return;
          } catch (error) {
            if (!(error instanceof LostReplyError) || attempt === 4) throw error;
          }
        }
      };
      const relay = (repository: NatsKvOutboxRepository) =>
        run.relay(repository, leaseMs, async (claimed) => {
          await Promise.all(claimed.map(checkOrder));
          await Promise.all(claimed.map((message) => settle(repository, message)));
        });
      const prune = run.prune(pruner);

      const producers = Array.from(
        { length: keyCount },
        (_, i) => run.produce(producer, "fstress", `key-${i}`),
      );
      const running = relays.map(relay);
      await run.finish(seconds, idleMs, { producers, pruners: [prune], relays: running });

      const total = run.total();
      const stats = await observer.stats();
      const left = stats.pending + stats.claimed + stats.failed;
      console.log(`fault stress: ${seconds} s, ${total} enqueued, ${left} left active`);
      assert.deepEqual(run.errors.slice(0, 5), [], `${run.errors.length} failed calls`);
      assert.deepEqual(problems.slice(0, 10), [], `${problems.length} out of key order`);
      assert.equal(left, 0, "messages left pending after the relays went idle");
      assert.equal(stats.dead, 0);
    } finally {
      await closeStressBucket(bucket, repositories);
    }
  });
}
