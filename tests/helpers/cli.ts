/**
 * Runs the CLI as a subprocess (`deno run -A cli.ts ...`), as an operator would, and seeds stores
 * (Postgres, SQLite, NATS KV) with a known mix of message states for the CLI tests.
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import postgres from "postgres";
import {
  createOutboxBucket,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  type OutboxAdmin,
  type OutboxRecord,
  type OutboxRepository,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../../mod.ts";
import { connectNats, createTestDatabase, natsUrl, uniqueName } from "../kit/mod.ts";

const root = new URL("../../", import.meta.url).pathname;
const cliPath = join(root, "cli.ts");

/** What a finished CLI run printed and returned. */
export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

function cliCommand(
  args: string[],
  env: Record<string, string>,
  signal?: AbortSignal,
): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    signal,
    args: ["run", "-A", "--quiet", cliPath, ...args],
    cwd: root,
    env: { NO_COLOR: "1", OUTBOX_STORE_URL: "", OUTBOX_NATS_URL: "", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
}

/** Runs the CLI to completion (killed after `options.timeoutMs`, when given). */
export async function runCli(
  args: string[],
  env: Record<string, string> = {},
  options: { timeoutMs?: number } = {},
): Promise<CliResult> {
  const signal = options.timeoutMs === undefined
    ? undefined
    : AbortSignal.timeout(options.timeoutMs);
  const output = await cliCommand(args, env, signal).output();
  const decoder = new TextDecoder();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}

/** A long-running CLI process (the relay, status --watch) whose output is read line by line. */
export class CliProcess {
  readonly child: Deno.ChildProcess;
  readonly stdout: string[] = [];
  readonly stderr: string[] = [];
  readonly done: Promise<CliResult>;
  #waiters: Array<
    { pattern: RegExp; resolve: (line: string) => void; reject: (e: Error) => void }
  > = [];
  #exited = false;

  constructor(args: string[], env: Record<string, string> = {}) {
    this.child = cliCommand(args, env).spawn();
    const out = this.#read(this.child.stdout, this.stdout);
    const err = this.#read(this.child.stderr, this.stderr);
    this.done = Promise.all([this.child.status, out, err]).then(([status]) => {
      this.#exited = true;
      for (const waiter of this.#waiters.splice(0)) {
        waiter.reject(
          new Error(
            `CLI exited (${status.code}) before printing ${waiter.pattern}\nstdout:\n${
              this.stdout.join("\n")
            }\nstderr:\n${this.stderr.join("\n")}`,
          ),
        );
      }
      return {
        code: status.code,
        stdout: this.stdout.join("\n"),
        stderr: this.stderr.join("\n"),
      };
    });
  }

