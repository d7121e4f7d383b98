/**
 * The CLI on bad input, run as a subprocess: unknown commands, options and URL schemes,
 * unreachable Postgres and NATS, missing tables, files and buckets. Each is ONE line on stderr,
 * exit code 2 for usage errors and 1 for runtime failures, no stack trace unless --verbose.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { type CliResult, postgresStore, runCli } from "./helpers/cli.ts";
import { commands } from "../src/cli/main.ts";
import { createTestDatabase, freePort, natsUrl, uniqueName } from "./kit/mod.ts";

/** One line on stderr, starting with "outbox-nats: ", nothing on stdout, no stack. */
function assertOneLineError(result: CliResult, code: number, pattern: RegExp): void {
  assert.equal(result.code, code, `exit code (stderr: ${result.stderr})`);
  const lines = result.stderr.split("\n").filter((line) => line.length > 0);
  assert.equal(lines.length, 1, `exactly one line on stderr, got:\n${result.stderr}`);
  assert.match(lines[0], /^outbox-nats: /);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(result.stderr, /^\s+at /m, "no stack trace");
  assert.equal(result.stdout, "");
}

Deno.test("cli errors: usage errors exit 2 with one line", async () => {
  assertOneLineError(await runCli(["bogus"]), 2, /unknown command "bogus"/);
  assertOneLineError(await runCli(["dead", "purge"]), 2, /unknown command "dead purge"/);
  assertOneLineError(await runCli(["dead"]), 2, /"dead" needs a subcommand: "dead list"/);
  assertOneLineError(
    await runCli(["dead", "list", "--store", "sqlite:x.db", "--limit", "-5"]),
    2,
    /--limit: negative values are not accepted, got "-5"$/,
  );
  assertOneLineError(
    await runCli(["requeue", "--store", "sqlite:x.db", "--subject", "orders.>"]),
    2,
    /requeue: --subject needs --all-dead \(requeue --all-dead --subject 'orders.>'\)/,
  );
  assertOneLineError(
    await runCli(["relay", "--store", "sqlite:x.db", "--nats", "http://127.0.0.1:8222"]),
    2,
    /--nats: "http:\/\/127\.0\.0\.1:8222" is not a NATS URL; use nats:\/\/host:4222/,
  );
  assertOneLineError(
    await runCli(["status", "--store", "nats-kv://b", "--nats", "https://u:pw@host"]),
    2,
    /--nats: "https:\/\/u:\*\*\*@host\/?" is not a NATS URL/,
  );
  assertOneLineError(
    await runCli(["status", "--store", "sqlite:x.db", "--frobnicate"]),
    2,
    /status: Unknown option '--frobnicate'/,
  );
  assertOneLineError(
    await runCli(["status", "--store", "mysql://db/app"]),
    2,
    /unsupported store URL scheme \("mysql:"\)/,
  );
  assertOneLineError(await runCli(["status"]), 2, /no store given: pass --store <url>/);
  assertOneLineError(
    await runCli(["prune", "--store", "sqlite:x.db", "--dispatched-older-than", "7 days"]),
    2,
    /--dispatched-older-than: invalid duration "7 days"/,
  );
  assertOneLineError(
    await runCli(["requeue", "--store", "sqlite:x.db"]),
    2,
    /give the ids of dead messages, or --all-dead/,
  );
  assertOneLineError(
    await runCli(["status", "--store", "nats-kv://bucket"]),
    2,
    /needs --nats <url>/,
  );
  assertOneLineError(
    await runCli(["status", "--store", "sqlite:x.db", "--outbox-table", "drop table"]),
    2,
    /Invalid SQL outbox table name "drop table"/,
  );
  assertOneLineError(
    await runCli(["relay", "--store", "sqlite:x.db"]),
    2,
    /relay: --nats <url> \(or OUTBOX_NATS_URL\) is required/,
  );
  assertOneLineError(
    await runCli([
      "relay",
      "--store",
      "sqlite:x.db",
      "--nats",
      "nats://127.0.0.1:4222",
      "--key-fence",
      "on",
    ]),
    2,
    /--key-fence must be "subject" or "off", got "on"/,
  );
  const none = await runCli([]);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /Usage: outbox-nats <command>/);
});

