/**
 * A private PgBouncer in front of a Postgres server, for testing the Postgres store through a
 * pooler (transaction pooling mode by default, where LISTEN/NOTIFY does not work). Started from
 * the local binary (Debian package `pgbouncer`; `scripts/install_pgbouncer.sh` installs it) on a
 * free loopback port, trust auth for user `postgres`, as the `postgres` user when the kit runs as
 * root (PgBouncer refuses to run as root).
 *
 * @module
 */

import { freePort, isListening } from "./ports.ts";
import {
  findExecutable,
  isAlive,
  run,
  serviceUser,
  signal,
  sleep,
  startDetached,
  waitForExit,
} from "./process.ts";

/** Options for {@linkcode PgBouncer.start}. */
export interface PgBouncerOptions {
  /** The Postgres server behind it (`postgres://user@host:port/db`; host and port are used). */
  upstream: string;
  /** PgBouncer's `pool_mode`. @default {"transaction"} */
  poolMode?: "session" | "transaction" | "statement";
  /** Server connections per database/user pair. @default {4} */
  poolSize?: number;
}

/** The pgbouncer binary, or `undefined`. */
export function pgbouncerBinary(): string | undefined {
  return findExecutable("pgbouncer", ["/usr/sbin/pgbouncer", "/usr/local/bin/pgbouncer"]);
}

/** A running private PgBouncer. */
export class PgBouncer implements AsyncDisposable {
  /** Its loopback port. */
  readonly port: number;
  /** Its temp dir (configuration, auth file, log). */
  readonly dir: string;
  #launcher: number;
  #stopped = false;

  private constructor(dir: string, port: number, launcher: number) {
    this.dir = dir;
    this.port = port;
    this.#launcher = launcher;
  }

  /** PgBouncer's pid (from its pidfile: with `runuser` the launcher is another process). */
  get pid(): number {
    try {
      return Number(Deno.readTextFileSync(`${this.dir}/pgbouncer.pid`).trim()) || this.#launcher;
    } catch {
      return this.#launcher;
    }
  }

  /** A URL for `database` through the pooler (user `postgres`). */
  urlFor(database: string): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${encodeURIComponent(database)}`;
  }

  /** Starts PgBouncer; throws with a hint when the binary is missing or it does not come up. */
  static async start(options: PgBouncerOptions): Promise<PgBouncer> {
    const binary = pgbouncerBinary();
    if (!binary) {
      throw new Error(
        "pgbouncer not found on PATH or in /usr/sbin: run scripts/install_pgbouncer.sh (Debian package pgbouncer)",
      );
    }
    const upstream = new URL(options.upstream);
    const dir = await Deno.makeTempDir({ prefix: "outbox-pgbouncer-" });
    const port = freePort();
    await Deno.writeTextFile(`${dir}/users.txt`, `"postgres" ""\n`);
    await Deno.writeTextFile(
      `${dir}/pgbouncer.ini`,
      [
        "[databases]",
        `* = host=${upstream.hostname} port=${upstream.port || 5432}`,
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        `listen_port = ${port}`,
        "unix_socket_dir =",
        "auth_type = trust",
        `auth_file = ${dir}/users.txt`,
        `pool_mode = ${options.poolMode ?? "transaction"}`,
        `default_pool_size = ${options.poolSize ?? 4}`,
        "max_client_conn = 200",
        `pidfile = ${dir}/pgbouncer.pid`,
        // postgres.js and node-postgres send these at startup; PgBouncer refuses unknown ones.
        "ignore_startup_parameters = extra_float_digits,options",
      ].join("\n") + "\n",
    );
    const user = serviceUser();
    if (user) await run("chown", ["-R", `${user}:`, dir]);
    const pid = await startDetached({
      command: binary,
      args: [`${dir}/pgbouncer.ini`],
      logFile: `${dir}/pgbouncer.log`,
      user,
    });
    const bouncer = new PgBouncer(dir, port, pid);
    const deadline = Date.now() + 10_000;
    while (!(await isListening("127.0.0.1", port))) {
      if (!isAlive(pid) || Date.now() > deadline) {
        const log = await Deno.readTextFile(`${dir}/pgbouncer.log`).catch(() => "");
        await bouncer.stop();
        throw new Error(`pgbouncer did not start on port ${port}:\n${log.slice(-2_000)}`);
      }
      await sleep(20);
    }
    return bouncer;
  }

  /** Stops PgBouncer and removes its temp dir. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    const pid = this.pid;
    signal(pid, "SIGINT"); // PgBouncer: SIGINT is a fast shutdown
    await waitForExit(pid, 5_000).catch(() => signal(pid, "SIGKILL"));
    await waitForExit(this.#launcher, 5_000).catch(() => signal(this.#launcher, "SIGKILL"));
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  /** Synchronous best-effort stop, for `unload` handlers. */
  stopSync(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    signal(this.pid, "SIGKILL");
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // best effort
    }
  }

  /** Stops PgBouncer. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}