  async #read(stream: ReadableStream<Uint8Array>, lines: string[]): Promise<void> {
    let buffer = "";
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      let newline: number;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        lines.push(line);
        for (const waiter of [...this.#waiters]) {
          if (waiter.pattern.test(line)) {
            this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
            waiter.resolve(line);
          }
        }
      }
    }
    if (buffer) lines.push(buffer);
  }

  /**
   * Resolves with the first line (stdout or stderr, already printed or future) matching; rejects
   * after `timeoutMs` (a changed output format fails the test instead of hanging the suite).
   */
  waitForLine(pattern: RegExp, timeoutMs = 60_000): Promise<string> {
    const seen = [...this.stdout, ...this.stderr].find((line) => pattern.test(line));
    if (seen !== undefined) return Promise.resolve(seen);
    if (this.#exited) return Promise.reject(new Error(`CLI exited before printing ${pattern}`));
    return new Promise((resolve, reject) => {
      const waiter = {
        pattern,
        resolve: (line: string) => {
          clearTimeout(timer);
          resolve(line);
        },
        reject: (error: Error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
      const timer = setTimeout(() => {
        const index = this.#waiters.indexOf(waiter);
        if (index >= 0) this.#waiters.splice(index, 1);
        reject(
          new Error(
            `no line matching ${pattern} within ${timeoutMs} ms; output so far:\n${
              [...this.stdout, ...this.stderr].slice(-20).join("\n")
            }`,
          ),
        );
      }, timeoutMs);
      this.#waiters.push(waiter);
    });
  }

  /** Sends a signal (ignored once the process exited). */
  kill(signal: Deno.Signal): void {
    try {
      this.child.kill(signal);
    } catch {
      // already exited
    }
  }

  /** Kills the process if still running and waits for it (for `finally` blocks). */
  async cleanup(): Promise<void> {
    this.kill("SIGKILL");
    await this.done;
  }
}

/** The subject of seeded message `index`: odd ones `orders.created`, even ones `billing.paid`. */
export function seededSubject(prefix: string, index: number): string {
  return `${prefix}.${index % 2 ? "orders.created" : "billing.paid"}`;
}

/** Ten records `<prefix>-0` .. `<prefix>-9`. */
export function seedRecords(prefix: string, count = 10): OutboxRecord[] {
  return Array.from({ length: count }, (_, index) => ({
    id: `${prefix}-${index}`,
    kind: "event.publish" as const,
    name: "cli.test",
    subject: seededSubject(prefix, index),
    payload: JSON.stringify({ index }),
    headers: {},
  }));
}

const day = 86_400_000;

/**
 * Seeds ten messages in a known mix of states (now = the real time):
 * - 0, 1: dispatched 10 days ago; 4: dispatched now
 * - 2: dead since 40 days ago; 3: dead since 10 days ago; 5: dead now (3 and 5 are orders.*)
 * - 6: failed, next attempt in an hour (not due); 7: claimed with a live lease; 8, 9: pending
 *
 * Stats: pending 2, claimed 1, failed 1, dispatched 3, dead 3, due 2.
 */
export async function seedMix(
  outbox: OutboxRepository & OutboxAdmin,
  prefix: string,
): Promise<OutboxRecord[]> {
  const records = seedRecords(prefix);
  await outbox.enqueueMany(records);
  const now = Date.now();
  const tenDaysAgo = new Date(now - 10 * day);
  const old = await outbox.claimDue(4, tenDaysAgo);
  await outbox.markDispatched(old[0], tenDaysAgo);
  await outbox.markDispatched(old[1], tenDaysAgo);
  await outbox.markDead(old[2], { error: "no stream for subject", now: new Date(now - 40 * day) });
  await outbox.markDead(old[3], { error: "payload too large\nsecond line", now: tenDaysAgo });
  const recent = await outbox.claimDue(3, new Date(now));
  await outbox.markDispatched(recent[0], new Date(now));
  await outbox.markDead(recent[1], { error: "no stream for subject", now: new Date(now) });
  await outbox.markFailed(recent[2], {
    error: "timeout",
    now: new Date(now),
    nextAttemptAt: new Date(now + 3_600_000),
  });
  const live = await outbox.claimDue(1, new Date(now), { leaseMs: 3_600_000 });
  if (old.length !== 4 || recent.length !== 3 || live.length !== 1) {
    throw new Error("seeding claimed an unexpected number of messages");
  }
  return records;
}

/** A store the CLI opens, with a repository on it for seeding and checking. */
export interface CliStoreFixture extends AsyncDisposable {
  kind: "postgres" | "sqlite" | "nats-kv";
  /** `--store ...` and the table / NATS options. */
  args: string[];
  outbox: OutboxRepository & OutboxAdmin;
}

/** A fresh Postgres database, migrated, with unique table names. */
export async function postgresStore(): Promise<
  CliStoreFixture & { sql: postgres.Sql; url: string; table: string }
> {
  const database = await createTestDatabase();
  const sql = postgres(database.url, { max: 2, onnotice: () => {} });
  const table = uniqueName("cli_o");
  const tables = { outbox: table, inbox: `${table}_i` };
  await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
  return {
    kind: "postgres",
    args: ["--store", database.url, "--outbox-table", tables.outbox, "--inbox-table", tables.inbox],
    outbox: new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables),
    sql,
    url: database.url,
    table,
    async [Symbol.asyncDispose]() {
      await sql.end();
      await database[Symbol.asyncDispose]();
    },
  };
}

/** A SQLite file in a temp dir, migrated. */
export async function sqliteStore(): Promise<CliStoreFixture & { path: string }> {
  const dir = await Deno.makeTempDir({ prefix: "outbox-cli-" });
  const path = join(dir, "app.db");
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA busy_timeout = 5000");
  const executor = nodeSqliteExecutor(db);
  await migrate(executor, { dialect: "sqlite" });
  return {
    kind: "sqlite",
    args: ["--store", `sqlite:${path}`],
    outbox: new SqlOutboxRepository(executor, "sqlite"),
    path,
    async [Symbol.asyncDispose]() {
      db.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

/** A unique NATS KV bucket. */
export async function kvStore(): Promise<
  CliStoreFixture & { nc: NatsConnection; bucket: string }
> {
  const nc = await connectNats();
  const bucket = uniqueName("cli_kv");
  const kv = await createOutboxBucket(new Kvm(nc), bucket);
  const repository = new NatsKvOutboxRepository(kv);
  return {
    kind: "nats-kv",
    args: ["--store", `nats-kv://${bucket}`, "--nats", await natsUrl()],
    outbox: repository,
    nc,
    bucket,
    async [Symbol.asyncDispose]() {
      await repository.close();
      await kv.destroy().catch(() => {});
      await nc.close();
    },
  };
}

/** Every store kind, for suites that run the same commands on each. */
export const storeFixtures: Array<[string, () => Promise<CliStoreFixture>]> = [
  ["postgres", postgresStore],
  ["sqlite", sqliteStore],
  ["nats-kv", kvStore],
];
