/**
 * Claim latency on the memory store, batch sizes 1/25/100/500, with an empty history and with
 * 100,000 dispatched messages in the same store. Both hold the same 1,000 live pending messages.
 *
 * In-memory claims take microseconds, below what Deno's `b.start()`/`b.end()` can time (they are
 * ignored under 10 µs per iteration), so each iteration runs 100 claim + put-back cycles and the
 * whole cycle is timed, the same way in both benches of a group. 100,000 (not 1,000,000)
 * dispatched messages: a million ~200-byte messages is about 1 GB of heap in this store, which
 * is meant for tests and small services.
 *
 * Run with `deno task bench` (or `deno bench -A bench/claim_memory_bench.ts`).
 *
 * @module
 */

import { MemoryOutboxRepository, type OutboxRepository } from "../mod.ts";
import { claimAndPutBack, claimBatchSizes, liveMessages } from "./support/claim_cycle.ts";
import { records } from "./support/records.ts";

const history = 100_000;

/** Fills `outbox` with `dispatched` dispatched messages, then the live pending ones. */
async function seed(outbox: OutboxRepository, dispatched: number): Promise<void> {
  const chunk = 5_000;
  for (let done = 0; done < dispatched; done += chunk) {
    const batch = records("hist", "bench", Math.min(chunk, dispatched - done), done);
    await outbox.enqueueMany(batch);
    const claimed = await outbox.claimDue(batch.length, new Date());
    await outbox.markMany!(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(),
    );
  }
  await outbox.enqueueMany(records("live", "bench", liveMessages));
}

const empty = new MemoryOutboxRepository();
const full = new MemoryOutboxRepository();
await seed(empty, 0);
await seed(full, history);

// Warm both stores (and the JIT) before anything is timed.
for (const outbox of [empty, full, empty, full]) {
  for (let i = 0; i < 200; i++) await claimAndPutBack(outbox, 25);
}

async function hundredCycles(outbox: OutboxRepository, limit: number): Promise<void> {
  for (let i = 0; i < 100; i++) await claimAndPutBack(outbox, limit);
}

for (const limit of claimBatchSizes) {
  Deno.bench({
    name: `memory 100x claim+put back ${limit}, empty history`,
    group: `memory claim ${limit}`,
    baseline: true,
    fn: async () => await hundredCycles(empty, limit),
  });
  Deno.bench({
    name: `memory 100x claim+put back ${limit}, ${history.toLocaleString("en")} dispatched`,
    group: `memory claim ${limit}`,
    fn: async () => await hundredCycles(full, limit),
  });
}
