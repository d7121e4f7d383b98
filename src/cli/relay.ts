/**
 * `outbox-nats relay`: the standalone relay. An `OutboxDispatcher` over the store publishes to
 * JetStream; a status line every few seconds; an optional HTTP health endpoint; a clean stop on
 * SIGINT / SIGTERM once in-flight messages are settled (a second signal exits at once).
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  defaultRetryPolicy,
  OutboxDispatcher,
  type OutboxStats,
} from "../../mod.ts";
import { type Command, durationValue, integerValue, storeSettings, stringValue } from "./args.ts";
import { CliError, CliUsageError, describeError, describeVerbose } from "./errors.ts";
import { formatDuration, formatRate, redactUrl } from "./format.ts";
import { type HealthAnswer, type HealthServer, startHealthServer } from "./health.ts";
import type { CliIo } from "./io.ts";
import { connectNats } from "./nats.ts";
import { onShutdownSignals } from "./signals.ts";
import { openStore } from "./store.ts";

/** Running totals of a relay. */
export interface RelayCounters {
  /** Messages published (acknowledged by JetStream, duplicates included). */
  published: number;
  /** Of which JetStream already had (re-publishes within its duplicate window). */
  duplicates: number;
  /** Failed attempts that will be retried. */
  failed: number;
  /** Messages moved to dead. */
  dead: number;
}

/** The latest backlog figures, or why they could not be read. */
interface Backlog {
  at: number;
  stats?: OutboxStats;
  error?: string;
}

/** Reads `stats()` at most once per `maxAgeMs`, one read at a time, bounded by a timeout. */
class BacklogMonitor {
  #latest: Backlog | undefined;
  #reading: Promise<Backlog> | undefined;

  constructor(readonly read: () => Promise<OutboxStats>, readonly timeoutMs: number) {}

  get latest(): Backlog | undefined {
    return this.#latest;
  }

  current(maxAgeMs: number): Promise<Backlog> {
    if (this.#latest && Date.now() - this.#latest.at < maxAgeMs) {
      return Promise.resolve(this.#latest);
    }
    this.#reading ??= this.#read().finally(() => this.#reading = undefined);
    return this.#reading;
  }

  async #read(): Promise<Backlog> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const stats = await Promise.race([
        this.read(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`store did not answer within ${this.timeoutMs} ms`)),
            this.timeoutMs,
          );
        }),
      ]);
      this.#latest = { at: Date.now(), stats };
    } catch (error) {
      this.#latest = { at: Date.now(), error: describeError(error) };
    } finally {
      clearTimeout(timer);
    }
    return this.#latest;
  }
}

/** "stream 'ORDERS'" or "subject 'orders.created'", for log lines and health reasons. */
function scopeLabel(
  scope: { kind: "stream"; stream: string } | { kind: "subject"; subject: string },
): string {
  return scope.kind === "stream" ? `stream '${scope.stream}'` : `subject '${scope.subject}'`;
}

