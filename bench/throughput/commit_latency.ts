/**
 * Commit-to-PubAck latency on Postgres at a steady offered load: producers commit one message per
 * transaction on a fixed schedule (`rate` per second, open loop), and the dispatcher is woken
 * after each commit, either directly (`dispatcher.notify()` right after COMMIT returned) or
 * through Postgres LISTEN/NOTIFY (`notify: true` on the repository + `listenForOutboxWakeups`).
 * Latency runs from COMMIT returning to the producer to (1) the PubAck arriving in the runtime
 * and (2) the `onDispatched` hook (the outcome is recorded). The first `warmupSeconds` are not
 * counted.
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import process from "node:process";
import postgres from "postgres";
import {
  createJetStreamRuntime,
  listenForOutboxWakeups,
  OutboxDispatcher,
  postgresJsExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../../mod.ts";
import { records } from "../support/records.ts";
import { readConfig, report } from "./child.ts";

/** Configuration of the latency scenario. */
export interface CommitLatencyConfig {
  natsUrl: string;
  postgresUrl: string;
  /** The relay's pool size (postgres.js `max`). @default {1} */
  postgresConnections?: number;
  tables: SqlOutboxTables;
  prefix: string;
  tag: string;
  /** Offered load, messages (= transactions) per second. */
  rate: number;
  /** Measured seconds (after the warm-up). */
  seconds: number;
  warmupSeconds: number;
  wake: "notify" | "listen";
  /** The runtime's `publisher` option. */
  publisher?: "pipeline" | "js.publish";
}

/** The `q` quantile (0..1) of sorted `values`, nearest rank. */
function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

