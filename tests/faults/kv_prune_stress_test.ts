/**
 * NATS KV outbox under aggressive retention: keyed messages enqueued without pause, two relays
 * claiming (lease 150 ms, some marks slower than the lease) and marking, two pruners removing
 * everything dispatched up to now and retiring idle keys, `orphanGraceMs` 500. Then the
 * enqueues and pruners stop and the relays run until idle. Every message must be dispatched by
 * the running relays (nothing left for a fresh process to find), once, in enqueue order per key.
 *
 * On nats-server 2.9.10 prune's filtered stream purges moved the relays' watches past markers they
 * had not delivered yet: 21-340 messages stayed pending per 20 s run, and keys' messages were
 * dispatched out of order (a hand-over named the message after one its index had never seen; see
 * tests/nats_kv_prune_strand_test.ts for the deterministic form). `OUTBOX_PRUNE_STRESS_SECONDS`
 * sets the enqueue time (default 20).
 */

import assert from "node:assert/strict";
import { NatsKvOutboxRepository, type OutboxMessage } from "../../mod.ts";
import { sleep } from "../kit/mod.ts";
import { closeStressBucket, openStressBucket, StressRun } from "./kv_stress.ts";

const seconds = Number(Deno.env.get("OUTBOX_PRUNE_STRESS_SECONDS") ?? 20);
const keyCount = 20;
const leaseMs = 150;
const idleMs = 5_000;
const options = { orphanGraceMs: 500 };

Deno.test("NATS KV prune stress: two relays and two pruners at cutoff now leave no message pending; each is dispatched once, in key order", async () => {
  const bucket = await openStressBucket("kvps", 6);
  const repositories = bucket.kvs.map((one) => new NatsKvOutboxRepository(one, options));
  const [producer, relayA, relayB, prunerA, prunerB, fresh] = repositories;
  try {
    const run = new StressRun({ pauseMs: 50 });
    const dispatchedAt = new Map<string, number>(); // id -> attempts of the dispatching claim
    const dispatchedUpTo = new Map<string, number>(); // key -> last index dispatched
    const problems: string[] = [];
    let pruned = 0;
    let sequence = 0;

    const settle = async (relay: NatsKvOutboxRepository, message: OutboxMessage) => {
      if (Math.random() < 0.1) await sleep(Math.random() * 300); // past the lease, at times
      const applied = await relay.markDispatched(message, new Date(), undefined, {
        sequence: ++sequence,
      });
      if (!applied) return; // its lease expired and the other relay claimed it again
      const { key, index } = run.position.get(message.id)!;
      if (dispatchedAt.has(message.id)) problems.push(`${message.id} dispatched twice`);
      dispatchedAt.set(message.id, message.attempts);
      const last = dispatchedUpTo.get(key) ?? -1;
      if (index !== last + 1) problems.push(`${key}: #${index} dispatched after #${last}`);
      dispatchedUpTo.set(key, Math.max(last, index));
    };
    const relay = (repository: NatsKvOutboxRepository) =>
      run.relay(repository, leaseMs, async (claimed) => {
        for (const message of claimed) {
          const attempts = dispatchedAt.get(message.id);
          if (attempts !== undefined && message.attempts > attempts) {
            problems.push(`${message.id} claimed again after it was dispatched`);
          }
        }
        await Promise.all(claimed.map((message) => settle(repository, message)));
      });
    const prune = (repository: NatsKvOutboxRepository) =>
      run.prune(repository, (dispatched) => (pruned += dispatched));

    const producers = Array.from(
      { length: keyCount },
      (_, i) => run.produce(producer, "stress", `key-${i}`),
    );
    const relays = [relayA, relayB].map(relay);
    const pruners = [prunerA, prunerB].map(prune);
    await run.finish(seconds, idleMs, { producers, pruners, relays });

    const total = run.total();
    const stats = await fresh.stats();
    const stranded = stats.pending + stats.claimed + stats.failed;
    // What a process started now would find (claims join headless keys after orphanGraceMs).
    let freshClaims = 0;
    for (let empty = 0; empty < 3;) {
      const claimed = await fresh.claimDue(1_000, new Date());
      freshClaims += claimed.length;
      empty = claimed.length === 0 ? empty + 1 : 0;
      for (const message of claimed) await fresh.markDispatched(message, new Date());
      if (claimed.length === 0) await sleep(options.orphanGraceMs + 100);
    }
    console.log(
      `prune stress: ${seconds} s, ${total} enqueued, ${dispatchedAt.size} dispatched by the ` +
        `relays, ${pruned} pruned, ${stranded} left active, ${freshClaims} claimed by a fresh process`,
    );
    assert.deepEqual(run.errors.slice(0, 5), [], `${run.errors.length} failed calls`);
    assert.deepEqual(problems.slice(0, 10), []);
    assert.equal(stranded, 0, "messages left pending after the relays went idle");
    assert.equal(dispatchedAt.size, total, "every message dispatched by the running relays");
    assert.equal(stats.dead, 0);
  } finally {
    await closeStressBucket(bucket, repositories);
  }
});
