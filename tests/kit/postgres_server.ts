/**
 * A private Postgres cluster, created with the local binaries (initdb, pg_ctl) in a temp dir
 * and started on a free loopback port. When the kit runs as root, the cluster runs as the
 * `postgres` user. Fault tests restart it or kill it with SIGKILL.
 *
 * @module
 */

import { freePort, isListening, isPortFree, waitForPortFree } from "./ports.ts";
import { isAlive, run, serviceUser, signal, sleep, waitForExit } from "./process.ts";

/** Options for {@linkcode PostgresServer.start}. */
export interface PostgresServerOptions {
  /** Port to bind; a free one when omitted. */
  port?: number;
  /**
   * Trade durability for speed (fsync, synchronous_commit and full_page_writes off), as a
   * throwaway test cluster can. @default {true}
   */
  fast?: boolean;
  /** Extra `-c name=value` settings. */
  settings?: Record<string, string>;
  /**
   * The directory holding initdb/pg_ctl/postgres, for example the npm-shipped binaries
   * (`embeddedPostgresBinDir()`). @default {postgresBinDir()}
   */
  binDir?: string;
}

/** The directory holding initdb/pg_ctl, or `undefined`. */
export function postgresBinDir(): string | undefined {
  const configured = Deno.env.get("OUTBOX_POSTGRES_BIN_DIR");
  if (configured) {
    try {
      Deno.statSync(`${configured}/pg_ctl`);
      return configured;
    } catch {
      return undefined; // configured explicitly: no fallback
    }
  }
  const candidates: string[] = [];
  try {
    for (const entry of Deno.readDirSync("/usr/lib/postgresql")) {
      if (entry.isDirectory) candidates.push(`/usr/lib/postgresql/${entry.name}/bin`);
    }
  } catch {
    // not a Debian layout
  }
  candidates.sort((a, b) => versionOf(b) - versionOf(a));
  for (const dir of candidates) {
    try {
      Deno.statSync(`${dir}/pg_ctl`);
      return dir;
    } catch {
      // incomplete install
    }
  }
  return undefined;
}

function versionOf(dir: string): number {
  return Number(dir.split("/").at(-2)) || 0;
}

/** A running private Postgres cluster with trust auth for user `postgres`. */
export class PostgresServer implements AsyncDisposable {
  /** Loopback port. */
  readonly port: number;
  /** Temp dir holding the data directory and log. */
  readonly dir: string;
  /** `postgres://postgres@127.0.0.1:<port>/postgres`. */
  readonly url: string;
  #bin: string;
  #user: string | undefined;
  #options: PostgresServerOptions;
  #stopped = false;

  private constructor(bin: string, dir: string, port: number, options: PostgresServerOptions) {
    this.#bin = bin;
    this.dir = dir;
    this.port = port;
    this.#options = options;
    this.#user = serviceUser();
    this.url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  }

  /** The data directory. */
  get dataDir(): string {
    return `${this.dir}/data`;
  }

  /** The postmaster pid, or 0 when not running. */
  get pid(): number {
    try {
      return Number(Deno.readTextFileSync(`${this.dataDir}/postmaster.pid`).split("\n")[0]) || 0;
    } catch {
      return 0;
    }
  }

