/**
 * The fault suite's harness: child processes (spawn, read their event lines, kill, always
 * reaped), reading a stream back in one pass, the exactly-once comparison, store snapshots, and
 * the figures each scenario prints for the README.
 *
 * @module
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import postgres from "postgres";
import type { OutboxRecord, SqlExecutor } from "../../mod.ts";
import { connectNats, eventually } from "../kit/mod.ts";
import type { ChildEvent, DispatcherConfig, DispatchTotals } from "./workers/protocol.ts";

const root = new URL("../../", import.meta.url).pathname;

/** Path of a worker script under tests/faults/workers/. */
export function workerScript(name: string): string {
  return new URL(`./workers/${name}`, import.meta.url).pathname;
}

type Waiter = {
  predicate: (event: ChildEvent) => boolean;
  resolve: (event: ChildEvent) => void;
  reject: (error: Error) => void;
};

/**
 * A `deno run` child process reporting JSON events on stdout. Disposing it kills it (SIGKILL)
 * if it still runs and waits until it is reaped and its stdout is drained, so a failing test
 * leaves no process behind and the resource sanitizer stays quiet.
 */
export class Child implements AsyncDisposable {
  readonly label: string;
  readonly pid: number;
  readonly events: ChildEvent[] = [];
  readonly status: Promise<Deno.CommandStatus>;
  #process: Deno.ChildProcess;
  #reading: Promise<void>;
  #waiters = new Set<Waiter>();
  #exited = false;

  private constructor(label: string, process: Deno.ChildProcess) {
    this.label = label;
    this.#process = process;
    this.pid = process.pid;
    this.status = process.status.then((status) => {
      this.#exited = true;
      return status;
    });
    this.#reading = this.#read();
  }

  /** Starts `deno run -A <script> <config JSON>` from the repository root. */
  static spawn(script: string, config: unknown, label = script): Child {
    const process = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--quiet", script, JSON.stringify(config)],
      cwd: root,
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    return new Child(label, process);
  }

  /** Starts a dispatcher child. */
  static dispatcher(config: DispatcherConfig): Child {
    return Child.spawn(workerScript("dispatcher.ts"), config, config.name);
  }

  /** Whether the process has exited. */
  get exited(): boolean {
    return this.#exited;
  }

  /** The latest event of `type`, if any. */
  last<T extends ChildEvent["event"]>(type: T): Extract<ChildEvent, { event: T }> | undefined {
    for (let i = this.events.length - 1; i >= 0; i--) {
      if (this.events[i].event === type) return this.events[i] as Extract<ChildEvent, { event: T }>;
    }
    return undefined;
  }

  /** All events of `type`. */
  all<T extends ChildEvent["event"]>(type: T): Array<Extract<ChildEvent, { event: T }>> {
    return this.events.filter((e) => e.event === type) as Array<Extract<ChildEvent, { event: T }>>;
  }

  /** Latest totals reported by a dispatcher child (zeros before its first report). */
  get totals(): DispatchTotals {
    const last = [...this.events].reverse().find((e) =>
      e.event === "progress" || e.event === "stopped" || e.event === "rss"
    ) as { totals: DispatchTotals } | undefined;
    return last?.totals ?? emptyTotals();
  }

