/**
 * A dispatcher process for the fault suite: `deno run -A dispatcher.ts '<DispatcherConfig JSON>'`.
 *
 * Runs `config.dispatchers` OutboxDispatchers on one store (Postgres through postgres.js, a
 * SQLite file, or a NATS KV bucket) publishing to JetStream, and reports on stdout (one JSON
 * event per line, see protocol.ts): `ready`, `progress` totals, `paused` / `resumed`, `error`,
 * `hung`, `rss`, and `stopped` after SIGTERM (a graceful stop). The test kills it with SIGKILL
 * when the scenario calls for a crash.
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import postgres from "postgres";
import { jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  type DispatchOutboxResult,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  OutboxDispatcher,
  OutboxPublishError,
  type OutboxRepository,
  type OutboxRuntime,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../../../mod.ts";
import { type DispatcherConfig, type DispatchTotals, emit, rssKb } from "./protocol.ts";

const config = JSON.parse(Deno.args[0]) as DispatcherConfig;

const totals: DispatchTotals = {
  batches: 0,
  claimed: 0,
  dispatched: 0,
  duplicates: 0,
  failed: 0,
  unavailable: 0,
  dead: 0,
  superseded: 0,
  errors: 0,
  published: 0,
};

const nc = await connect({
  servers: config.natsUrl.split(","),
  name: config.name,
  reconnect: true,
  maxReconnectAttempts: -1,
  reconnectTimeWait: 100,
});
const timeoutMs = config.publishTimeoutMs ?? 5_000;
const base = createJetStreamRuntime(
  jetstream(nc, { timeout: config.apiTimeoutMs ?? timeoutMs }),
  { timeoutMs },
);
const failureRate = config.failureRate ?? 0;
const runtime: OutboxRuntime = {
  async publishPreparedEvent(event, options) {
    if (config.poisonFlag !== undefined && event.header.id.includes("-poison-")) {
      let poisoned = true;
      try {
        Deno.statSync(config.poisonFlag);
      } catch {
        poisoned = false;
      }
      if (poisoned) throw new OutboxPublishError("permanent", "poison", { code: "poison" });
    }
    const roll = failureRate > 0 ? Math.random() : 1;
    if (roll < failureRate / 2) {
      throw new OutboxPublishError("retryable", "injected failure", { code: "injected" });
    }
    const receipt = await base.publishPreparedEvent(event, options);
    if (roll < failureRate) {
      throw new OutboxPublishError("retryable", "injected lost ack", { code: "injected" });
    }
    totals.published += 1;
    if (totals.published === config.hangAfterPublishes) {
      // Acknowledged by JetStream, but the batch never gets to record it: the parent kills us.
      emit({ event: "hung", published: totals.published });
      await new Promise(() => {});
    }
    return receipt;
  },
  probe: () => base.probe(),
  // As the production runtime: a paused stream or subject waits for its own probe.
  probeScope: (scope) => base.probeScope(scope),
};

const closers: Array<() => Promise<void> | void> = [];
const repositories: OutboxRepository[] = [];
const store = config.store;
switch (store.kind) {
  case "postgres": {
    const sql = postgres(store.url, {
      max: config.dispatchers + 1,
      onnotice: () => {},
      connection: { application_name: config.applicationName ?? "outbox-fault-dispatcher" },
    });
    closers.push(() => sql.end({ timeout: 1 }));
    for (let i = 0; i < config.dispatchers; i++) {
      repositories.push(new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", store.tables));
    }
    break;
  }
  case "sqlite": {
    for (let i = 0; i < config.dispatchers; i++) {
      const db = new DatabaseSync(store.path);
      db.exec("PRAGMA journal_mode = WAL");
      db.exec("PRAGMA busy_timeout = 20000");
      closers.push(() => db.close());
      repositories.push(new SqlOutboxRepository(nodeSqliteExecutor(db), "sqlite"));
    }
    break;
  }
  case "kv": {
    const kv = await new Kvm(nc).open(store.bucket);
    for (let i = 0; i < config.dispatchers; i++) {
      const repository = new NatsKvOutboxRepository(kv);
      closers.push(() => repository.close());
      repositories.push(repository);
    }
    break;
  }
}

let errorsShown = 0;
const dispatchers: OutboxDispatcher[] = [];
function start(): void {
  for (const repository of repositories) {
    dispatchers.push(
      new OutboxDispatcher(repository, runtime, {
        limit: config.limit ?? 100,
        maxInFlight: config.maxInFlight ?? 100,
        leaseMs: config.leaseMs ?? 30_000,
        idleRetryMs: config.idleRetryMs ?? 100,
        ...(config.retry ? { retry: config.retry } : {}),
        probeIntervalMs: config.probeIntervalMs ?? 100,
        probeMaxIntervalMs: config.probeMaxIntervalMs ?? 1_000,
        onBatch: (result) => add(result),
        onError: (error) => {
          totals.errors += 1;
          if (errorsShown++ < 20) emit({ event: "error", message: String(error) });
        },
        onPaused: (info) => emit({ event: "paused", code: info.error.code, at: Date.now() }),
        onResumed: (info) => emit({ event: "resumed", pausedMs: info.pausedMs, at: Date.now() }),
      }),
    );
  }
}

function add(result: DispatchOutboxResult): void {
  totals.batches += 1;
  totals.claimed += result.claimed;
  totals.dispatched += result.dispatched;
  totals.duplicates += result.duplicates;
  totals.failed += result.failed;
  totals.unavailable += result.unavailable;
  totals.dead += result.dead;
  totals.superseded += result.superseded;
}

let reported = "";
let lastRss = 0;
const ticker = setInterval(() => {
  const snapshot = JSON.stringify(totals);
  if (snapshot !== reported) {
    reported = snapshot;
    emit({ event: "progress", totals: { ...totals } });
  }
  if (config.rssEveryMs !== undefined && Date.now() - lastRss >= config.rssEveryMs) {
    lastRss = Date.now();
    emit({ event: "rss", kb: rssKb(), totals: { ...totals } });
  }
}, 50);

let stopping = false;
Deno.addSignalListener("SIGTERM", async () => {
  if (stopping) return;
  stopping = true;
  await Promise.all(dispatchers.map((dispatcher) => dispatcher.stop()));
  clearInterval(ticker);
  emit({ event: "stopped", totals: { ...totals } });
  for (const close of closers) await close();
  await nc.close();
  Deno.exit(0);
});

if (config.startOnSignal) {
  // Not SIGUSR1: like Node, Deno opens its inspector (a debugger on 127.0.0.1:9229) on SIGUSR1,
  // listener or not.
  Deno.addSignalListener("SIGUSR2", () => {
    if (dispatchers.length === 0 && !stopping) start();
  });
} else {
  start();
}
emit({ event: "ready", pid: Deno.pid });
