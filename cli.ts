/**
 * The `outbox-nats` operations CLI and standalone relay.
 *
 * Run it with Deno (`deno run -A jsr:@outbox/nats/cli <command>`) or, from the npm package, as
 * the `outbox-nats` executable (`npx outbox-nats <command>`). Commands:
 *
 * - `status`: counts per state, messages due now, age of the oldest due message (`--json`,
 *   `--watch`).
 * - `dead list`: dead messages with their last error (`--json`, `--limit`).
 * - `requeue <id...>` / `requeue --all-dead [--subject <pattern>]`: dead messages back to pending.
 * - `prune --dispatched-older-than 7d [--dead-older-than 30d] [--dry-run]`: retention in batches.
 * - `migrate [--print]`: create or upgrade the SQL tables (or print the SQL); create a KV bucket.
 * - `relay --nats <url>`: publish the outbox to JetStream until SIGINT / SIGTERM, with a status
 *   line and an optional `--health <port>` endpoint.
 *
 * Every command takes `--store <url>`: `postgres://...`, `postgresql://...`, `sqlite:<path>` or
 * `nats-kv://<bucket>` (with `--nats <url>`). Exit codes: 0 success, 1 failure, 2 usage error.
 *
 * @example
 * ```ts
 * import { main } from "@outbox/nats/cli";
 *
 * // The same as `outbox-nats status --store sqlite:./app.db --json` on the command line.
 * const code = await main(["status", "--store", "sqlite:./app.db", "--json"]);
 * console.log("exit code", code);
 * ```
 *
 * @module
 */

import process from "node:process";
import { setTimeout } from "node:timers";
import { run } from "./src/cli/main.ts";

/**
 * Runs the CLI with `argv` (the arguments after the program name, e.g. `["status", "--store",
 * "sqlite:./app.db"]`) and resolves with the exit code: 0 on success, 1 when the command failed
 * (store or NATS unreachable, missing tables, ...), 2 for a usage error. Output goes to the
 * process's standard output; errors are ONE line on standard error (`--verbose` adds the stack).
 *
 * @example
 * ```ts
 * import { main } from "@outbox/nats/cli";
 * const code = await main(["--help"]);
 * console.log(code); // 0
 * ```
 */
export function main(argv: string[]): Promise<number> {
  return run(argv);
}

/**
 * Runs {@linkcode main} with the process's arguments and exits with its code. Resources are
 * closed by the commands; should anything still hold the event loop open, the process exits
 * anyway shortly after.
 */
async function runAsProgram(): Promise<void> {
  const code = await main(process.argv.slice(2));
  // The command has reported its outcome in one line. A late error from a connection it gave up
  // on (nats.js' socket reset after a refused login) must not add an uncaught second one.
  process.on("uncaughtException", () => {});
  process.on("unhandledRejection", () => {});
  process.exitCode = code;
  setTimeout(() => process.exit(code), 2_000).unref();
}

if ((import.meta as { main?: boolean }).main) await runAsProgram();