/** `relay`. */
export const relayCommand: Command = {
  name: "relay",
  summary: "Run the relay: dispatch the outbox to JetStream until SIGINT / SIGTERM",
  description:
    "Claims due messages in batches and publishes them to JetStream (Nats-Msg-Id = message id, so\n" +
    "re-publishes are dropped by the stream's duplicate window), with leases, retries, dead-lettering\n" +
    "and a circuit breaker. Wakes at once on Postgres NOTIFY (repositories created with notify: true)\n" +
    "and NATS KV watch; polls otherwise. Prints a status line every --status-interval.\n" +
    "On SIGINT / SIGTERM it claims nothing more, settles the messages in flight, and exits 0; a\n" +
    "second signal exits at once (messages in flight are then recovered when their lease expires).\n" +
    "Job messages (job.create / job.submit) have no handler in the relay and go dead.",
  options: {
    limit: {
      type: "string",
      value: "<n>",
      default: "100",
      description: "Messages claimed per batch",
    },
    "max-in-flight": {
      type: "string",
      value: "<n>",
      default: "100",
      description: "Publishes awaiting a PubAck at once",
    },
    lease: {
      type: "string",
      value: "<duration>",
      default: "30s",
      description: "Claim lease: how long a claimed message is exclusive to this relay",
    },
    poll: {
      type: "string",
      value: "<duration>",
      default: "1s",
      description: "Idle polling interval (finds work without a wake-up)",
    },
    "publish-timeout": {
      type: "string",
      value: "<duration>",
      default: "5s",
      description: "How long to wait for a PubAck",
    },
    "key-fence": {
      type: "string",
      value: "<subject|off>",
      default: "off",
      description:
        "Broker-side key fence: publish a keyed message only on top of its key's previous one (a subject per key)",
    },
    "max-attempts": {
      type: "string",
      value: "<n>",
      default: String(defaultRetryPolicy.maxAttempts),
      description: "Attempts before a message goes dead",
    },
    "status-interval": {
      type: "string",
      value: "<duration>",
      default: "5s",
      description: "Status line interval; 0 turns it off",
    },
    health: {
      type: "string",
      value: "<port>",
      description: "Serve the health endpoint on this port (0: any free port)",
    },
    "health-host": {
      type: "string",
      value: "<host>",
      default: "127.0.0.1",
      description: "Address of the health endpoint (0.0.0.0: every interface)",
    },
    "degraded-after": {
      type: "string",
      value: "<duration>",
      default: "5m",
      description:
        "Health says degraded when the oldest due message is older than this, or a message went dead this recently",
    },
    "no-listen": {
      type: "boolean",
      description: "Do not LISTEN (Postgres) or watch (NATS KV) for wake-ups; poll only",
    },
    channel: {
      type: "string",
      value: "<name>",
      default: "the outbox table",
      description: "Postgres NOTIFY channel (as the repositories' notify option)",
    },
  },
  examples: [
    "outbox-nats relay --store postgres://app@db:5432/app --nats nats://nats:4222 --health 8080",
    "outbox-nats relay --store sqlite:./app.db --nats nats://127.0.0.1:4222 --status-interval 30s",
    "outbox-nats relay --store nats-kv://orders_outbox --nats nats://127.0.0.1:4222",
  ],
  async run({ values }, io) {
    const settings = {
      ...storeSettings(values, "outbox-nats relay"),
      poolSize: 4,
      reconnectForever: true,
    };
    const natsUrl = settings.natsUrl;
    if (!natsUrl) {
      throw new CliUsageError("relay: --nats <url> (or OUTBOX_NATS_URL) is required");
    }
    const limit = integerValue(values, "limit", 100);
    const maxInFlight = integerValue(values, "max-in-flight", 100);
    const leaseMs = durationValue(values, "lease", 30_000);
    const pollMs = durationValue(values, "poll", 1_000);
    const publishTimeoutMs = durationValue(values, "publish-timeout", 5_000);
    const maxAttempts = integerValue(values, "max-attempts", defaultRetryPolicy.maxAttempts);
    const statusText = stringValue(values, "status-interval");
    const statusMs = statusText === "0" ? 0 : durationValue(values, "status-interval", 5_000);
    const healthPort = values.health === undefined
      ? undefined
      : integerValue(values, "health", 0, 0);
    if (healthPort !== undefined && healthPort > 65_535) {
      throw new CliUsageError(`--health: ${healthPort} is not a port`);
    }
    if (leaseMs < 1_000) throw new CliUsageError("--lease must be at least 1s");
    if (publishTimeoutMs < 1) throw new CliUsageError("--publish-timeout must be at least 1ms");
    const keyFence = stringValue(values, "key-fence") ?? "off";
    if (keyFence !== "subject" && keyFence !== "off") {
      throw new CliUsageError(`--key-fence must be "subject" or "off", got "${keyFence}"`);
    }
    const healthHost = stringValue(values, "health-host") ?? "127.0.0.1";
    const degradedAfterMs = durationValue(values, "degraded-after", 300_000);
    const verbose = values.verbose === true;

    const store = await openStore(settings);
    const closers: Array<() => Promise<void>> = [() => store.close()];
    const closeAll = async () => {
      for (const close of closers.splice(0).reverse()) {
        await close().catch((error) => io.err(`relay: closing: ${describeError(error)}\n`));
      }
    };
    try {
      let nc: NatsConnection;
      if (store.nats) nc = store.nats;
      else {
        nc = await connectNats(natsUrl, {
          name: "outbox-nats relay",
          reconnectForever: true,
          security: settings.natsSecurity,
        });
        closers.push(() => nc.close());
      }
      return await runRelay(io, {
        store,
        nc,
        natsLabel: redactUrl(natsUrl),
        limit,
        maxInFlight,
        leaseMs,
        pollMs,
        publishTimeoutMs,
        keyFence,
        maxAttempts,
        statusMs,
        healthPort,
        healthHost,
        degradedAfterMs,
        listen: values["no-listen"] !== true,
        channel: stringValue(values, "channel"),
        verbose,
        closers,
      });
    } finally {
      await closeAll();
    }
  },
};

