/**
 * Dispatch throughput side by side with the broker's own limit, commit-to-PubAck latency, and the
 * dispatcher's memory while relaying 100,000 messages. Prints markdown tables to paste into
 * bench/README.md (which explains every number).
 *
 * Usage: `deno task bench:throughput [options]` (= `deno run -A bench/throughput.ts`). NATS and
 * Postgres come from OUTBOX_TEST_NATS_URL / OUTBOX_TEST_POSTGRES_URL, else private servers started
 * through the test kit (Postgres with its default, durable settings; see ./support/servers.ts).
 *
 * Options (all optional): `--count=20000` messages per throughput scenario, `--window=256`
 * PubAcks in flight for raw publishing, `--rounds=3` (every scenario runs once per round, rounds
 * interleave, the table shows medians), `--only=a,p,b,pg,pg-keys,pg-1key,sqlite,sqlite-normal,sqlite-worker,sqlite-worker-normal,kv,kv-copies,memory,otel-api,otel-sdk,
 * p-r1,p-r3,fi-r1,fi-r3,pg-r1,pg-r3,latency,rss` (a subset; the `-r1`/`-r3` scenarios run on a private
 * 3-node cluster started through the test kit, see below), `--latency-seconds=20`, `--latency-rate=1000`, `--latency-rounds=2`
 * (runs per wake-up mode, alternating which runs first), `--rss-count=100000`,
 * `--no-async-traces` (nats.js connections with `noAsyncTraces: true`), `--publisher=pipeline|
 * js.publish` (the runtime's publisher in the dispatcher scenarios), `--limit` and
 * `--max-in-flight` (dispatcher options), `--pg-connections=1` (the Postgres relay's pool size, 1
 * as docs/sql.md advises; a baseline checkout older than this option keeps its 4), `--twin-limit=N`
 * (every dispatcher scenario also runs with `limit` N, see `twinLimit`), `--timeline` (each
 * dispatcher scenario also prints its claim and mark latencies and how full its in-flight window
 * was, see ./support/timeline.ts). BENCH_CHILD_FLAGS passes `deno run` flags to every
 * scenario process (for example `--cpu-prof --cpu-prof-dir=.tmp/prof`).
 *
 * R3 vs R1: when a `-r1`/`-r3` scenario is wanted, a private 3-node JetStream cluster
 * (`NatsCluster` from the test kit, local nats-server binary) is started; the client connects to
 * node n1, the R1 stream is placed on n1, the R3 stream is replicated on all three (its leader
 * wherever the cluster puts it, reported in the output). `fi-r1`/`fi-r3` publish the same messages
 * as nats-server 2.14+'s fast-ingest batches (`--fi-batch=1000` messages per batch,
 * `--fi-ack-interval=10`) to a stream with `allow_batched`: they need such a server, for example
 * `OUTBOX_NATS_SERVER_BIN=$(deno run -A scripts/fetch_nats_server.ts --path sid)`.
 *
 * Every scenario runs in its own subprocess (./throughput/*.ts), so its peak RSS (VmHWM) is its
 * own; stores and streams are prepared here, before the subprocess starts its clock. After each
 * scenario the stream must hold exactly `count` messages and the store must report `count`
 * dispatched.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import postgres from "postgres";
import {
  createOutboxBucket,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  type OutboxRecord,
  type OutboxRepository,
  postgresJsExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { NatsCluster, uniqueName } from "../tests/kit/mod.ts";
import { createBenchDatabase } from "./support/postgres.ts";
import { postgresCpu } from "./support/postgres_cpu.ts";
import type { PoolPlans, SizeSummary } from "./support/batch_sizes.ts";
import type { TimelineSummary } from "./support/timeline.ts";
import { records } from "./support/records.ts";
import { benchServers } from "./support/servers.ts";
import { referenceSchema, referenceSeed } from "./support/reference.ts";
import { mb } from "./support/rss.ts";
import { openSqliteFile } from "./support/sqlite.ts";
import { resultPrefix, type ScenarioResult } from "./throughput/child.ts";
import type { CommitLatencyConfig } from "./throughput/commit_latency.ts";
import type { OutboxDispatchConfig } from "./throughput/outbox_dispatch.ts";
import type { RawPublishConfig } from "./throughput/raw_publish.ts";
import type { ReferenceDispatchConfig } from "./throughput/reference_dispatch.ts";

const { values: args } = parseArgs({
  args: Deno.args,
  options: {
    count: { type: "string", default: "20000" },
    window: { type: "string", default: "256" },
    rounds: { type: "string", default: "3" },
    only: { type: "string" },
    "latency-seconds": { type: "string", default: "20" },
    "latency-rate": { type: "string", default: "1000" },
    "latency-rounds": { type: "string", default: "2" },
    "rss-count": { type: "string", default: "100000" },
    "fi-batch": { type: "string", default: "1000" },
    "fi-ack-interval": { type: "string", default: "10" },
    "no-async-traces": { type: "boolean", default: false },
    publisher: { type: "string" },
    limit: { type: "string" },
    "max-in-flight": { type: "string" },
    "pg-connections": { type: "string" },
    baseline: { type: "string" },
    "twin-limit": { type: "string" },
    timeline: { type: "boolean", default: false },
  },
});
const count = Number(args.count);
/** Scenarios `fi-r*`: messages per fast-ingest batch and the `ackInterval` asked for. */
const fiBatch = Number(args["fi-batch"]);
const fiAckInterval = Number(args["fi-ack-interval"]);
/** The single-ordering-key scenario relays one message per round trip: fewer messages. */
const singleKeyCount = Math.min(count, 2_000);
const window = Number(args.window);
const rounds = Number(args.rounds);
const noAsyncTraces = args["no-async-traces"];
/** The runtime's `publisher` option for the dispatcher scenarios (its default when not given). */
const publisher = args.publisher;
/** Dispatcher options for every dispatcher scenario (the library defaults when not given). */
const dispatcherOptions = {
  limit: args.limit === undefined ? undefined : Number(args.limit),
  maxInFlight: args["max-in-flight"] === undefined ? undefined : Number(args["max-in-flight"]),
  /**
   * The Postgres relay's pool size (postgres.js `max`): 1 when not given, as docs/sql.md advises
   * for a relay's own instance. Passed explicitly, so a `--baseline` checkout gets it too.
   */
  postgresConnections: args["pg-connections"] === undefined ? 1 : Number(args["pg-connections"]),
  /** `--timeline`: claim and mark latencies and window use (./support/timeline.ts). */
  timeline: args.timeline,
};
const only = args.only ? new Set(args.only.split(",")) : undefined;
/**
 * `--baseline=DIR`: a checkout of another version of the library (`git archive <rev> | tar -x -C
 * DIR`); every selected dispatcher scenario also runs with DIR's scenario script (so DIR's
 * library), next to the current one in each round (which runs first alternates from round to
 * round), on a store prepared the same way: a SQL
 * store at the schema version DIR's `migrate()` brings it to (see `schemaVersionOf`), so each
 * side runs on the tables its own deployment would have.
 */
