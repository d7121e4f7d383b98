/**
 * The claim benchmark shared by every store: claim a batch from a live set of pending messages,
 * then put the batch back (failed, due at once) outside the timed section, so every iteration
 * claims from the same live set. Each store registers two benches per batch size, grouped, with
 * the empty-history outbox as the `baseline`: the group summary reads "history cost = ratio".
 *
 * @module
 */

import type { OutboxRepository } from "../../mod.ts";

/** Batch sizes every claim bench measures. */
export const claimBatchSizes: readonly number[] = [1, 25, 100, 500];

/** Pending messages in every outbox under test (>= the largest batch). */
export const liveMessages = 1_000;

/**
 * Claims `limit` messages (timed with `b` when given) and puts them back: marked failed and due
 * at once, so the next claim takes them again.
 */
export async function claimAndPutBack(
  outbox: OutboxRepository,
  limit: number,
  b?: Deno.BenchContext,
  timings?: number[],
): Promise<void> {
  const now = new Date();
  b?.start();
  const started = performance.now();
  const claimed = await outbox.claimDue(limit, now);
  const elapsed = performance.now() - started;
  b?.end();
  timings?.push(elapsed);
  if (claimed.length !== limit) throw new Error(`claimed ${claimed.length}, wanted ${limit}`);
  const marks = claimed.map((claim) => ({
    claim,
    state: "failed" as const,
    error: "bench",
    nextAttemptAt: new Date(now.getTime() - 1),
  }));
  const applied = await outbox.markMany!(marks, now);
  if (applied.some((ok) => !ok)) throw new Error("a put-back mark was not applied");
}

/** Options of {@linkcode registerClaimBenches}. */
export interface ClaimBenchOptions {
  /** Store label, e.g. `postgres`. */
  store: string;
  /** The outbox with only the live messages. */
  empty: OutboxRepository;
  /** The outbox with the live messages after a large dispatched history. */
  full: OutboxRepository;
  /** How many dispatched messages `full` keeps. */
  history: number;
  /**
   * An outbox with the live messages after a backlog of `count` failed messages waiting for their
   * retry time (stores whose claim cost could grow with it).
   */
  backlog?: { outbox: OutboxRepository; count: number };
  /** Iterations per bench (the same for both, so both see the same churn). @default {200} */
  n?: number;
  /** Warm-up iterations. @default {20} */
  warmup?: number;
}

/**
 * Warms both outboxes up, registers the empty/full pair for every batch size, and prints a
 * summary when the bench file
 * ends: the MEDIAN claim time of each bench (warm-up included) and their ratio. Deno's group
 * summary compares means, which on a shared machine are dominated by a few descheduled
 * iterations; the medians show the cost of the history itself.
 */
export async function registerClaimBenches(options: ClaimBenchOptions): Promise<void> {
  const { store, empty, full, history, backlog } = options;
  // Warm the outboxes (and the JIT) before anything is timed, so the first bench of the file
  // does not pay for it.
  const all = backlog ? [empty, full, backlog.outbox] : [empty, full];
  for (const outbox of [...all, ...all]) {
    for (let i = 0; i < 50; i++) await claimAndPutBack(outbox, 25);
  }
  const rows: Array<{ limit: number; empty: number[]; full: number[]; backlog: number[] }> = [];
  for (const limit of claimBatchSizes) {
    const group = `${store} claim ${limit}`;
    const n = options.n ?? iterations(limit);
    const warmup = options.warmup ?? 20;
    const row = { limit, empty: [] as number[], full: [] as number[], backlog: [] as number[] };
    rows.push(row);
    Deno.bench({
      name: `${store} claim ${limit}, empty history`,
      group,
      baseline: true,
      n,
      warmup,
      fn: async (b) => await claimAndPutBack(empty, limit, b, row.empty),
    });
    Deno.bench({
      name: `${store} claim ${limit}, ${history.toLocaleString("en")} dispatched`,
      group,
      n,
      warmup,
      fn: async (b) => await claimAndPutBack(full, limit, b, row.full),
    });
    if (backlog) {
      Deno.bench({
        name: `${store} claim ${limit}, ${backlog.count.toLocaleString("en")} retries waiting`,
        group,
        n,
        warmup,
        fn: async (b) => await claimAndPutBack(backlog.outbox, limit, b, row.backlog),
      });
    }
  }
  globalThis.addEventListener("unload", () => {
    const waiting = backlog ? `, and vs ${backlog.count.toLocaleString("en")} retries waiting` : "";
    const lines = [
      "",
      `${store}: median claim time, empty history vs ${
        history.toLocaleString("en")
      } dispatched${waiting} (target: ratio <= 1.25)`,
      "",
      backlog
        ? "| batch | empty (ms) | with history (ms) | ratio | with retry backlog (ms) | ratio |"
        : "| batch | empty (ms) | with history (ms) | ratio of medians |",
      backlog ? "| ---: | ---: | ---: | ---: | ---: | ---: |" : "| ---: | ---: | ---: | ---: |",
    ];
    for (const row of rows) {
      if (row.empty.length === 0 || row.full.length === 0) continue;
      const a = median(row.empty);
      const b = median(row.full);
      let line = `| ${row.limit} | ${a.toFixed(3)} | ${b.toFixed(3)} | ${(b / a).toFixed(2)}x |`;
      if (backlog && row.backlog.length > 0) {
        const c = median(row.backlog);
        line += ` ${c.toFixed(3)} | ${(c / a).toFixed(2)}x |`;
      }
      lines.push(line);
    }
    console.log(lines.join("\n"));
  });
}

/** Fewer iterations for the large batches of the slower stores keep a run short. */
function iterations(limit: number): number {
  return limit >= 500 ? 60 : limit >= 100 ? 120 : 200;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}