interface RelaySettings {
  store: Awaited<ReturnType<typeof openStore>>;
  nc: NatsConnection;
  natsLabel: string;
  limit: number;
  maxInFlight: number;
  leaseMs: number;
  pollMs: number;
  publishTimeoutMs: number;
  keyFence: "subject" | "off";
  maxAttempts: number;
  statusMs: number;
  healthPort?: number;
  healthHost: string;
  degradedAfterMs: number;
  listen: boolean;
  channel?: string;
  verbose: boolean;
  closers: Array<() => Promise<void>>;
}

async function runRelay(io: CliIo, s: RelaySettings): Promise<number> {
  const startedAt = Date.now();
  const counters: RelayCounters = { published: 0, duplicates: 0, failed: 0, dead: 0 };
  let stopping = false;
  let lastDeadAt: number | undefined;
  let pauseError: { code: string; message: string } | undefined;
  const report = (error: unknown) => {
    io.err(`relay: ${describeError(error)}\n`);
    if (s.verbose) io.err(describeVerbose(error) + "\n");
  };
  const runtime = createJetStreamRuntime(jetstream(s.nc), { timeoutMs: s.publishTimeoutMs });
  if (!(await runtime.probe())) {
    io.err(
      `relay: warning: JetStream at ${s.natsLabel} does not answer (is JetStream enabled?); ` +
        "the relay keeps probing\n",
    );
  }
  const signals = onShutdownSignals((signal) =>
    io.err(
      `relay: ${signal} again: exiting now; messages in flight are recovered when their lease expires\n`,
    )
  );
  try {
    const dispatcher = new OutboxDispatcher(s.store.outbox, runtime, {
      limit: s.limit,
      maxInFlight: s.maxInFlight,
      leaseMs: s.leaseMs,
      keyFence: s.keyFence,
      idleRetryMs: s.pollMs,
      retry: { maxAttempts: s.maxAttempts },
      onDispatched: (_message, info) => {
        counters.published += 1;
        if (info.duplicate) counters.duplicates += 1;
      },
      onFailed: () => {
        counters.failed += 1;
      },
      onDead: (message, info) => {
        counters.dead += 1;
        lastDeadAt = Date.now();
        io.err(`relay: dead: ${message.id} (${message.subject}): ${info.lastError}\n`);
      },
      onPaused: (info) => {
        pauseError = { code: info.error.code, message: info.error.message };
        io.err(`relay: JetStream unavailable, paused: ${describeError(info.error)}\n`);
      },
      onResumed: (info) => {
        pauseError = undefined;
        io.out(
          `relay: JetStream available again, resumed after ${formatDuration(info.pausedMs)}\n`,
        );
      },
      onScopePaused: (info) =>
        io.err(
          `relay: ${scopeLabel(info.scope)} unavailable, its messages wait (the rest flows): ` +
            `${describeError(info.error)}\n`,
        ),
      onScopeResumed: (info) =>
        io.out(
          `relay: ${scopeLabel(info.scope)} available again after ${
            formatDuration(info.pausedMs)
          }\n`,
        ),
      onError: report,
    });
    let dispatcherStopped = false;
    const stopDispatcher = async () => {
      if (dispatcherStopped) return;
      dispatcherStopped = true;
      await dispatcher.stop();
    };
    s.closers.push(stopDispatcher);

    let wakeups = "polling every " + formatDuration(s.pollMs);
    if (s.listen && s.store.wakeups) {
      try {
        const unwatch = await s.store.wakeups(() => dispatcher.notify(), s.channel);
        s.closers.push(unwatch);
        wakeups = s.store.kind === "postgres"
          ? `LISTEN ${s.channel ?? "on the outbox table's channel"} + ${wakeups}`
          : `KV watch + ${wakeups}`;
      } catch (error) {
        io.err(`relay: wake-ups unavailable, polling only: ${describeError(error)}\n`);
      }
    }

    const monitor = new BacklogMonitor(() => s.store.outbox.stats(), 5_000);
    let health: HealthServer | undefined;
    if (s.healthPort !== undefined) {
      health = await startHealthServer(
        s.healthHost,
        s.healthPort,
        async (): Promise<HealthAnswer> => {
          const backlog = await monitor.current(1_000);
          const breaker = dispatcher.state;
          const pausedScopes = dispatcher.pausedScopes;
          const now = Date.now();
          // Degraded: still dispatching (ready), but something needs a look.
          const reasons: string[] = [];
          const oldest = backlog.stats?.oldestDueAgeMs;
          if (oldest !== undefined && oldest > s.degradedAfterMs) {
            reasons.push(`the oldest due message waits for ${formatDuration(oldest)}`);
          }
          if (lastDeadAt !== undefined && now - lastDeadAt < s.degradedAfterMs) {
            reasons.push(`messages went dead (last ${formatDuration(now - lastDeadAt)} ago)`);
          }
          for (const paused of pausedScopes) {
            reasons.push(
              `${scopeLabel(paused.scope)} unavailable for ${
                formatDuration(now - paused.since)
              } (${paused.error.code})`,
            );
          }
          const status = stopping
            ? "stopping"
            : backlog.error !== undefined
            ? "store_unavailable"
            : breaker !== "closed"
            ? "paused"
            : reasons.length > 0
            ? "degraded"
            : "ready";
          const ready = status === "ready" || status === "degraded";
          return {
            ready,
            body: {
              status,
              ready,
              ...(reasons.length > 0 ? { reasons } : {}),
              breaker,
              ...(breaker !== "closed" && pauseError ? { breakerError: pauseError } : {}),
              pausedScopes: pausedScopes.map((paused) => ({
                ...paused.scope,
                code: paused.error.code,
                error: paused.error.message,
                sinceMs: now - paused.since,
              })),
              store: {
                url: s.store.label,
                ok: backlog.error === undefined,
                ...(backlog.error !== undefined ? { error: backlog.error } : {}),
              },
              backlog: backlog.stats
                ? {
                  due: backlog.stats.due,
                  oldestDueAgeMs: backlog.stats.oldestDueAgeMs ?? null,
                  pending: backlog.stats.pending,
                  claimed: backlog.stats.claimed,
                  failed: backlog.stats.failed,
                  dead: backlog.stats.dead,
                }
                : null,
              relay: { ...counters, uptimeMs: Date.now() - startedAt },
            },
          };
        },
        () => ({
          ready: true,
          body: { status: stopping ? "stopping" : "alive", uptimeMs: Date.now() - startedAt },
        }),
      );
      const serving = health;
      s.closers.push(() => serving.close());
      io.out(
        `relay: health endpoint on http://${health.host}:${health.port}/ ` +
          "(/livez liveness, /readyz readiness)\n",
      );
    }

    io.out(
      `relay: started: ${s.store.label} -> JetStream at ${s.natsLabel} ` +
        `(batch ${s.limit}, in flight ${s.maxInFlight}, lease ${
          formatDuration(s.leaseMs)
        }; ${wakeups})\n`,
    );

    let statusTimer: ReturnType<typeof setInterval> | undefined;
    if (s.statusMs > 0) {
      let last = { at: Date.now(), published: 0 };
      statusTimer = setInterval(() => {
        void monitor.current(0).then((backlog) => {
          if (stopping) return;
          const now = Date.now();
          const rate = formatRate(counters.published - last.published, now - last.at);
          last = { at: now, published: counters.published };
          const stats = backlog.stats;
          const backlogText = stats
            ? `due ${stats.due}, oldest due ${
              stats.oldestDueAgeMs === undefined ? "-" : formatDuration(stats.oldestDueAgeMs)
            }`
            : `backlog unknown (${backlog.error})`;
          io.out(
            `relay: published ${counters.published} (${rate}) failed ${counters.failed} ` +
              `dead ${counters.dead} | ${backlogText} | breaker ${dispatcher.state}\n`,
          );
        });
      }, s.statusMs);
    }

    // Runs until a signal, or until the NATS connection is closed for good.
    const closed = s.nc.closed().then((error) => ({ closed: true as const, error }));
    const outcome = await Promise.race([
      signals.received.then((signal) => ({ closed: false as const, signal })),
      closed,
    ]);
    stopping = true;
    clearInterval(statusTimer);
    if (outcome.closed) {
      await stopDispatcher();
      throw new CliError(
        `NATS connection to ${s.natsLabel} closed${
          outcome.error ? `: ${describeError(outcome.error)}` : ""
        }`,
      );
    }
    io.out(
      `relay: ${outcome.signal}: claiming nothing more, settling messages in flight ` +
        "(send it again to exit at once)\n",
    );
    await stopDispatcher();
    io.out(
      `relay: stopped after ${
        formatDuration(Date.now() - startedAt)
      }: published ${counters.published} ` +
        `(${counters.duplicates} duplicates), failed ${counters.failed}, dead ${counters.dead}\n`,
    );
    return 0;
  } finally {
    signals.dispose();
  }
}