const baseline = args.baseline === undefined ? undefined : Deno.realPathSync(args.baseline);
/**
 * `--twin-limit=N`: every selected dispatcher scenario (those `--baseline` twins) also runs with
 * the dispatcher's `limit` set to N (id `<id>@L<N>`), next to it in each round (which of them runs
 * first alternates, as with `--baseline`), so two claim sizes with the same in-flight window are
 * compared in one run.
 */
const twinLimit = args["twin-limit"] === undefined ? undefined : Number(args["twin-limit"]);
if (twinLimit !== undefined && !(Number.isInteger(twinLimit) && twinLimit > 0)) {
  console.error(
    `--twin-limit must be a positive integer, got ${JSON.stringify(args["twin-limit"])}`,
  );
  Deno.exit(2);
}
const schemaVersions = new Map<string, Promise<number>>();
/**
 * The SQL schema version the library at `root` migrates to (its number of artifacts), asked in a
 * process of its own (its own import map); `undefined` (this checkout's latest) without a root.
 * A baseline older than a schema change then runs on the tables it made, not on this one's.
 */
function schemaVersionOf(root: string | undefined): Promise<number | undefined> {
  if (root === undefined) return Promise.resolve(undefined);
  let version = schemaVersions.get(root);
  if (version === undefined) {
    version = new Deno.Command(Deno.execPath(), {
      args: [
        "eval",
        'import { getSqlOutboxMigrations } from "./mod.ts"; console.log(getSqlOutboxMigrations({ dialect: "sqlite" }).length);',
      ],
      cwd: root,
      stdout: "piped",
      stderr: "inherit",
    }).output().then((output) => {
      const text = new TextDecoder().decode(output.stdout).trim();
      if (!output.success || !/^\d+$/.test(text)) {
        throw new Error(`cannot read the schema version of ${root}: ${text}`);
      }
      console.error(`${root}: SQL stores prepared at schema version ${text}`);
      return Number(text);
    });
    schemaVersions.set(root, version);
  }
  return version;
}
/** The dispatcher scenarios that get a baseline twin. */
const baselineIds = new Set([
  "pg",
  "pg-keys",
  "pg-1key",
  "sqlite",
  "sqlite-normal",
  "sqlite-worker",
  "sqlite-worker-normal",
  "kv",
  "kv-copies",
  "memory",
]);
const wanted = (id: string) => only === undefined || only.has(id);

// --- scenarios -------------------------------------------------------------------------------

interface Scenario {
  id: string;
  label: string;
  /** The checkout whose scenario scripts run (`--baseline`); this one when not given. */
  root?: string;
  /** The dispatcher's `limit` for this scenario alone (a `--twin-limit` twin). */
  limit?: number;
  /**
   * Prepares the store and stream, returns the subprocess file and config, and a check; a SQL
   * store at the schema version `root`'s library migrates to.
   */
  prepare(root?: string): Promise<Prepared>;
}

interface Prepared {
  file: string;
  config: unknown;
  /** Verifies the outcome and removes what `prepare` created. */
  finish(): Promise<void>;
}

const servers = await benchServers();
Deno.addSignalListener("SIGINT", () => {
  // Private servers must not outlive an interrupted run.
  void Promise.resolve(servers[Symbol.asyncDispose]()).finally(() => Deno.exit(130));
});
// Everything else runs inside main(), so the private servers are stopped whatever happens
// (an uncaught error does not dispatch "unload").
try {
  await main();
} finally {
  await servers[Symbol.asyncDispose]();
}