  /** A URL for another database on this cluster. */
  urlFor(database: string): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${encodeURIComponent(database)}`;
  }

  /** Creates and starts a cluster; throws with the log tail when it does not come up. */
  static async start(options: PostgresServerOptions = {}): Promise<PostgresServer> {
    const bin = options.binDir ?? postgresBinDir();
    if (!bin) {
      throw new Error(
        "Postgres binaries not found (looked in /usr/lib/postgresql/*/bin); install the postgresql package or set OUTBOX_TEST_POSTGRES_URL",
      );
    }
    const dir = await Deno.makeTempDir({ prefix: "outbox-pg-" });
    const port = options.port ?? freePort();
    const server = new PostgresServer(bin, dir, port, options);
    try {
      await server.#init();
      await server.#launch();
      return server;
    } catch (error) {
      await server.stop();
      throw error;
    }
  }

  /** Stops (fast shutdown) and starts again on the same port and data. */
  async restart(): Promise<void> {
    await this.#ctl(["-m", "fast", "stop"]).catch(() => {});
    await this.kill().catch(() => {});
    await this.#launch();
  }

  /** Kills the postmaster with `sig` (default SIGKILL) and waits for the port to free. */
  async kill(sig: Deno.Signal = "SIGKILL"): Promise<void> {
    const pid = this.pid;
    if (!pid || !isAlive(pid)) return;
    // A hard crash takes the backends down with the postmaster.
    const children = sig === "SIGKILL" ? await childrenOf(pid) : [];
    signal(pid, sig);
    for (const child of children) signal(child, "SIGKILL");
    await waitForExit(pid);
    for (const child of children) await waitForExit(child);
    await waitForPortFree(this.port);
    await this.#clearStaleLock(pid);
  }

  /** Starts a stopped or killed cluster again. */
  async start(): Promise<void> {
    await this.#launch();
  }

  /** Stops the cluster and removes its temp dir. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    await this.#ctl(["-m", "immediate", "stop"]).catch(() => {});
    await this.kill().catch(() => {});
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  /** Synchronous best-effort stop, for `unload` handlers. */
  stopSync(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    const pid = this.pid;
    if (pid) signal(pid, "SIGQUIT");
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // the postmaster may still hold files; best effort
    }
  }

  /** Stops the cluster. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  async #init(): Promise<void> {
    if (this.#user) {
      await run("chown", ["-R", `${this.#user}:`, this.dir]);
    }
    await run(`${this.#bin}/initdb`, [
      "-D",
      this.dataDir,
      "-U",
      "postgres",
      "--auth=trust",
      "--no-sync",
      "-E",
      "UTF8",
      "--locale=C",
    ], { user: this.#user });
  }

  async #launch(): Promise<void> {
    if (!isPortFree(this.port)) throw new Error(`port ${this.port} is already in use`);
    const fast = this.#options.fast ?? true;
    const settings: Record<string, string> = {
      listen_addresses: "127.0.0.1",
      port: String(this.port),
      unix_socket_directories: this.dir,
      max_connections: "200",
      ...(fast ? { fsync: "off", synchronous_commit: "off", full_page_writes: "off" } : {}),
      ...this.#options.settings,
    };
    const flags = Object.entries(settings).map(([k, v]) => `-c ${k}=${v}`).join(" ");
    await this.#ctl(["-o", flags, "-l", `${this.dir}/postgres.log`, "-w", "-t", "60", "start"])
      .catch(async (error) => {
        const log = await Deno.readTextFile(`${this.dir}/postgres.log`).catch(() => "");
        throw new Error(`${error.message}\n${log.split("\n").slice(-15).join("\n")}`);
      });
    const deadline = Date.now() + 10_000;
    while (!(await isListening("127.0.0.1", this.port))) {
      if (Date.now() > deadline) throw new Error(`postgres is not listening on ${this.port}`);
      await sleep(20);
    }
  }

  /**
   * A killed postmaster can linger as a zombie until init reaps it; Postgres would take its
   * pid in `postmaster.pid` for a live server and refuse to start. Wait for the reaping, then
   * drop the stale lock file (what a crash-restart on a real host amounts to).
   */
  async #clearStaleLock(pid: number): Promise<void> {
    const deadline = Date.now() + 2_000;
    while (Date.now() < deadline && exists(`/proc/${pid}`)) await sleep(20);
    if (exists(`/proc/${pid}`) && this.pid === pid) {
      await Deno.remove(`${this.dataDir}/postmaster.pid`).catch(() => {});
    }
  }

  async #ctl(args: string[]): Promise<string> {
    return await run(`${this.#bin}/pg_ctl`, ["-D", this.dataDir, ...args], { user: this.#user });
  }
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

async function childrenOf(pid: number): Promise<number[]> {
  const out = await run("pgrep", ["-P", String(pid)]).catch(() => "");
  return out.split("\n").map(Number).filter((n) => n > 0);
}