Deno.test("cli errors: --help for every command, exit 0", async () => {
  const main = await runCli(["--help"]);
  assert.equal(main.code, 0);
  for (const command of commands) {
    assert.ok(main.stdout.includes(`  ${command.name} `), `${command.name} listed`);
    const help = await runCli([...command.name.split(" "), "--help"]);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, new RegExp(`^Usage: outbox-nats ${command.name} \\[options\\]`, "m"));
    assert.match(help.stdout, /--store <url>/);
    assert.match(help.stdout, /^Exit codes: 0 success, 1 failure/m);
  }
});

Deno.test("cli errors: unreachable Postgres exits 1 with one line; --verbose adds the stack", async () => {
  const url = `postgres://postgres@127.0.0.1:${freePort()}/test`;
  const result = await runCli(["status", "--store", url]);
  assertOneLineError(result, 1, /cannot connect to Postgres at postgres:\/\/.*ECONNREFUSED/);

  const verbose = await runCli(["status", "--store", url, "--verbose"]);
  assert.equal(verbose.code, 1);
  assert.match(verbose.stderr, /^outbox-nats: cannot connect to Postgres/);
  assert.match(verbose.stderr, /^\s+at /m, "stack trace with --verbose");
  assert.match(verbose.stderr, /caused by: /);
});

Deno.test("cli errors: a password in the store URL is never printed", async () => {
  const url = `postgres://postgres:s3cret@127.0.0.1:${freePort()}/test`;
  const result = await runCli(["status", "--store", url]);
  assertOneLineError(result, 1, /postgres:\/\/postgres:\*\*\*@127\.0\.0\.1/);
  assert.doesNotMatch(result.stderr, /s3cret/);
});

Deno.test("cli errors: unreachable NATS exits 1 (KV store and relay)", async () => {
  const nats = `nats://127.0.0.1:${freePort()}`;
  assertOneLineError(
    await runCli(["status", "--store", "nats-kv://some_bucket", "--nats", nats]),
    1,
    /cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+: /,
  );
  await using store = await postgresStore();
  assertOneLineError(
    await runCli(["relay", ...store.args, "--nats", nats]),
    1,
    /cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+: /,
  );
});

Deno.test("cli errors: missing tables, database file and bucket exit 1 and say how to create them", async () => {
  await using database = await createTestDatabase();
  for (const command of [["status"], ["dead", "list"], ["requeue", "--all-dead"], ["relay"]]) {
    assertOneLineError(
      await runCli([
        ...command,
        "--store",
        database.url,
        "--outbox-table",
        "no_such_outbox",
        "--nats",
        await natsUrl(),
      ]),
      1,
      // The hint repeats the options naming the table, so it can be run as shown.
      /outbox table "no_such_outbox" does not exist in postgres:\/\/.*; create it with "outbox-nats migrate --store postgres:\/\/\S+ --outbox-table no_such_outbox"$/,
    );
  }
  assertOneLineError(
    await runCli(["status", "--store", `${database.url.replace(/\/[^/]*$/, "/no_such_database")}`]),
    1,
    /cannot connect to Postgres at .*database "no_such_database" does not exist/,
  );

  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "missing.db");
    assertOneLineError(
      await runCli(["status", "--store", `sqlite:${path}`]),
      1,
      /SQLite database .*missing\.db does not exist/,
    );
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound, "status created no file");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }

  const bucket = uniqueName("cli_missing");
  assertOneLineError(
    await runCli(["dead", "list", "--store", `nats-kv://${bucket}`, "--nats", await natsUrl()]),
    1,
    new RegExp(
      `NATS KV bucket "${bucket}" does not exist; create it with "outbox-nats migrate --store nats-kv://${bucket} --nats nats://\\S+"$`,
    ),
  );
});