async function main(): Promise<void> {
  const nats = servers.natsUrl;
  const nc = await connect({ servers: nats });
  const jsm = await jetstreamManager(nc);
  const database = await createBenchDatabase("throughput", servers.postgresUrl);
  const sql = postgres(database.url, { max: 2, onnotice: () => {} });
  const postmaster = await postmasterPid(sql);
  /**
   * CPU seconds used so far by the Postgres server (the postmaster, its live processes, and the
   * ones it reaped), when it runs on this machine; `undefined` otherwise. Only meaningful with a
   * private server: a shared one also counts everybody else's work.
   */
  const postgresCpuSeconds = (): number | undefined =>
    postmaster === undefined ? undefined : processTreeCpuSeconds(postmaster);
  const natsServer = listeningPid(new URL(nats.replace(/^nats:/, "http:")).port || "4222");
  /**
   * CPU seconds used so far by the nats-server process serving `nats`, when it runs on this
   * machine (found by its listening port); `undefined` otherwise. Like Postgres's, only
   * meaningful when nothing else uses that server meanwhile.
   */
  const natsCpuSeconds = (): number | undefined =>
    natsServer === undefined ? undefined : processCpuSeconds(natsServer);

  async function stream(
    on: { jsm: typeof jsm; config: Record<string, unknown> } = { jsm, config: {} },
  ): Promise<
    { name: string; prefix: string; verify(n: number): Promise<void> }
  > {
    const name = uniqueName("bench_stream");
    const prefix = uniqueName("bench");
    await on.jsm.streams.add({ name, subjects: [`${prefix}.>`], ...on.config });
    return {
      name,
      prefix,
      async verify(n) {
        const jsm = on.jsm;
        try {
          const info = await jsm.streams.info(name);
          if (info.state.messages !== n) {
            throw new Error(`stream ${name} holds ${info.state.messages} messages, expected ${n}`);
          }
        } finally {
          await jsm.streams.delete(name).catch(() => {});
        }
      },
    };
  }

  async function enqueueAll(outbox: OutboxRepository, batch: OutboxRecord[]): Promise<void> {
    for (let i = 0; i < batch.length; i += 1_000) {
      await outbox.enqueueMany(batch.slice(i, i + 1_000));
    }
  }

  function traceparents(batch: OutboxRecord[]): OutboxRecord[] {
    // What an instrumented enqueue stores: a W3C trace context per record.
    const hex = (bytes: number) =>
      Array.from(
        crypto.getRandomValues(new Uint8Array(bytes)),
        (b) => b.toString(16).padStart(2, "0"),
      )
        .join("");
    return batch.map((record) => ({
      ...record,
      headers: { ...record.headers, traceparent: `00-${hex(16)}-${hex(8)}-01` },
    }));
  }

  async function postgresOutbox(
    n: number,
    traced = false,
    target?: { jsm: typeof jsm; config: Record<string, unknown> },
    orderingKeys = 0,
    root?: string,
  ): Promise<
    {
      tables: SqlOutboxTables;
      prefix: string;
      tag: string;
      finish(expected?: number): Promise<void>;
    }
  > {
    const s = await stream(target);
    const base = uniqueName("tp").slice(0, 40);
    const tables = { outbox: `${base}_outbox`, inbox: `${base}_inbox` };
    const executor = postgresJsExecutor(sql);
    await migrate(executor, { dialect: "postgres", tables, to: await schemaVersionOf(root) });
    const tag = uniqueName("m");
    const plain = records(tag, s.prefix, n);
    // With ordering keys, message i gets key i % orderingKeys (enqueued round-robin over keys).
    const batch = orderingKeys > 0
      ? plain.map((record, i) => ({ ...record, orderingKey: `key-${i % orderingKeys}` }))
      : plain;
    const outbox = new SqlOutboxRepository(executor, "postgres", tables);
    await enqueueAll(outbox, traced ? traceparents(batch) : batch);
    await sql.unsafe(`VACUUM ANALYZE ${tables.outbox}`);
    return {
      tables,
      prefix: s.prefix,
      tag,
      async finish(expected = n) {
        const stats = await outbox.stats();
        await sql.unsafe(
          `DROP TABLE IF EXISTS ${tables.outbox}, ${tables.inbox}, ${tables.outbox}_migrations`,
        );
        if (stats.dispatched !== expected) {
          await s.verify(expected).catch(() => {});
          throw new Error(`${stats.dispatched} of ${expected} dispatched`);
        }
        await s.verify(expected);
      },
    };
  }

  /** The SQLite relay; `synchronous` sets that pragma in the relay's process (else SQLite's default). */
  function sqliteScenario(
    id: string,
    label: string,
    synchronous?: "NORMAL",
    worker = false,
  ): Scenario {
    return {
      id,
      label,
      async prepare(root) {
        const s = await stream();
        const dir = await Deno.makeTempDir({ prefix: "outbox_bench_tp_" });
        const path = `${dir}/outbox.db`;
        const db = openSqliteFile(path);
        const executor = nodeSqliteExecutor(db);
        await migrate(executor, { dialect: "sqlite", to: await schemaVersionOf(root) });
        await enqueueAll(
          new SqlOutboxRepository(executor, "sqlite"),
          records(uniqueName("m"), s.prefix, count),
        );
        db.exec("ANALYZE");
        db.close();
        const config: OutboxDispatchConfig = {
          natsUrl: nats,
          store: "sqlite",
          count,
          telemetry: "off",
          sqlitePath: path,
          ...(synchronous ? { sqliteSynchronous: synchronous } : {}),
          ...(worker ? { sqliteWorker: true } : {}),
        };
        return {
          file: "outbox_dispatch.ts",
          config,
          async finish() {
            const check = openSqliteFile(path);
            const stats = await new SqlOutboxRepository(nodeSqliteExecutor(check), "sqlite")
              .stats();
            check.close();
            await Deno.remove(dir, { recursive: true });
            if (stats.dispatched !== count) {
              throw new Error(`${stats.dispatched} of ${count} dispatched`);
            }
            await s.verify(count);
          },
        };
      },
    };
  }

  /**
   * The NATS KV relay; `markerCopies: true`: producer and relay write markers with copies of
   * their records (`NatsKvOutboxOptions.markerCopies`), so claims read no record. Otherwise the
   * producer has the library's default (deferred copies: its markers get their copy after the
   * enqueue; `close()` waits for them, before the clock starts); a `--baseline` checkout's twin
   * gets markers without copies, as that library's default enqueue wrote them before deferred
   * copies (and as it still does if it is older).
   */
  function kvScenario(id: string, label: string, markerCopies: boolean): Scenario {
    return {
      id,
      label,
      async prepare(root) {
        const s = await stream();
        const bucket = uniqueName("outbox_bench_tp");
        const kv = await createOutboxBucket(new Kvm(nc), bucket);
        const producerCopies = markerCopies
          ? true
          : baseline !== undefined && root === baseline
          ? false
          : undefined;
        const outbox = new NatsKvOutboxRepository(kv, { markerCopies: producerCopies });
        await enqueueAll(outbox, records(uniqueName("m"), s.prefix, count));
        await outbox.close();
        const config: OutboxDispatchConfig = {
          natsUrl: nats,
          store: "nats-kv",
          count,
          telemetry: "off",
          bucket,
          markerCopies,
        };
        return {
          file: "outbox_dispatch.ts",
          config,
          async finish() {
            const check = new NatsKvOutboxRepository(kv);
            const stats = await check.stats();
            await check.close();
            await kv.destroy();
            if (stats.dispatched !== count) {
              throw new Error(`${stats.dispatched} of ${count} dispatched`);
            }
            await s.verify(count);
          },
        };
      },
    };
  }

  function dispatcherScenario(
    id: string,
    label: string,
    telemetry: OutboxDispatchConfig["telemetry"],
    orderingKeys = 0,
    messages = count,
  ): Scenario {
    return {
      id,
      label,
      async prepare(root) {
        const prepared = await postgresOutbox(
          messages,
          telemetry === "sdk",
          undefined,
          orderingKeys,
          root,
        );
        const config: OutboxDispatchConfig = {
          natsUrl: nats,
          store: "postgres",
          count: messages,
          telemetry,
          postgresUrl: database.url,
          tables: prepared.tables,
        };
        return { file: "outbox_dispatch.ts", config, finish: () => prepared.finish() };
      },
    };
  }

  // A private 3-node cluster for the R1/R3 scenarios, started on first use.
  let cluster:
    | { url: string; jsm: typeof jsm; nc: NatsConnection; stop(): Promise<void> }
    | undefined;
  async function onCluster(): Promise<NonNullable<typeof cluster>> {
    if (cluster) return cluster;
    const started = await NatsCluster.start();
    const url = started.nodes[0].server.url;
    const clusterNc = await connect({ servers: url });
    cluster = {
      url,
      jsm: await jetstreamManager(clusterNc),
      nc: clusterNc,
      async stop() {
        await clusterNc.close();
        await started.stop();
      },
    };
    console.error(`cluster: 3 nodes (${started.urls.join(", ")}), the client on n1`);
    return cluster;
  }
  /** The R1 stream sits on n1, where the client is; the R3 stream on all three nodes. */
  const replicated = (replicas: 1 | 3): Record<string, unknown> =>
    replicas === 1 ? { num_replicas: 1, placement: { tags: ["node:n1"] } } : { num_replicas: 3 };
  async function clusterStream(replicas: 1 | 3) {
    const c = await onCluster();
    const s = await stream({ jsm: c.jsm, config: replicated(replicas) });
    const info = await c.jsm.streams.info(s.name);
    console.error(`  R${replicas} stream ${s.name}: leader ${info.cluster?.leader ?? "?"}`);
    return { c, s };
  }
  function clusterPipeline(replicas: 1 | 3): Scenario {
    return {
      id: `p-r${replicas}`,
      label:
        `(f) PubAckPipeline, no store, ${window} in flight, 3-node cluster, R${replicas} stream`,
      async prepare() {
        const { c, s } = await clusterStream(replicas);
        const config: RawPublishConfig = {
          natsUrl: c.url,
          prefix: s.prefix,
          tag: uniqueName("pipe"),
          count,
          window,
          publisher: "pipeline",
        };
        return { file: "raw_publish.ts", config, finish: () => s.verify(count) };
      },
    };
  }
  /** nats-server 2.14+'s fast-ingest batches on the cluster (for comparison with `p-r*`). */
  function clusterFastIngest(replicas: 1 | 3): Scenario {
    return {
      id: `fi-r${replicas}`,
      label: `(f) fast-ingest batches of ${fiBatch} (ackInterval ${fiAckInterval}), no store, ` +
        `3-node cluster, R${replicas} stream`,
      async prepare() {
        const c = await onCluster();
        const s = await stream({
          jsm: c.jsm,
          config: { ...replicated(replicas), allow_batched: true },
        });
        const config: RawPublishConfig = {
          natsUrl: c.url,
          prefix: s.prefix,
          tag: uniqueName("fi"),
          count,
          window,
          publisher: "fast-ingest",
          batchSize: fiBatch,
          ackInterval: fiAckInterval,
        };
        return { file: "raw_publish.ts", config, finish: () => s.verify(count) };
      },
    };
  }
  function clusterDispatcher(replicas: 1 | 3): Scenario {
    return {
      id: `pg-r${replicas}`,
      label: `(f) OutboxDispatcher, Postgres, 3-node cluster, R${replicas} stream`,
      async prepare() {
        const c = await onCluster();
        const prepared = await postgresOutbox(count, false, {
          jsm: c.jsm,
          config: replicated(replicas),
        });
        const config: OutboxDispatchConfig = {
          natsUrl: c.url,
          store: "postgres",
          count,
          telemetry: "off",
          postgresUrl: database.url,
          tables: prepared.tables,
        };
        return { file: "outbox_dispatch.ts", config, finish: () => prepared.finish() };
      },
    };
  }

  const scenarios: Scenario[] = [
    {
      id: "a",
      label: `(a) raw JetStream publish, ${window} PubAcks in flight`,
      async prepare() {
        const s = await stream();
        const config: RawPublishConfig = {
          natsUrl: nats,
          prefix: s.prefix,
          tag: uniqueName("raw"),
          count,
          window,
          publisher: "js.publish",
        };
        return { file: "raw_publish.ts", config, finish: () => s.verify(count) };
      },
    },
    {
      id: "p",
      label: `(p) PubAckPipeline, no store, ${window} PubAcks in flight (the ceiling)`,
      async prepare() {
        const s = await stream();
        const config: RawPublishConfig = {
          natsUrl: nats,
          prefix: s.prefix,
          tag: uniqueName("pipe"),
          count,
          window,
          publisher: "pipeline",
        };
        return { file: "raw_publish.ts", config, finish: () => s.verify(count) };
      },
    },
    {
      id: "b",
      label: "(b) reference algorithm, Postgres (v1 schema, claim 25, publish + UPDATE each)",
      async prepare() {
        const s = await stream();
        const table = uniqueName("ref").slice(0, 40);
        for (const statement of referenceSchema(table, `${table}_in`)) await sql.unsafe(statement);
        await referenceSeed(sql, table, records(uniqueName("r"), s.prefix, count));
        await sql.unsafe(`VACUUM ANALYZE ${table}`);
        const config: ReferenceDispatchConfig = {
          natsUrl: nats,
          postgresUrl: database.url,
          table,
          count,
        };
        return {
          file: "reference_dispatch.ts",
          config,
          async finish() {
            await sql.unsafe(`DROP TABLE IF EXISTS ${table}, ${table}_in`);
            await s.verify(count);
          },
        };
      },
    },
    dispatcherScenario("pg", "(c) OutboxDispatcher, Postgres (postgres.js)", "off"),
    dispatcherScenario(
      "pg-keys",
      "(c) OutboxDispatcher, Postgres, 1,000 ordering keys",
      "off",
      1_000,
    ),
    dispatcherScenario(
      "pg-1key",
      `(c) OutboxDispatcher, Postgres, one ordering key (${singleKeyCount} messages)`,
      "off",
      1,
      singleKeyCount,
    ),
    sqliteScenario("sqlite", "(c) OutboxDispatcher, SQLite (node:sqlite, WAL file)"),
    sqliteScenario(
      "sqlite-normal",
      "(c) OutboxDispatcher, SQLite, WAL file, synchronous = NORMAL",
      "NORMAL",
    ),
    sqliteScenario(
      "sqlite-worker",
      "(c) OutboxDispatcher, SQLite, WAL file, statements on a worker thread (sqliteWorkerExecutor)",
      undefined,
      true,
    ),
    sqliteScenario(
      "sqlite-worker-normal",
      "(c) OutboxDispatcher, SQLite, WAL file, worker thread, synchronous = NORMAL",
      "NORMAL",
      true,
    ),
    kvScenario("kv", "(c) OutboxDispatcher, NATS KV", false),
    kvScenario(
      "kv-copies",
      "(c) OutboxDispatcher, NATS KV, markerCopies (markers carry their records)",
      true,
    ),
    {
      id: "memory",
      label: "(c') OutboxDispatcher, memory store (engine only; enqueued in-process)",
      async prepare() {
        const s = await stream();
        const config: OutboxDispatchConfig = {
          natsUrl: nats,
          store: "memory",
          count,
          telemetry: "off",
          prefix: s.prefix,
          tag: uniqueName("m"),
        };
        return { file: "outbox_dispatch.ts", config, finish: () => s.verify(count) };
      },
    },
    dispatcherScenario("otel-api", "(d) = (c) Postgres + OutboxTelemetry, no SDK", "api"),
    dispatcherScenario(
      "otel-sdk",
      "(e) = (c) Postgres + OutboxTelemetry + OpenTelemetry SDK",
      "sdk",
    ),
    clusterPipeline(1),
    clusterPipeline(3),
    clusterFastIngest(1),
    clusterFastIngest(3),
    clusterDispatcher(1),
    clusterDispatcher(3),
  ];

  /** Extra `deno run` flags for the scenario processes, e.g. `--cpu-prof --cpu-prof-dir=.tmp/prof`. */
  const childFlags = (Deno.env.get("BENCH_CHILD_FLAGS") ?? "").split(" ").filter(Boolean);

  async function runChild(
    file: string,
    config: unknown,
    root?: string,
  ): Promise<ScenarioResult> {
    const script = root === undefined
      ? new URL(`./throughput/${file}`, import.meta.url).pathname
      : `${root}/bench/throughput/${file}`;
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        ...childFlags,
        script,
        JSON.stringify({ ...dispatcherOptions, publisher, ...(config as object), noAsyncTraces }),
      ],
      stdout: "piped",
      stderr: "inherit",
    }).output();
    const text = new TextDecoder().decode(output.stdout);
    const line = text.split("\n").find((l) => l.startsWith(resultPrefix));
    if (!output.success || !line) {
      throw new Error(`${file} failed (exit ${output.code}):\n${text}`);
    }
    for (const other of text.split("\n")) {
      if (other && !other.startsWith(resultPrefix)) console.error(`  ${file}: ${other}`);
    }
    return JSON.parse(line.slice(resultPrefix.length)) as ScenarioResult;
  }

  async function run(scenario: Scenario): Promise<ScenarioResult> {
    const prepared = await scenario.prepare(scenario.root);
    let result: ScenarioResult;
    const serverCpu = postgresCpuSeconds();
    // Scenarios on the private cluster (-r1/-r3) use other servers: no NATS figure for them.
    const onNats = (prepared.config as { natsUrl?: string }).natsUrl === nats;
    const natsCpu = onNats ? natsCpuSeconds() : undefined;
    try {
      const config = scenario.limit === undefined
        ? prepared.config
        : { ...(prepared.config as object), limit: scenario.limit };
      result = await runChild(prepared.file, config, scenario.root);
    } catch (error) {
      await prepared.finish().catch(() => {});
      throw error;
    }
    const serverCpuAfter = postgresCpuSeconds();
    if (serverCpu !== undefined && serverCpuAfter !== undefined) {
      result.serverCpuSeconds = serverCpuAfter - serverCpu;
    }
    const natsCpuAfter = onNats ? natsCpuSeconds() : undefined;
    if (natsCpu !== undefined && natsCpuAfter !== undefined) {
      result.natsCpuSeconds = natsCpuAfter - natsCpu;
    }
    await prepared.finish();
    return result;
  }

  // --- machine ---------------------------------------------------------------------------------

  function loadAverage(): string {
    try {
      return Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
    } catch {
      return "n/a";
    }
  }

  function cpuModel(): string {
    try {
      const match = Deno.readTextFileSync("/proc/cpuinfo").match(/^model name\s*:\s*(.+)$/m);
      return match?.[1] ?? "n/a";
    } catch {
      return "n/a";
    }
  }

  async function machine(connection: NatsConnection): Promise<string[]> {
    const [row] = await sql.unsafe("SHOW server_version");
    return [
      `- date: ${new Date().toISOString()}`,
      `- machine: ${navigator.hardwareConcurrency} CPUs (nproc), ${cpuModel()}, ${
        (Deno.systemMemoryInfo().total / 2 ** 30).toFixed(1)
      } GiB RAM`,
      `- Deno ${Deno.version.deno} (V8 ${Deno.version.v8}), Postgres ${row.server_version}, nats-server ${
        connection.info?.version ?? "?"
      }`,
      `- servers: ${servers.description}`,
      `- load average (1/5/15 min) at start: ${loadAverage()}`,
    ];
  }

  // --- main ------------------------------------------------------------------------------------

  const rate = (r: ScenarioResult) => r.messages / r.seconds;
  const median = (values: number[]) => {
    const sorted = [...values].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  };
  const cpuPerMessage = (r: ScenarioResult) =>
    r.cpuSeconds === undefined ? "-" : (r.cpuSeconds * 1e6 / r.messages).toFixed(1);
  const mainCpuPerMessage = (r: ScenarioResult) =>
    typeof r.mainThreadCpuSeconds !== "number"
      ? "-"
      : (r.mainThreadCpuSeconds * 1e6 / r.messages).toFixed(1);
  const serverCpuPerMessage = (r: ScenarioResult) =>
    typeof r.serverCpuSeconds !== "number"
      ? "-"
      : (r.serverCpuSeconds * 1e6 / r.messages).toFixed(1);
  const natsCpuPerMessage = (r: ScenarioResult) =>
    typeof r.natsCpuSeconds !== "number" ? "-" : (r.natsCpuSeconds * 1e6 / r.messages).toFixed(1);
  const fmt = (n: number) => Math.round(n).toLocaleString("en");
  /** A dispatcher scenario's claim and mark sizes and, on Postgres, how its statements were planned. */
  const batchLines = (r: ScenarioResult): string[] => {
    const lines: string[] = [];
    const sizes = (s: SizeSummary) =>
      `${s.calls} calls, ${s.total} total, min ${s.min} p50 ${s.p50} max ${s.max} (size:count ${s.common})`;
    if (r.claimSizes) lines.push(`claimDue sizes: ${sizes(r.claimSizes as SizeSummary)}`);
    if (r.markSizes) lines.push(`markMany sizes: ${sizes(r.markSizes as SizeSummary)}`);
    const timeline = r.timeline as TimelineSummary | undefined;
    if (timeline) {
      const ms = (n: number) => n.toFixed(1);
      const pct = (n: number) => `${(100 * n).toFixed(0)}%`;
      lines.push(
        `timeline: claimDue p50 ${ms(timeline.claimP50Ms)} / p90 ${
          ms(timeline.claimP90Ms)
        } ms, markMany p50 ${ms(timeline.markP50Ms)} / p90 ${
          ms(timeline.markP90Ms)
        } ms; in flight ${timeline.meanInFlight.toFixed(0)} on average, below half the window ${
          pct(timeline.belowHalf)
        } of the time, empty ${pct(timeline.empty)}`,
      );
    }
    const pool = r.plans as PoolPlans | undefined;
    const plans = pool?.statements;
    if (pool?.backendCpuSeconds !== undefined) {
      lines.push(
        `the relay's ${
          new Set(plans?.map((p) => p.connection)).size
        } backends (their whole life, connecting included): ${
          (pool.backendCpuSeconds * 1e6 / r.messages).toFixed(1)
        } µs CPU/msg`,
      );
    }
    if (plans && plans.length > 0) {
      const executions = plans.reduce((sum, p) => sum + p.generic + p.custom, 0);
      lines.push(
        `prepared statements: ${plans.length} on ${
          new Set(plans.map((p) => p.connection)).size
        } connections, ${executions} executions (${
          (executions / r.messages).toFixed(4)
        } per message), ${plans.reduce((sum, p) => sum + p.custom, 0)} custom plans, ${
          plans.reduce((sum, p) => sum + p.generic, 0)
        } generic`,
      );
      for (const p of plans) {
        if (p.generic + p.custom > 1) {
          lines.push(
            `  conn ${p.connection}: custom ${p.custom} generic ${p.generic}: ${p.statement}`,
          );
        }
      }
    }
    return lines;
  };
  const ratio = (
    n: number | undefined,
  ) => (n === undefined || !Number.isFinite(n) ? "-" : `${n.toFixed(2)}x`);

  const header = await machine(nc);
  const began = performance.now();
  const results = new Map<string, ScenarioResult[]>();
  try {
    // Latency first, on a fresh cluster: after the throughput scenarios, Postgres' background work
    // (checkpoints, autovacuum of the dropped tables) made whichever mode ran first look slower.
    const latencyLines: string[] = [];
    if (wanted("latency")) {
      const latencyRate = Number(args["latency-rate"]);
      const seconds = Number(args["latency-seconds"]);
      latencyLines.push(
        "",
        `Commit-to-PubAck latency on Postgres, ${
          fmt(latencyRate)
        } transactions/s offered (one message each) for ${seconds} s after a 2 s warm-up; median of ${
          args["latency-rounds"]
        } run(s) per mode, alternating which mode runs first (ms):`,
        "",
        "| wake-up | offered msg/s | commit -> PubAck p50 | p90 | p99 | max | commit -> claimed p50 / p99 | claimed -> PubAck p50 / p99 | commit -> marked p50 / p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
      );
      // Alternating order (notify, listen, then listen, notify, ...): whichever mode runs first
      // on the fresh database measured slower, so one run of each would compare orders, not
      // wake paths. The table shows the median of every figure over the rounds.
      const latencyRounds = Number(args["latency-rounds"]);
      const byWake = new Map<string, ScenarioResult[]>();
      // The server's CPU per message (a local cluster only): NOTIFY costs the server more than
      // the relay, and on a small machine that is what slows the claims down.
      const serverCpu = await postgresCpu(sql);
      for (let round = 0; round < latencyRounds; round++) {
        const order = round % 2 === 0
          ? ["notify", "listen"] as const
          : ["listen", "notify"] as const;
        for (const wake of order) {
          const prepared = await postgresOutbox(0);
          // Flush what earlier runs left in the WAL, so a checkpoint does not land in the
          // middle of one mode and not the other.
          await sql.unsafe("CHECKPOINT").catch(() => {});
          const config: CommitLatencyConfig = {
            natsUrl: nats,
            postgresUrl: database.url,
            tables: prepared.tables,
            prefix: prepared.prefix,
            tag: uniqueName("lat"),
            rate: latencyRate,
            seconds,
            warmupSeconds: 2,
            wake,
          };
          const serverCpuBefore = serverCpu?.();
          const result = await runChild("commit_latency.ts", config);
          const serverCpuAfter = serverCpu?.();
          const total = Math.round(latencyRate * (seconds + 2));
          const serverCpuPerMessage = serverCpuBefore === undefined || serverCpuAfter === undefined
            ? "n/a"
            : ((serverCpuAfter - serverCpuBefore) * 1e6 / total).toFixed(0);
          await prepared.finish(total);
          const ack = result.commitToAck as Record<string, number>;
          console.error(
            `latency round ${round + 1}/${latencyRounds} (${wake}): p50 ${
              ack.p50.toFixed(1)
            } ms, p99 ${ack.p99.toFixed(1)} ms, ${total} messages, ${result.claims} claims of ${
              Number(result.meanClaimed).toFixed(1)
            } messages on average, ${
              Number(result.meanClaimMs).toFixed(2)
            } ms each; commit -> start of its claim p50 ${
              (result.commitToClaimStarted as Record<string, number>).p50.toFixed(1)
            } / p99 ${
              (result.commitToClaimStarted as Record<string, number>).p99.toFixed(1)
            } ms; the claim that took it lasted p50 ${
              (result.claimDuration as Record<string, number>).p50.toFixed(1)
            } / p99 ${
              (result.claimDuration as Record<string, number>).p99.toFixed(1)
            } ms; passed over by a claim started after their commit: ${result.passedOver}; CPU of the process (producers + relay) ${
              (Number(result.cpuSeconds) * 1e6 / Number(result.cpuMessages)).toFixed(0)
            } µs/msg, Postgres ${serverCpuPerMessage} µs/msg (load ${loadAverage()})`,
          );
          byWake.set(wake, [...(byWake.get(wake) ?? []), result]);
        }
      }
      for (const wake of ["notify", "listen"] as const) {
        const list = byWake.get(wake) ?? [];
        if (list.length === 0) continue;
        const q = (name: string, key: string) =>
          median(list.map((r) => (r[name] as Record<string, number>)[key]));
        const pair = (name: string) =>
          `${q(name, "p50").toFixed(1)} / ${q(name, "p99").toFixed(1)}`;
        const label = wake === "notify"
          ? "`notify()` after COMMIT"
          : "LISTEN/NOTIFY (`notify: true`)";
        latencyLines.push(
          `| ${label} | ${fmt(median(list.map((r) => Number(r.offeredRate))))} | ${
            q("commitToAck", "p50").toFixed(1)
          } | ${q("commitToAck", "p90").toFixed(1)} | ${q("commitToAck", "p99").toFixed(1)} | ${
            q("commitToAck", "max").toFixed(1)
          } | ${pair("commitToClaimed")} | ${pair("claimedToAck")} | ${pair("commitToMarked")} |`,
        );
      }
    }

    // Each wanted scenario with its twins (`--baseline`, `--twin-limit`), run one after the other;
    // the order within a group alternates from round to round, so no side always runs first.
    const groups = scenarios.filter((s) => wanted(s.id)).map((s) => {
      const group: Scenario[] = [s];
      if (baseline !== undefined && baselineIds.has(s.id)) {
        group.push({ ...s, id: `${s.id}@base`, label: `${s.label} [baseline]`, root: baseline });
      }
      if (twinLimit !== undefined && baselineIds.has(s.id)) {
        for (const side of [...group]) {
          group.push({
            ...side,
            id: `${side.id}@L${twinLimit}`,
            label: `${side.label} [limit ${twinLimit}]`,
            limit: twinLimit,
          });
        }
      }
      return group;
    });
    const selected = groups.flat();
    for (let round = 1; round <= rounds && selected.length > 0; round++) {
      const order = groups.flatMap((group) => round % 2 === 1 ? group : [...group].reverse());
      for (const scenario of order) {
        const result = await run(scenario);
        console.error(
          `round ${round}/${rounds}: ${scenario.label}: ${fmt(rate(result))} msg/s, ${
            cpuPerMessage(result)
          } µs CPU/msg (main thread ${mainCpuPerMessage(result)})${
            result.serverCpuSeconds === undefined
              ? ""
              : ` (Postgres ${serverCpuPerMessage(result)} µs/msg)`
          }${
            result.natsCpuSeconds === undefined
              ? ""
              : ` (nats-server ${natsCpuPerMessage(result)} µs/msg)`
          }, peak RSS ${mb(result.peakRss)} MB (load ${loadAverage()})`,
        );
        for (const line of batchLines(result)) console.error(`  ${line}`);
        results.set(scenario.id, [...(results.get(scenario.id) ?? []), result]);
      }
    }

    const lines: string[] = [...header];
    if (results.size > 0) {
      const medianRate = (id: string) => {
        const list = results.get(id);
        return list ? median(list.map(rate)) : undefined;
      };
      const a = medianRate("a");
      const b = medianRate("b");
      const ceiling = medianRate("p");
      lines.push(
        "",
        `${count.toLocaleString("en")} messages of ${
          records("x", "p", 1)[0].payload.length
        } bytes, 16 subjects, Nats-Msg-Id on every message; median of ${rounds} round(s) (min - max):`,
        "",
        "| scenario | msg/s | ratio to (a) | ratio to (a), paired by round | ratio to (b) | of the ceiling (p) | CPU µs/msg | main thread CPU µs/msg | Postgres CPU µs/msg | nats-server CPU µs/msg | peak RSS (MB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
      );
      // Each round's rate over the same round's raw rate (they run minutes apart at most), the
      // median and range of those: the machine's drift between rounds cancels out of it, where
      // the ratio of the two medians can pair a fast round of one with a slow round of the other.
      const rawRounds = results.get("a")?.map(rate);
      const paired = (list: ScenarioResult[]): string => {
        if (!rawRounds || rawRounds.length !== list.length) return "-";
        const ratios = list.map((r, i) => rate(r) / rawRounds[i]);
        const range = ratios.length > 1
          ? ` (${Math.min(...ratios).toFixed(2)} - ${Math.max(...ratios).toFixed(2)})`
          : "";
        return `${ratio(median(ratios))}${range}`;
      };
      for (const scenario of selected) {
        const list = results.get(scenario.id);
        if (!list) continue;
        const rates = list.map(rate);
        const m = median(rates);
        const range = list.length > 1
          ? ` (${fmt(Math.min(...rates))} - ${fmt(Math.max(...rates))})`
          : "";
        const peak = Math.max(...list.map((r) => r.peakRss ?? 0));
        const medianOf = (f: (r: ScenarioResult) => string) => {
          const values = list.map(f).filter((v) => v !== "-").map(Number);
          return values.length === 0 ? "-" : median(values).toFixed(1);
        };
        lines.push(
          `| ${scenario.label} | ${fmt(m)}${range} | ${ratio(a && m / a)} | ${paired(list)} | ${
            ratio(b && m / b)
          } | ${ceiling ? (m / ceiling).toFixed(2) : "-"} | ${medianOf(cpuPerMessage)} | ${
            medianOf(mainCpuPerMessage)
          } | ${medianOf(serverCpuPerMessage)} | ${medianOf(natsCpuPerMessage)} | ${mb(peak)} |`,
        );
      }
      const pg = medianRate("pg");
      const keyed = medianRate("pg-keys");
      if (pg && keyed) {
        lines.push(
          "",
          `Ordering keys on Postgres: 1,000 keys ${fmt(keyed)} msg/s = ${
            ratio(keyed / pg)
          } of the unordered relay (target >= 0.6x)${
            results.has("pg-1key") ? `; one key ${fmt(medianRate("pg-1key")!)} msg/s` : ""
          }.`,
        );
      }
      const api = medianRate("otel-api");
      const sdk = medianRate("otel-sdk");
      if (pg && api) {
        lines.push(
          "",
          `Telemetry without SDK: ${
            ((api / pg - 1) * 100).toFixed(1)
          }% throughput change vs (c) Postgres (medians).`,
        );
      }
      if (pg && sdk) {
        lines.push(
          `Telemetry with the SDK: ${
            ((sdk / pg - 1) * 100).toFixed(1)
          }% throughput change vs (c) Postgres (medians).`,
        );
      }
      const kv = results.get("kv");
      if (kv) {
        lines.push(
          `NATS KV: building the claim index (watch on the markers of ${
            count.toLocaleString("en")
          } messages) took ${
            fmt(median(kv.map((r) => Number(r.warmupMs))))
          } ms before the clock started.`,
        );
      }
    }

    for (const kind of ["p", "pg"] as const) {
      const list = (replicas: number) => results.get(`${kind}-r${replicas}`);
      const r1 = list(1);
      const r3 = list(3);
      if (r1 && r3) {
        const m1 = median(r1.map(rate));
        const m3 = median(r3.map(rate));
        lines.push(
          `R3 vs R1 (${
            kind === "p" ? "PubAckPipeline, no store" : "OutboxDispatcher, Postgres"
          }): ${fmt(m3)} vs ${fmt(m1)} msg/s, ${ratio(m3 / m1)} (medians, same cluster and run).`,
        );
      }
    }

    lines.push(...latencyLines);

    if (wanted("rss")) {
      const rssCount = Number(args["rss-count"]);
      const prepared = await postgresOutbox(rssCount);
      const config: OutboxDispatchConfig = {
        natsUrl: nats,
        store: "postgres",
        count: rssCount,
        telemetry: "off",
        postgresUrl: database.url,
        tables: prepared.tables,
        sampleRss: true,
        // The library's defaults, as the table says, whatever --limit / --max-in-flight the
        // throughput scenarios got (with 256 / 256 the peak was ~200 MB instead of ~178).
        limit: undefined,
        maxInFlight: undefined,
      };
      const result = await runChild("outbox_dispatch.ts", config);
      await prepared.finish();
      console.error(`rss: start ${mb(Number(result.startRss))} MB, peak ${mb(result.peakRss)} MB`);
      lines.push(
        "",
        `Dispatcher memory while relaying ${
          rssCount.toLocaleString("en")
        } messages from Postgres (defaults: limit 100, maxInFlight 100):`,
        "",
        "| messages | msg/s | RSS before the dispatcher started (MB) | max RSS sampled every 50 ms (MB) | peak RSS, VmHWM (MB) |",
        "| ---: | ---: | ---: | ---: | ---: |",
        `| ${fmt(rssCount)} | ${fmt(rate(result))} | ${mb(Number(result.startRss))} | ${
          mb(Number(result.maxSampledRss))
        } | ${mb(result.peakRss)} |`,
      );
    }

    lines.push(
      "",
      `- load average at end: ${loadAverage()}; total time ${
        ((performance.now() - began) / 1000).toFixed(0)
      } s`,
    );
    console.log(lines.join("\n"));
  } finally {
    await cluster?.stop().catch(() => {});
    await sql.end();
    await nc.close();
    await database.drop();
  }
}

