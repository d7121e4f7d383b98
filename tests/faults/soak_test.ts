/**
 * Scenario 8, soak: a long run through Postgres with one dispatcher restart (a deploy: SIGTERM,
 * graceful stop, a new process) in the middle, while the test keeps enqueueing. Every message in
 * the stream exactly once, every row dispatched, and the dispatcher's memory (VmRSS of the child
 * process, sampled from /proc/<pid>/status) flat: no growth with the number of messages.
 *
 * OUTBOX_FAULTS_SOAK_MESSAGES sets the count; the default is the full run of 200,000 (about 40 s
 * on the 2-core development machine). Lower it where the suite must be quicker.
 * OUTBOX_FAULTS_SOAK_TRACE=1 prints every RSS sample (dispatched:MB).
 */

import assert from "node:assert/strict";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, createTestStream, natsUrl } from "../kit/mod.ts";
import {
  assertExactlyOnce,
  Child,
  compareDelivery,
  deliveryFigures,
  figures,
  natsConnection,
  pgPool,
  readStreamIds,
  records,
  since,
  tableSnapshot,
  waitDispatched,
} from "./harness.ts";
import type { ChildEvent } from "./workers/protocol.ts";

const total = Number(Deno.env.get("OUTBOX_FAULTS_SOAK_MESSAGES") ?? 200_000);
const perTransaction = 1_000;

type Rss = Extract<ChildEvent, { event: "rss" }>;

/** The RSS samples of a child taken after it dispatched `from` messages (warm-up excluded). */
function samplesAfter(child: Child, from: number): Rss[] {
  return child.all("rss").filter((sample) => sample.totals.dispatched >= from);
}

const mb = (kb: number) => Math.round(kb / 102.4) / 10;

Deno.test(`soak: ${total.toLocaleString("en")} messages through Postgres with a dispatcher restart in the middle; memory stays flat`, async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const base = {
    store: { kind: "postgres" as const, url: db.url },
    natsUrl: await natsUrl(),
    dispatchers: 1,
    limit: 200,
    maxInFlight: 200,
    idleRetryMs: 50,
    rssEveryMs: 250,
  };
  const started = performance.now();
  const committed: string[] = [];
  const enqueueing = (async () => {
    for (let from = 0; from < total; from += perTransaction) {
      const batch = records(stream.prefix, "soak", from, Math.min(perTransaction, total - from));
      await pg.sql.begin((tx) =>
        new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(batch)
      );
      for (const record of batch) committed.push(record.id);
    }
  })();

  try {
    await soak();
  } finally {
    await enqueueing.catch(() => {}); // never left running behind a failed test
  }

  async function soak(): Promise<void> {
    await using first = Child.dispatcher({ ...base, name: "soak-1" });
    await first.waitFor(
      (e) => e.event === "rss" && e.totals.dispatched >= total / 2,
      600_000,
      "half of the messages",
    );
    const firstTotals = await first.stop();
    const restartedAt = performance.now();
    await using second = Child.dispatcher({ ...base, name: "soak-2" });
    await enqueueing;
    const table = await waitDispatched(() => tableSnapshot(executor), total, 600_000);
    const elapsedMs = since(started);
    const secondTotals = await second.stop();

    const delivery = compareDelivery(committed, await readStreamIds(nats.nc, stream.name));
    // Warm-up: each process's first 5% of the messages (JIT, connection pools, buffers).
    const warm1 = samplesAfter(first, total * 0.05);
    const warm2 = samplesAfter(second, total * 0.05);
    const rss = {
      startKb: warm1[0]?.kb ?? 0,
      middleKb: warm1.at(-1)?.kb ?? 0,
      restartedKb: warm2[0]?.kb ?? 0,
      endKb: warm2.at(-1)?.kb ?? 0,
      maxKb: Math.max(...[...warm1, ...warm2].map((sample) => sample.kb)),
    };
    // Per process: peak RSS of the second half of its samples against the first half.
    const halves = [warm1, warm2].map((samples) => {
      const mid = Math.floor(samples.length / 2);
      const peak = (list: Rss[]) => Math.max(...list.map((sample) => sample.kb));
      return { first: peak(samples.slice(0, mid)), second: peak(samples.slice(mid)) };
    });
    figures("soak", {
      ...deliveryFigures(delivery),
      dispatchedBeforeRestart: firstTotals.dispatched,
      dispatchedAfterRestart: secondTotals.dispatched,
      duplicateAcks: firstTotals.duplicates + secondTotals.duplicates,
      extraAttempts: table.attempts - total,
      rssMb: {
        start: mb(rss.startKb),
        middle: mb(rss.middleKb),
        afterRestart: mb(rss.restartedKb),
        end: mb(rss.endKb),
        max: mb(rss.maxKb),
        peakGrowthBetweenHalves: halves.map((h) => mb(h.second - h.first)),
      },
      rssSamples: warm1.length + warm2.length,
      restartAfterMs: Math.round(restartedAt - started),
      elapsedMs,
      messagesPerSecond: Math.round(total / (elapsedMs / 1_000)),
    });
    if (Deno.env.get("OUTBOX_FAULTS_SOAK_TRACE")) {
      for (const child of [first, second]) {
        console.log(
          child.label,
          child.all("rss").map((s) => `${s.totals.dispatched}:${mb(s.kb)}`).join(" "),
        );
      }
    }
    assertExactlyOnce(delivery);
    assert.deepEqual(table.states, { dispatched: total });
    assert.ok(warm1.length >= 4 && warm2.length >= 4, "RSS was sampled in both processes");
    // Flat: in each process, the peak RSS of the second half of its run stays within 32 MB of the
    // peak of the first half. (A leak of 1 kB per message would add 50 MB per 50,000 messages; the
    // V8 heap itself breathes by some 10-40 MB between collections.)
    for (const { first, second } of halves) {
      const growthMb = mb(second - first);
      assert.ok(growthMb < 32, `peak RSS grew by ${growthMb} MB between the halves`);
    }
  }
});
