/**
 * Scenarios (c), (d), (e) and the 100k RSS run: our `OutboxDispatcher` draining `count` messages
 * that the parent enqueued (Postgres, SQLite, NATS KV) or that this process enqueues before the
 * clock starts (memory). The clock runs from constructing the dispatcher to `whenIdle()`.
 *
 * `telemetry`: `off` (plain), `api` (OutboxTelemetry wired in, no SDK: the API's no-ops), `sdk`
 * (OutboxTelemetry with the SDK of ../support/otel_sdk.ts).
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import postgres from "postgres";
import {
  createJetStreamRuntime,
  createOutboxBucket,
  defaultMaxInFlight,
  MemoryOutboxRepository,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  OutboxDispatcher,
  type OutboxRepository,
  type OutboxRuntime,
  postgresJsExecutor,
  sqliteWorkerExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../../mod.ts";
import { OutboxTelemetry } from "../../telemetry.ts";
import type { BenchOtelSdk } from "../support/otel_sdk.ts";
import { records } from "../support/records.ts";
import { currentRss } from "../support/rss.ts";
import { openSqliteFile } from "../support/sqlite.ts";
import { readConfig, report, timed } from "./child.ts";
import { BatchSizes, type PoolPlans, preparedStatementPlans } from "../support/batch_sizes.ts";
import { DispatchTimeline } from "../support/timeline.ts";

/** Configuration of a dispatcher scenario. */
export interface OutboxDispatchConfig {
  natsUrl: string;
  /** nats.js `noAsyncTraces` connection option (no stack captured per request). */
  noAsyncTraces?: boolean;
  /** The runtime's `publisher` option. */
  publisher?: "pipeline" | "js.publish";
  store: "postgres" | "sqlite" | "nats-kv" | "memory";
  count: number;
  telemetry: "off" | "api" | "sdk";
  postgresUrl?: string;
  tables?: SqlOutboxTables;
  sqlitePath?: string;
  /** `PRAGMA synchronous` for the SQLite relay's connection (SQLite's default, FULL, if unset). */
  sqliteSynchronous?: "NORMAL";
  /** SQLite: the relay's statements on a worker thread (`sqliteWorkerExecutor`). */
  sqliteWorker?: boolean;
  bucket?: string;
  /** nats-kv: the relay's repository writes markers with copies of their records. */
  markerCopies?: boolean;
  /** memory: subject prefix and id tag of the messages to enqueue here. */
  prefix?: string;
  tag?: string;
  limit?: number;
  maxInFlight?: number;
  /** Postgres: the relay's pool size (postgres.js `max`). @default {1} */
  postgresConnections?: number;
  /** Record claim/mark latencies and window use (../support/timeline.ts). */
  timeline?: boolean;
  /** Sample RSS every 50 ms while dispatching. */
  sampleRss?: boolean;
}

