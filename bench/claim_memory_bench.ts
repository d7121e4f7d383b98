/**
 * Claim latency per store and batch size, with an empty history (baseline) and with a large
 * dispatched history in the same store. Each group reads as "history cost = ratio to baseline".
 *
 * Only the claim is timed: after each claim the batch is put back (marked failed and due at
 * once, outside the timed section), so every iteration claims the same live set.
 *
 * Run with `deno task bench`.
 */

import { MemoryOutboxRepository, type OutboxRecord, type OutboxRepository } from "../mod.ts";

const batchSizes = [1, 25, 100, 500];
const live = 1_000;
const memoryHistory = 100_000;

function records(count: number, prefix: string): OutboxRecord[] {
  return Array.from({ length: count }, (_, i) => ({
    id: `${prefix}-${i}`,
    kind: "event.publish",
    name: "bench.event",
    subject: `bench.s${i % 16}`,
    payload: JSON.stringify({ i, pad: "x".repeat(160) }),
    headers: {},
  }));
}

/** Fills `outbox` with `history` dispatched messages and `live` pending ones. */
async function seed(outbox: OutboxRepository, history: number): Promise<void> {
  const chunk = 5_000;
  for (let done = 0; done < history; done += chunk) {
    const batch = records(Math.min(chunk, history - done), `h${done}`);
    await outbox.enqueueMany(batch);
    const claimed = await outbox.claimDue(batch.length, new Date());
    await outbox.markMany!(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(),
    );
  }
  await outbox.enqueueMany(records(live, "live"));
}

/**
 * One claim, then the batch is put back (failed, due at once) so the live set stays the same.
 * With `b`, only the claim is timed; without (stores too fast for Deno's start/end, which
 * needs >= 10 µs per iteration), the whole cycle is, the same way in both groups.
 */
async function claimAndPutBack(outbox: OutboxRepository, limit: number, b?: Deno.BenchContext) {
  const now = new Date();
  b?.start();
  const claimed = await outbox.claimDue(limit, now);
  b?.end();
  if (claimed.length !== limit) throw new Error(`claimed ${claimed.length}, wanted ${limit}`);
  await outbox.markMany!(
    claimed.map((claim) => ({
      claim,
      state: "failed" as const,
      error: "bench",
      nextAttemptAt: new Date(now.getTime() - 1),
    })),
    now,
  );
}

const memoryEmpty = new MemoryOutboxRepository();
const memoryFull = new MemoryOutboxRepository();
await seed(memoryEmpty, 0);
await seed(memoryFull, memoryHistory);

/**
 * In-memory claims take microseconds, below what Deno's start()/end() can time: time 100 claim
 * cycles per iteration. (Bench functions must be `async` functions: Deno awaits only those.)
 */
async function hundredCycles(outbox: OutboxRepository, limit: number): Promise<void> {
  for (let i = 0; i < 100; i++) await claimAndPutBack(outbox, limit);
}

for (const limit of batchSizes) {
  Deno.bench({
    name: `memory 100x claim+settle ${limit}, empty history`,
    group: `memory claim ${limit}`,
    baseline: true,
    fn: async () => await hundredCycles(memoryEmpty, limit),
  });
  Deno.bench({
    name: `memory 100x claim+settle ${limit}, ${memoryHistory.toLocaleString("en")} dispatched`,
    group: `memory claim ${limit}`,
    fn: async () => await hundredCycles(memoryFull, limit),
  });
}