  /**
   * Resolves with the first event (already received or future) matching `predicate`; rejects
   * when the process exits first or after `timeoutMs`.
   */
  waitFor(
    predicate: (event: ChildEvent) => boolean,
    timeoutMs = 60_000,
    what = "event",
  ): Promise<ChildEvent> {
    const seen = this.events.find(predicate);
    if (seen) return Promise.resolve(seen);
    if (this.#exited) {
      return Promise.reject(new Error(`${this.label} exited before ${what}`));
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters.delete(waiter);
        reject(new Error(`${this.label}: no ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter: Waiter = {
        predicate,
        resolve: (event) => {
          clearTimeout(timer);
          resolve(event);
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
      this.#waiters.add(waiter);
    });
  }

  /** Waits for an event of `type`. */
  waitForEvent<T extends ChildEvent["event"]>(
    type: T,
    timeoutMs = 60_000,
  ): Promise<Extract<ChildEvent, { event: T }>> {
    return this.waitFor((e) => e.event === type, timeoutMs, `'${type}'`) as Promise<
      Extract<ChildEvent, { event: T }>
    >;
  }

  /** Sends a signal (ignored when the process is gone). */
  kill(signal: Deno.Signal = "SIGKILL"): void {
    if (this.#exited) return;
    try {
      this.#process.kill(signal);
    } catch {
      // already gone
    }
  }

  /** SIGKILL, and wait until the process is reaped. */
  async crash(): Promise<void> {
    this.kill("SIGKILL");
    await this.status;
  }

  /** Graceful stop: SIGTERM, wait for its `stopped` report and exit (SIGKILL after `timeoutMs`). */
  async stop(timeoutMs = 60_000): Promise<DispatchTotals> {
    this.kill("SIGTERM");
    let timer: ReturnType<typeof setTimeout> | undefined;
    const status = await Promise.race([
      this.status,
      new Promise<undefined>((resolve) => timer = setTimeout(() => resolve(undefined), timeoutMs)),
    ]);
    clearTimeout(timer);
    if (status === undefined) {
      await this.crash();
      throw new Error(`${this.label} did not stop within ${timeoutMs} ms`);
    }
    await this.#reading;
    return this.totals;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.kill("SIGKILL");
    await this.status;
    await this.#reading;
  }

  async #read(): Promise<void> {
    let buffer = "";
    const decoder = new TextDecoder();
    try {
      for await (const chunk of this.#process.stdout) {
        buffer += decoder.decode(chunk, { stream: true });
        let newline: number;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline).trim();
          buffer = buffer.slice(newline + 1);
          if (line) this.#accept(line);
        }
      }
    } catch {
      // stdout closed by the kill
    }
    await this.status;
    for (const waiter of this.#waiters) {
      waiter.reject(new Error(`${this.label} exited (before the awaited event)`));
    }
    this.#waiters.clear();
  }

  #accept(line: string): void {
    let event: ChildEvent;
    try {
      event = JSON.parse(line);
    } catch {
      console.error(`[${this.label}] ${line}`);
      return;
    }
    this.events.push(event);
    if (event.event === "error") {
      console.error(`  [${this.label}] recovered from: ${event.message}`);
    }
    for (const waiter of [...this.#waiters]) {
      if (waiter.predicate(event)) {
        this.#waiters.delete(waiter);
        waiter.resolve(event);
      }
    }
  }
}

/** Zero totals. */
export function emptyTotals(): DispatchTotals {
  return {
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
}

/** Sums the totals of several children. */
export function sumTotals(list: DispatchTotals[]): DispatchTotals {
  const sum = emptyTotals();
  for (const totals of list) {
    for (const key of Object.keys(sum) as Array<keyof DispatchTotals>) sum[key] += totals[key];
  }
  return sum;
}

/** `count` event records `${tag}-${from + i}` publishing to `${prefix}.p<i % 8>`. */
export function records(prefix: string, tag: string, from: number, count: number): OutboxRecord[] {
  return Array.from({ length: count }, (_, i) => {
    const n = from + i;
    return {
      id: `${tag}-${n}`,
      kind: "event.publish" as const,
      name: "fault.event",
      subject: `${prefix}.p${n % 8}`,
      payload: JSON.stringify({ n, tag, pad: "x".repeat(64) }),
      headers: { "X-Fault": tag },
    };
  });
}

/**
 * The `Nats-Msg-Id` of every message in `stream`, read in one pass with an ordered consumer
 * (in stream order). A cluster that just got a frozen or killed node back may answer the
 * JetStream API with "temporarily unavailable" for a while: the read is retried from the start
 * until it completes (60 s at most).
 */
export function readStreamIds(nc: NatsConnection, stream: string): Promise<string[]> {
  return eventually(() => readStreamIdsOnce(nc, stream), { timeoutMs: 60_000, intervalMs: 250 });
}

async function readStreamIdsOnce(nc: NatsConnection, stream: string): Promise<string[]> {
  const jsm = await jetstreamManager(nc);
  const info = await jsm.streams.info(stream);
  if (info.state.messages === 0) return [];
  const last = info.state.last_seq;
  const consumer = await jetstream(nc).consumers.get(stream);
  const messages = await consumer.consume({ max_messages: 2_000 });
  const ids: string[] = [];
  // A consumer created while the cluster recovers can stall without an error: give up after 10 s
  // without a message (the caller starts over).
  let stalled = false;
  let progressAt = Date.now();
  const watchdog = setInterval(() => {
    if (Date.now() - progressAt < 10_000) return;
    stalled = true;
    messages.stop();
  }, 1_000);
  try {
    for await (const message of messages) {
      progressAt = Date.now();
      ids.push(message.headers?.get("Nats-Msg-Id") ?? `<no id at ${message.seq}>`);
      if (message.seq >= last) break;
    }
  } finally {
    clearInterval(watchdog);
    await messages.close();
  }
  if (stalled) throw new Error(`reading ${stream} stalled after ${ids.length} of ${last} messages`);
  return ids;
}

/** Stored messages in `stream`. */
export async function streamMessages(nc: NatsConnection, stream: string): Promise<number> {
  const jsm = await jetstreamManager(nc);
  return (await jsm.streams.info(stream)).state.messages;
}

/** How the stream compares with what was committed. */
export interface Delivery {
  committed: number;
  stored: number;
  /** Ids stored more than once (with their counts). */
  duplicates: Array<[string, number]>;
  /** Committed ids not in the stream. */
  lost: string[];
  /** Ids in the stream that were never committed (rolled back, or foreign). */
  unexpected: string[];
  /** Of `unexpected`: ids of rolled-back work. */
  rolledBackPublished: string[];
}

/** Compares the multiset of stream ids with the committed (and the rolled-back) ids. */
export function compareDelivery(
  committed: Iterable<string>,
  streamIds: string[],
  rolledBack: Iterable<string> = [],
): Delivery {
  const counts = new Map<string, number>();
  for (const id of streamIds) counts.set(id, (counts.get(id) ?? 0) + 1);
  const expected = new Set(committed);
  const lost: string[] = [];
  for (const id of expected) if (!counts.has(id)) lost.push(id);
  const duplicates: Array<[string, number]> = [];
  const unexpected: string[] = [];
  for (const [id, n] of counts) {
    if (n > 1) duplicates.push([id, n]);
    if (!expected.has(id)) unexpected.push(id);
  }
  const rolledBackPublished = [...rolledBack].filter((id) => counts.has(id));
  return {
    committed: expected.size,
    stored: streamIds.length,
    duplicates,
    lost,
    unexpected,
    rolledBackPublished,
  };
}

/** The delivery figures for the report. */
export function deliveryFigures(delivery: Delivery): Record<string, number> {
  return {
    committed: delivery.committed,
    stored: delivery.stored,
    duplicates: delivery.duplicates.length,
    lost: delivery.lost.length,
    rolledBackPublished: delivery.rolledBackPublished.length,
  };
}

/** Asserts every committed id is in the stream exactly once and nothing else is. */
export function assertExactlyOnce(delivery: Delivery): void {
  const sample = <T>(list: T[]) => list.slice(0, 5);
  assert.deepEqual(sample(delivery.lost), [], `${delivery.lost.length} committed ids lost`);
  assert.deepEqual(
    sample(delivery.duplicates),
    [],
    `${delivery.duplicates.length} ids stored more than once`,
  );
  assert.deepEqual(
    sample(delivery.rolledBackPublished),
    [],
    `${delivery.rolledBackPublished.length} ids of rolled-back work were published`,
  );
  assert.deepEqual(
    sample(delivery.unexpected),
    [],
    `${delivery.unexpected.length} ids in the stream that were never committed`,
  );
  assert.equal(delivery.stored, delivery.committed);
}

/** Row counts per state and attempt statistics of a SQL outbox table. */
export interface TableSnapshot {
  states: Record<string, number>;
  rows: number;
  attempts: number;
  maxAttempts: number;
}

/** Reads a {@linkcode TableSnapshot} of `table` (Postgres or SQLite, through an executor). */
export async function tableSnapshot(
  executor: SqlExecutor,
  table = "trellis_outbox",
): Promise<TableSnapshot> {
  const rows = await executor.query(
    `SELECT state, count(*) AS n, sum(attempts) AS attempts, max(attempts) AS max FROM ${table} GROUP BY state`,
    [],
  );
  const states: Record<string, number> = {};
  let total = 0;
  let attempts = 0;
  let maxAttempts = 0;
  for (const row of rows) {
    const n = Number(row.n);
    states[String(row.state)] = n;
    total += n;
    attempts += Number(row.attempts);
    maxAttempts = Math.max(maxAttempts, Number(row.max));
  }
  return { states, rows: total, attempts, maxAttempts };
}

/** Waits (polling, generous timeout) until `expected` rows are `dispatched`. */
export async function waitDispatched(
  snapshot: () => Promise<TableSnapshot>,
  expected: number,
  timeoutMs = 180_000,
): Promise<TableSnapshot> {
  return await eventually(async () => {
    const current = await snapshot();
    assert.equal(current.states.dispatched ?? 0, expected, JSON.stringify(current.states));
    return current;
  }, { timeoutMs, intervalMs: 200 });
}

/** Waits until the children together recorded `expected` messages as dispatched. */
export async function waitChildrenDispatched(
  children: Child[],
  expected: number,
  timeoutMs = 180_000,
): Promise<void> {
  await eventually(() => {
    for (const child of children) {
      if (child.exited) throw new Error(`${child.label} exited`);
    }
    const done = sumTotals(children.map((child) => child.totals)).dispatched;
    assert.equal(done, expected, "messages recorded as dispatched by the children");
    return Promise.resolve();
  }, { timeoutMs, intervalMs: 100 });
}

/** A NATS connection closed on dispose (reconnecting forever, for servers that restart). */
export async function natsConnection(
  url?: string,
): Promise<{ nc: NatsConnection } & AsyncDisposable> {
  const nc = await connectNats(url, {
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
  return {
    nc,
    async [Symbol.asyncDispose]() {
      if (!nc.isClosed()) await nc.close();
    },
  };
}

/** A postgres.js pool ended on dispose. */
export function pgPool(url: string, max = 4): { sql: postgres.Sql } & AsyncDisposable {
  const sql = postgres(url, { max, onnotice: () => {} });
  return {
    sql,
    async [Symbol.asyncDispose]() {
      await sql.end({ timeout: 5 });
    },
  };
}

/** A temp dir removed on dispose. */
export async function tempDir(prefix: string): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix });
  return {
    path,
    async [Symbol.asyncDispose]() {
      await Deno.remove(path, { recursive: true }).catch(() => {});
    },
  };
}

/** Prints a scenario's measured figures (collected for the README's Reliability section). */
export function figures(scenario: string, values: Record<string, unknown>): void {
  console.log(`  reliability | ${scenario} | ${JSON.stringify(values)}`);
}

/** Milliseconds since `start` (a `performance.now()` value), rounded. */
export function since(start: number): number {
  return Math.round(performance.now() - start);
}