if (import.meta.main) {
  const config = readConfig<OutboxDispatchConfig>();
  const nc = await connect({ servers: config.natsUrl, noAsyncTraces: config.noAsyncTraces });
  let outbox: OutboxRepository;
  let close: () => Promise<void>;
  let warmupMs = 0;
  let statementPlans: (() => Promise<PoolPlans>) | undefined;
  switch (config.store) {
    case "postgres": {
      const max = config.postgresConnections ?? 1;
      const sql = postgres(config.postgresUrl!, { max, onnotice: () => {} });
      // postgres.js connects at the first statement (~75-95 ms here: TCP, start-up, its type
      // fetch). Connect before the clock starts, as the NATS connection is and as a long-running
      // relay has long been: every connection of the pool, each opened by one of `max`
      // concurrent statements.
      await Promise.all(Array.from({ length: max }, () => sql`SELECT pg_sleep(0.01)`));
      outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", config.tables);
      statementPlans = () => preparedStatementPlans(sql, max);
      close = () => sql.end();
      break;
    }
    case "sqlite": {
      if (config.sqliteWorker) {
        // The same settings as openSqliteFile, on the worker's connection.
        const executor = await sqliteWorkerExecutor(config.sqlitePath!, {
          busyTimeoutMs: 5_000,
          synchronous: config.sqliteSynchronous,
        });
        outbox = new SqlOutboxRepository(executor, "sqlite", config.tables);
        close = () => executor.close();
        break;
      }
      const db = openSqliteFile(config.sqlitePath!);
      if (config.sqliteSynchronous) db.exec(`PRAGMA synchronous = ${config.sqliteSynchronous}`);
      outbox = new SqlOutboxRepository(nodeSqliteExecutor(db), "sqlite", config.tables);
      close = () => Promise.resolve(db.close());
      break;
    }
    case "nats-kv": {
      // Opened as docs/nats_kv.md does (createOutboxBucket: create or open), so reads are the
      // direct gets an R1 bucket allows; `Kvm#open` without `allow_direct` would read through
      // STREAM.MSG.GET, the JetStream API.
      const repository = new NatsKvOutboxRepository(
        await createOutboxBucket(new Kvm(nc), config.bucket!),
        config.markerCopies ? { markerCopies: true } : {},
      );
      // The claim index is built from a watch on the markers once per process: do it before
      // the clock starts, as a long-running dispatcher would have long done.
      const started = performance.now();
      await (await repository.watch(() => {}))();
      warmupMs = performance.now() - started;
      outbox = repository;
      close = () => repository.close();
      break;
    }
    case "memory": {
      const repository = new MemoryOutboxRepository();
      await repository.enqueueMany(records(config.tag!, config.prefix!, config.count));
      outbox = repository;
      close = () => Promise.resolve();
      break;
    }
  }

  let runtime: OutboxRuntime = createJetStreamRuntime(jetstream(nc), {
    publisher: config.publisher,
  });
  let sdk: BenchOtelSdk | undefined;
  let hooks = {};
  if (config.telemetry !== "off") {
    // Loaded only here, so the other scenarios do not carry the SDK's modules in their RSS.
    sdk = config.telemetry === "sdk"
      ? (await import("../support/otel_sdk.ts")).startOtelSdk()
      : undefined;
    const telemetry = new OutboxTelemetry(
      sdk ? { tracerProvider: sdk.tracerProvider, meterProvider: sdk.meterProvider } : {},
    );
    outbox = telemetry.instrumentOutbox(outbox);
    runtime = telemetry.instrumentRuntime(runtime);
    hooks = telemetry.hooks;
  }

  const startRss = currentRss();
  let maxSampledRss = startRss ?? 0;
  const sampler = config.sampleRss
    ? setInterval(() => {
      maxSampledRss = Math.max(maxSampledRss, currentRss() ?? 0);
    }, 50)
    : undefined;
  let batches = 0;
  let dispatched = 0;
  const sizes = new BatchSizes();
  outbox = sizes.counting(outbox);
  const timeline = config.timeline
    ? new DispatchTimeline(config.maxInFlight ?? defaultMaxInFlight)
    : undefined;
  if (timeline) {
    outbox = timeline.repository(outbox);
    runtime = timeline.runtime(runtime);
  }
  const { seconds, cpuSeconds, mainThreadCpuSeconds } = await timed(async () => {
    const dispatcher = new OutboxDispatcher(outbox, runtime, {
      ...hooks,
      limit: config.limit,
      maxInFlight: config.maxInFlight,
      idleRetryMs: false,
      onBatch: (result) => {
        batches += 1;
        dispatched += result.dispatched;
      },
      onError: (error) => console.error("dispatcher:", error),
    });
    await dispatcher.whenIdle();
    await dispatcher.stop();
  });
  if (sampler !== undefined) clearInterval(sampler);
  const plans = await statementPlans?.();
  const exported = await sdk?.shutdown();
  await close();
  await nc.close();
  if (dispatched !== config.count) throw new Error(`dispatched ${dispatched} of ${config.count}`);
  report({
    messages: dispatched,
    seconds,
    cpuSeconds,
    mainThreadCpuSeconds,
    batches,
    warmupMs,
    startRss,
    maxSampledRss: config.sampleRss ? maxSampledRss : undefined,
    spansExported: exported?.spans,
    claimSizes: sizes.claims.summary(),
    markSizes: sizes.marks.summary(),
    timeline: timeline?.summary(),
    plans,
  });
}
