/**
 * A private nats-server with JetStream, started from the local binary on a free loopback port in
 * a temp dir. Fault tests kill, pause, and restart it on the same port and store.
 *
 * @module
 */

import { freePort, isPortFree, waitForPortFree } from "./ports.ts";
import { findExecutable, isAlive, signal, sleep, startDetached, waitForExit } from "./process.ts";

/** Options for {@linkcode NatsServer.start}. */
export interface NatsServerOptions {
  /** Port to bind; a free one when omitted. */
  port?: number;
  /** Server-wide `max_payload` in bytes. @default {1048576} */
  maxPayload?: number;
  /** Extra lines for the server configuration file. */
  config?: string[];
  /** Start with JetStream enabled; `false` gives a core-NATS-only server. @default {true} */
  jetstream?: boolean;
}

/**
 * Where the nats-server binary is, or `undefined`. `OUTBOX_NATS_SERVER_BIN`, when set, is the
 * only place looked at.
 */
export function natsServerBinary(): string | undefined {
  const configured = Deno.env.get("OUTBOX_NATS_SERVER_BIN");
  if (configured) return findExecutable("", [configured]); // explicit: no fallback
  return findExecutable("nats-server", ["/usr/sbin/nats-server", "/usr/local/bin/nats-server"]);
}

/** A running private nats-server. */
export class NatsServer implements AsyncDisposable {
  /** Loopback port it listens on. */
  readonly port: number;
  /** Its temp dir: configuration, log and JetStream store. */
  readonly dir: string;
  /** `nats://127.0.0.1:<port>`. */
  readonly url: string;
  #binary: string;
  #pid = 0;
  #stopped = false;

  private constructor(binary: string, dir: string, port: number) {
    this.#binary = binary;
    this.dir = dir;
    this.port = port;
    this.url = `nats://127.0.0.1:${port}`;
  }

  /** The server process id (changes on restart). */
  get pid(): number {
    return this.#pid;
  }

  /** The JetStream store directory (kept across restarts). */
  get storeDir(): string {
    return `${this.dir}/jetstream`;
  }

  /** The server log. */
  get logFile(): string {
    return `${this.dir}/server.log`;
  }

  /** Starts a server; throws with the log tail when it does not come up. */
  static async start(options: NatsServerOptions = {}): Promise<NatsServer> {
    const binary = natsServerBinary();
    if (!binary) {
      throw new Error(
        "nats-server not found on PATH or in /usr/sbin; install it (https://docs.nats.io/running-a-nats-service/introduction/installation) or set OUTBOX_TEST_NATS_URL",
      );
    }
    let lastError: unknown;
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = options.port ?? freePort();
      const dir = await Deno.makeTempDir({ prefix: "outbox-nats-" });
      const server = new NatsServer(binary, dir, port);
      await Deno.writeTextFile(
        `${dir}/server.conf`,
        [
          `listen: "127.0.0.1:${port}"`,
          `max_payload: ${options.maxPayload ?? 1048576}`,
          ...(options.jetstream === false ? [] : [`jetstream { store_dir: "${server.storeDir}" }`]),
          ...(options.config ?? []),
        ].join("\n") + "\n",
      );
      try {
        await server.#launch();
        return server;
      } catch (error) {
        lastError = error;
        await server.stop();
        if (options.port !== undefined) break;
      }
    }
    throw lastError;
  }

  /** Starts the server again on the same port and store (after `kill`). */
  async restart(): Promise<void> {
    if (isAlive(this.#pid)) await this.kill("SIGKILL");
    await waitForPortFree(this.port);
    await this.#launch();
  }

  /** Sends `sig` (default SIGKILL) and waits for the process to exit and its port to free. */
  async kill(sig: Deno.Signal = "SIGKILL"): Promise<void> {
    if (!this.#pid) return;
    signal(this.#pid, sig);
    await waitForExit(this.#pid);
    await waitForPortFree(this.port);
  }

  /** Freezes the server (SIGSTOP): connections stay open, nothing is answered. */
  pause(): void {
    signal(this.#pid, "SIGSTOP");
  }

  /** Resumes a paused server (SIGCONT). */
  resume(): void {
    signal(this.#pid, "SIGCONT");
  }

  /** Stops the server and removes its temp dir. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    if (this.#pid && isAlive(this.#pid)) {
      signal(this.#pid, "SIGCONT");
      signal(this.#pid, "SIGTERM");
      try {
        await waitForExit(this.#pid, 5_000);
      } catch {
        await this.kill("SIGKILL");
      }
    }
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }

  /** Synchronous best-effort stop, for `unload` handlers. */
  stopSync(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    if (this.#pid) signal(this.#pid, "SIGKILL");
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // best effort
    }
  }

  /** Stops the server. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  async #launch(): Promise<void> {
    if (!isPortFree(this.port)) throw new Error(`port ${this.port} is already in use`);
    const logStart = await fileSize(this.logFile);
    this.#pid = await startDetached({
      command: this.#binary,
      args: ["-c", `${this.dir}/server.conf`],
      logFile: this.logFile,
    });
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const log = await readFrom(this.logFile, logStart);
      if (log.includes("Server is ready") && log.includes(`127.0.0.1:${this.port}`)) return;
      if (!isAlive(this.#pid)) {
        throw new Error(`nats-server exited on start (port ${this.port}):\n${tail(log)}`);
      }
      await sleep(20);
    }
    throw new Error(`nats-server did not become ready on port ${this.port}`);
  }
}

async function fileSize(path: string): Promise<number> {
  try {
    return (await Deno.stat(path)).size;
  } catch {
    return 0;
  }
}

async function readFrom(path: string, offset: number): Promise<string> {
  try {
    const bytes = await Deno.readFile(path);
    return new TextDecoder().decode(bytes.subarray(offset));
  } catch {
    return "";
  }
}

function tail(text: string, lines = 15): string {
  return text.trim().split("\n").slice(-lines).join("\n");
}
