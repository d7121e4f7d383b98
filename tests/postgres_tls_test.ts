/**
 * Postgres TLS through the URL (`sslmode`): against a private Postgres with `ssl=on` the CLI
 * migrates and reads with `sslmode=require`; against a server without TLS, `sslmode=require` is
 * one line saying so (not a bare socket error), and a password in the URL is never printed.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import postgres from "postgres";
import { checkPostgresServer } from "../mod.ts";
import { runCli } from "./helpers/cli.ts";
import { PostgresServer, postgresUrl } from "./kit/mod.ts";
import { postgresBinDir } from "./kit/postgres_server.ts";

async function run(cmd: string, args: string[], cwd?: string): Promise<void> {
  const output = await new Deno.Command(cmd, { args, cwd, stdout: "null", stderr: "piped" })
    .output();
  if (!output.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(output.stderr)}`);
  }
}

Deno.test({
  name: "postgres tls: sslmode=require against a Postgres with ssl=on; the CLI migrates and reads",
  ignore: postgresBinDir() === undefined,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "outbox_pgtls_" });
    await Deno.chmod(dir, 0o755);
    await run("openssl", [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      "server.key",
      "-out",
      "server.crt",
      "-days",
      "2",
      "-subj",
      "/CN=127.0.0.1",
    ], dir);
    await Deno.chmod(join(dir, "server.key"), 0o600);
    if (Deno.uid() === 0) await run("chown", ["postgres:", join(dir, "server.key")]);
    const server = await PostgresServer.start({
      settings: {
        ssl: "on",
        ssl_cert_file: join(dir, "server.crt"),
        ssl_key_file: join(dir, "server.key"),
      },
    });
    try {
      const url = `${server.url}${server.url.includes("?") ? "&" : "?"}sslmode=require`;
      await checkPostgresServer(url);
      const sql = postgres(url, { max: 1, onnotice: () => {} });
      try {
        const [row] = await sql`SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`;
        assert.equal(row.ssl, true, "the URL's sslmode=require gave a TLS session");
      } finally {
        await sql.end();
      }
      const migrated = await runCli(["migrate", "--store", url]);
      assert.equal(migrated.code, 0, migrated.stderr);
      const status = await runCli(["status", "--store", url, "--json"]);
      assert.equal(status.code, 0, status.stderr);
      assert.equal(JSON.parse(status.stdout).pending, 0);
    } finally {
      await server.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("postgres tls: sslmode=require against a server without TLS is one line", async () => {
  const base = new URL(await postgresUrl());
  // The shared test server has no TLS; skip if someone runs the suite against one that has.
  const ssl = await new Deno.Command("psql", {
    args: [base.toString(), "-Atc", "show ssl"],
    stdout: "piped",
    stderr: "null",
  }).output().then((o) => new TextDecoder().decode(o.stdout).trim(), () => "unknown");
  if (ssl !== "off") return;
  base.password = "pg-s3cret";
  base.searchParams.set("sslmode", "require");
  const result = await runCli(["status", "--store", base.toString()], {}, { timeoutMs: 30_000 });
  assert.equal(result.code, 1, result.stderr);
  const lines = result.stderr.trim().split("\n");
  assert.equal(lines.length, 1, result.stderr);
  assert.match(
    lines[0],
    /^outbox-nats: cannot connect to Postgres at .*: cannot connect to .*: the server does not accept TLS, but the URL asks for sslmode=require$/,
  );
  assert.doesNotMatch(result.stderr, /pg-s3cret/);
});