/** The pid of the Postgres postmaster when it runs on this machine (its backend's parent). */
async function postmasterPid(sql: postgres.Sql): Promise<number | undefined> {
  try {
    const [row] = await sql`SELECT pg_backend_pid() AS pid`;
    const backend = procStat(Number(row.pid));
    if (backend?.comm !== "postgres") return undefined;
    return procStat(backend.ppid)?.comm === "postgres" ? backend.ppid : undefined;
  } catch {
    return undefined;
  }
}

interface ProcStat {
  comm: string;
  ppid: number;
  /** utime + stime, and cutime + cstime (reaped children), in clock ticks. */
  own: number;
  children: number;
}

function procStat(pid: number): ProcStat | undefined {
  try {
    const text = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const close = text.lastIndexOf(")");
    const comm = text.slice(text.indexOf("(") + 1, close);
    // Fields after the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17).
    const fields = text.slice(close + 2).split(" ");
    const field = (n: number) => Number(fields[n - 3]);
    return { comm, ppid: field(4), own: field(14) + field(15), children: field(16) + field(17) };
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) `pid` has used so far (clock ticks of 10 ms). */
function processCpuSeconds(pid: number): number | undefined {
  const stat = procStat(pid);
  return stat === undefined ? undefined : stat.own / 100;
}

/**
 * The pid of the local process listening on TCP `port` (Linux: the socket's inode from
 * /proc/net/tcp{,6}, then the process holding it), or `undefined` when it cannot be found (a
 * remote or containerised server, no /proc).
 */
function listeningPid(port: string): number | undefined {
  try {
    const hexPort = Number(port).toString(16).toUpperCase().padStart(4, "0");
    const inodes = new Set<string>();
    for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
      let text = "";
      try {
        text = Deno.readTextFileSync(table);
      } catch {
        continue;
      }
      for (const line of text.split("\n").slice(1)) {
        const fields = line.trim().split(/\s+/);
        // local_address is "ADDR:PORT"; state 0A is LISTEN; field 10 is the inode.
        if (fields.length > 9 && fields[1].endsWith(`:${hexPort}`) && fields[3] === "0A") {
          inodes.add(`socket:[${fields[9]}]`);
        }
      }
    }
    if (inodes.size === 0) return undefined;
    for (const entry of Deno.readDirSync("/proc")) {
      const pid = Number(entry.name);
      if (!Number.isInteger(pid)) continue;
      try {
        for (const fd of Deno.readDirSync(`/proc/${pid}/fd`)) {
          if (inodes.has(Deno.readLinkSync(`/proc/${pid}/fd/${fd.name}`))) return pid;
        }
      } catch {
        // exited, or not ours to read
      }
    }
  } catch {
    // no /proc
  }
  return undefined;
}

/** CPU seconds of `root`, its live children and the children it reaped (clock ticks of 10 ms). */
function processTreeCpuSeconds(root: number): number | undefined {
  const top = procStat(root);
  if (!top) return undefined;
  let ticks = top.own + top.children;
  for (const entry of Deno.readDirSync("/proc")) {
    const pid = Number(entry.name);
    if (!Number.isInteger(pid) || pid === root) continue;
    const stat = procStat(pid);
    if (stat?.ppid === root) ticks += stat.own;
  }
  return ticks / 100;
}
