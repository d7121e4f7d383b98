/**
 * Docker fallback for the test kit: when neither an env URL nor local binaries are available and
 * a Docker engine answers, the kit runs `nats -js` and `postgres` containers.
 *
 * @module
 */

import { isListening } from "./ports.ts";
import { run, sleep } from "./process.ts";

/** Whether a Docker engine answers (not just the client being installed). */
export async function dockerAvailable(): Promise<boolean> {
  try {
    const output = await new Deno.Command("docker", {
      args: ["info", "--format", "{{.ServerVersion}}"],
      stdout: "piped",
      stderr: "null",
      stdin: "null",
    }).output();
    return output.success && new TextDecoder().decode(output.stdout).trim().length > 0;
  } catch {
    return false;
  }
}

/** Options for {@linkcode DockerContainer.run}. */
export interface DockerRunOptions {
  /** Image, for example `nats:2.10`. */
  image: string;
  /** The container port to publish on a random loopback port. */
  containerPort: number;
  /** Environment variables. */
  env?: Record<string, string>;
  /** Arguments after the image (the container command). */
  args?: string[];
  /** Resolves once the service in the container is ready. */
  ready(container: DockerContainer): Promise<boolean>;
}

/** A running container, removed on stop. */
export class DockerContainer implements AsyncDisposable {
  /** Container id. */
  readonly id: string;
  /** Loopback port mapped to the container port. */
  readonly hostPort: number;
  #stopped = false;

  private constructor(id: string, hostPort: number) {
    this.id = id;
    this.hostPort = hostPort;
  }

  /** Starts a container and waits until `ready` says so (60 s at most). */
  static async run(options: DockerRunOptions): Promise<DockerContainer> {
    const envArgs = Object.entries(options.env ?? {}).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
    const id = (await run("docker", [
      "run",
      "-d",
      "--rm",
      "-p",
      `127.0.0.1::${options.containerPort}`,
      ...envArgs,
      options.image,
      ...(options.args ?? []),
    ])).trim();
    const mapping = (await run("docker", ["port", id, `${options.containerPort}/tcp`])).trim();
    const hostPort = Number(mapping.split("\n")[0].split(":").at(-1));
    const container = new DockerContainer(id, hostPort);
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (await isListening("127.0.0.1", hostPort) && await options.ready(container)) {
        return container;
      }
      await sleep(250);
    }
    await container.stop();
    throw new Error(`container ${options.image} did not become ready in 60 s`);
  }

  /** Runs a command inside the container; true when it exits 0. */
  async exec(args: string[]): Promise<boolean> {
    try {
      await run("docker", ["exec", this.id, ...args]);
      return true;
    } catch {
      return false;
    }
  }

  /** Removes the container. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    await run("docker", ["rm", "-f", this.id]).catch(() => {});
  }

  /** Synchronous removal, for `unload` handlers. */
  stopSync(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    try {
      new Deno.Command("docker", { args: ["rm", "-f", this.id], stdout: "null", stderr: "null" })
        .outputSync();
    } catch {
      // best effort
    }
  }

  /** Removes the container. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** Starts NATS with JetStream in Docker. */
export function startDockerNats(): Promise<DockerContainer> {
  return DockerContainer.run({
    image: Deno.env.get("OUTBOX_TEST_NATS_IMAGE") ?? "nats:2.10",
    containerPort: 4222,
    args: ["-js"],
    ready: () => Promise.resolve(true),
  });
}

/** Starts Postgres (trust auth) in Docker. */
export function startDockerPostgres(): Promise<DockerContainer> {
  return DockerContainer.run({
    image: Deno.env.get("OUTBOX_TEST_POSTGRES_IMAGE") ?? "postgres:16",
    containerPort: 5432,
    env: { POSTGRES_HOST_AUTH_METHOD: "trust" },
    ready: (container) => container.exec(["pg_isready", "-U", "postgres", "-h", "127.0.0.1"]),
  });
}
