/**
 * What the fault suite's child processes are told (one JSON argument) and what they report
 * (one JSON object per stdout line).
 *
 * @module
 */

/** The store a dispatcher child claims from. */
export type StoreConfig =
  | { kind: "postgres"; url: string; tables?: { outbox: string; inbox: string } }
  | { kind: "sqlite"; path: string }
  | { kind: "kv"; bucket: string };

/** Configuration of `workers/dispatcher.ts`. */
export interface DispatcherConfig {
  /** A label for logs. */
  name: string;
  store: StoreConfig;
  /** The NATS server(s) the runtime publishes to (and the KV bucket lives on); comma-separated for a cluster. */
  natsUrl: string;
  /** Dispatchers in this process, each with its own repository (and SQLite connection). */
  dispatchers: number;
  limit?: number;
  maxInFlight?: number;
  leaseMs?: number;
  idleRetryMs?: number;
  probeIntervalMs?: number;
  probeMaxIntervalMs?: number;
  /** PubAck timeout of the runtime. @default {5000} */
  publishTimeoutMs?: number;
  /** API timeout of the JetStream client (probes). @default {publishTimeoutMs} */
  apiTimeoutMs?: number;
  /** After this many PubAcks (in this process), report `hung` and never return from that publish. */
  hangAfterPublishes?: number;
  /** Report `rss` this often. */
  rssEveryMs?: number;
  /** Connect, report `ready`, and only start dispatching on SIGUSR2. */
  startOnSignal?: boolean;
  /** Postgres `application_name` of the pool's connections. */
  applicationName?: string;
  /**
   * This fraction of publishes fails as `retryable`: half before the broker sees the message,
   * half after it stored it (a lost PubAck).
   */
  failureRate?: number;
  /** While this file exists, publishing a message whose id contains `-poison-` fails permanently. */
  poisonFlag?: string;
  /** The dispatchers' retry policy. */
  retry?: { baseMs?: number; capMs?: number; maxAttempts?: number };
}

/** Counts a dispatcher child accumulates over its batches. */
export interface DispatchTotals {
  batches: number;
  claimed: number;
  dispatched: number;
  duplicates: number;
  failed: number;
  unavailable: number;
  dead: number;
  superseded: number;
  /** Errors the dispatchers recovered from (store errors, marks not recorded). */
  errors: number;
  /** PubAcks received (duplicates included). */
  published: number;
}

/** Configuration of `workers/inbox_consumer.ts`. */
export interface InboxConsumerConfig {
  natsUrl: string;
  stream: string;
  durable: string;
  postgresUrl: string;
  inboxTable: string;
  outboxTable: string;
  counterTable: string;
  /** After this many commits, report `hanging` and block before the ack (until killed). */
  hangAfterCommits?: number;
  concurrency?: number;
}

/** One stdout line of a child. */
export type ChildEvent =
  | { event: "ready"; pid: number }
  | { event: "progress"; totals: DispatchTotals }
  | { event: "paused"; code: string; at: number }
  | { event: "resumed"; pausedMs: number; at: number }
  | { event: "error"; message: string }
  | { event: "hung"; published: number }
  | { event: "rss"; kb: number; totals: DispatchTotals }
  | { event: "stopped"; totals: DispatchTotals }
  | { event: "committed"; id: string; commits: number }
  | { event: "hanging"; id: string; commits: number }
  | { event: "duplicate"; id: string }
  | {
    event: "consumer-stopped";
    processed: number;
    duplicates: number;
    failed: number;
    poisoned: number;
  };

/** Writes one event line to stdout (synchronously, so it is out before a kill). */
export function emit(event: ChildEvent): void {
  const bytes = new TextEncoder().encode(JSON.stringify(event) + "\n");
  let written = 0;
  while (written < bytes.length) written += Deno.stdout.writeSync(bytes.subarray(written));
}

/** Resident set size of `pid` in kB, from /proc/<pid>/status (VmRSS). */
export function rssKb(pid: number | "self" = "self"): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
  return match ? Number(match[1]) : 0;
}