if (import.meta.main) {
  const config = readConfig<CommitLatencyConfig>();
  const nc = await connect({ servers: config.natsUrl });
  const producers = postgres(config.postgresUrl, { max: 8, onnotice: () => {} });
  const relay = postgres(config.postgresUrl, {
    max: config.postgresConnections ?? 1,
    onnotice: () => {},
  });
  const total = Math.round(config.rate * (config.warmupSeconds + config.seconds));
  const batch = records(config.tag, config.prefix, total);
  const index = new Map(batch.map((record, k) => [record.id, k]));
  const committedAt = new Float64Array(total);
  const ackedAt = new Float64Array(total);
  const markedAt = new Float64Array(total);

  const runtime = createJetStreamRuntime(jetstream(nc), {
    publisher: config.publisher,
    onPublished: (event) => {
      const k = index.get(event.header.id);
      if (k !== undefined) ackedAt[k] = performance.now();
    },
  });
  // Claim times too, to split the latency into "waiting to be claimed" and "claimed to PubAck".
  const claimedAt = new Float64Array(total);
  const claimStartedAt = new Float64Array(total);
  const repository = new SqlOutboxRepository(postgresJsExecutor(relay), "postgres", config.tables);
  const claimDue = repository.claimDue.bind(repository);
  let claims = 0;
  let claimedTotal = 0;
  let claimMs = 0;
  // When every claim started (the dispatcher claims one at a time), and which claim took each
  // message: a claim that started after a message's COMMIT returned sees its row, so a message
  // taken by a later one waited for a wake-up that was not acted on (or for a full batch).
  const claimStarts: number[] = [];
  const claimOf = new Int32Array(total);
  repository.claimDue = async (limit, now, options) => {
    const began = performance.now();
    claimStarts.push(began);
    const seq = claimStarts.length - 1;
    const claimed = await claimDue(limit, now, options);
    claims += 1;
    claimedTotal += claimed.length;
    claimMs += performance.now() - began;
    const at = performance.now();
    for (const message of claimed) {
      const k = index.get(message.id);
      if (k !== undefined && claimedAt[k] === 0) {
        claimedAt[k] = at;
        claimStartedAt[k] = began;
        claimOf[k] = seq;
      }
    }
    return claimed;
  };
  const dispatcher = new OutboxDispatcher(
    repository,
    runtime,
    {
      onDispatched: (message) => {
        const k = index.get(message.id);
        if (k !== undefined) markedAt[k] = performance.now();
      },
      onError: (error) => console.error("dispatcher:", error),
    },
  );
  const subscription = config.wake === "listen"
    ? await listenForOutboxWakeups(relay, {
      tables: config.tables,
      onWake: () => dispatcher.notify(),
    })
    : undefined;
  await dispatcher.whenIdle();

  const notify = config.wake === "listen";
  const commits: Promise<void>[] = [];
  // CPU of this process (producers and relay: both modes pay the producers' share alike).
  const cpuAtStart = process.cpuUsage();
  const start = performance.now();
  const intervalMs = 1000 / config.rate;
  let lagMax = 0;
  let next = 0;
  while (next < total) {
    const now = performance.now();
    while (next < total && start + next * intervalMs <= now) {
      const k = next++;
      lagMax = Math.max(lagMax, now - (start + k * intervalMs));
      commits.push(
        producers.begin(async (tx) => {
          const outbox = new SqlOutboxRepository(
            postgresJsExecutor(tx),
            "postgres",
            config.tables,
            {
              notify,
            },
          );
          await outbox.enqueue(batch[k]);
        }).then(() => {
          committedAt[k] = performance.now();
          if (!notify) dispatcher.notify();
        }),
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  const offeredSeconds = (performance.now() - start) / 1000;
  await Promise.all(commits);
  const lastCommit = Math.max(...committedAt);
  await dispatcher.whenIdle();
  const cpu = process.cpuUsage(cpuAtStart);
  await dispatcher.stop();
  await subscription?.close();
  await producers.end();
  await relay.end();
  await nc.close();

  const first = Math.round(config.rate * config.warmupSeconds);
  const toAck: number[] = [];
  const toMark: number[] = [];
  const toClaim: number[] = [];
  const claimToAck: number[] = [];
  const toClaimStart: number[] = [];
  const claimTook: number[] = [];
  let passedOver = 0;
  for (let k = first; k < total; k++) {
    if (ackedAt[k] === 0 || markedAt[k] === 0) throw new Error(`message ${k} was not dispatched`);
    toAck.push(ackedAt[k] - committedAt[k]);
    toMark.push(markedAt[k] - committedAt[k]);
    toClaim.push(claimedAt[k] - committedAt[k]);
    claimToAck.push(ackedAt[k] - claimedAt[k]);
    // Negative: the claim that took it had started before COMMIT returned to the producer.
    toClaimStart.push(claimStartedAt[k] - committedAt[k]);
    claimTook.push(claimedAt[k] - claimStartedAt[k]);
    // The first claim that started after COMMIT returned (binary search over start times).
    let low = 0;
    let high = claimStarts.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (claimStarts[middle] < committedAt[k]) low = middle + 1;
      else high = middle;
    }
    if (claimOf[k] > low) passedOver += 1;
  }
  for (const list of [toAck, toMark, toClaim, claimToAck, toClaimStart, claimTook]) {
    list.sort((a, b) => a - b);
  }
  const summary = (values: number[]) => ({
    p50: quantile(values, 0.5),
    p90: quantile(values, 0.9),
    p99: quantile(values, 0.99),
    max: values[values.length - 1],
    min: values[0],
  });
  report({
    messages: toAck.length,
    seconds: (lastCommit - start) / 1000,
    offeredRate: total / offeredSeconds,
    scheduleLagMaxMs: lagMax,
    commitToAck: summary(toAck),
    commitToMarked: summary(toMark),
    commitToClaimed: summary(toClaim),
    commitToClaimStarted: summary(toClaimStart),
    claims,
    meanClaimed: claimedTotal / claims,
    meanClaimMs: claimMs / claims,
    claimedToAck: summary(claimToAck),
    claimDuration: summary(claimTook),
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    cpuMessages: total,
    passedOver,
  });
}
