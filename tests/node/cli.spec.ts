/**
 * The INSTALLED package's `outbox-nats` executable on Node: --help, migrate and status against
 * Postgres and SQLite (node:sqlite), and errors as one line
 * with exit codes 1 and 2.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import postgres from "postgres";
import { postgresJsExecutor, SqlOutboxRepository } from "@outbox/nats";

const bin = join(process.cwd(), "node_modules", ".bin", "outbox-nats");
const postgresUrl = process.env.OUTBOX_TEST_POSTGRES_URL ??
  "postgres://postgres@127.0.0.1:5432/test";

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

function cli(args: string[]): Promise<Result> {
  return new Promise((resolve) => {
    execFile(
      bin,
      args,
      { env: { ...process.env, OUTBOX_STORE_URL: "" } },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

test("node cli: --help lists the commands and exits 0", async () => {
  const result = await cli(["--help"]);
  assert.equal(result.code, 0, result.stderr);
  assert.match(result.stdout, /^Usage: outbox-nats <command> \[options\]$/m);
  for (const command of ["status", "dead list", "requeue", "prune", "migrate", "relay"]) {
    assert.ok(result.stdout.includes(`  ${command} `), command);
  }
  const help = await cli(["relay", "--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /--health <port>/);
});

test("node cli: migrate and status against Postgres", async () => {
  const table = `ob_cli_${randomUUID().replaceAll("-", "").slice(0, 16)}`;
  const args = ["--store", postgresUrl, "--outbox-table", table, "--inbox-table", `${table}_i`];
  const sql = postgres(postgresUrl, { max: 1, onnotice: () => {} });
  try {
    const migrated = await cli(["migrate", ...args]);
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.match(migrated.stdout, /from version 0 to 6/);
    const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", {
      outbox: table,
      inbox: `${table}_i`,
    });
    await outbox.enqueueMany([1, 2, 3].map((n) => ({
      id: `${table}-${n}`,
      kind: "event.publish" as const,
      name: "node.cli",
      subject: "node.cli.e",
      payload: "{}",
      headers: {},
    })));
    const status = await cli(["status", ...args, "--json"]);
    assert.equal(status.code, 0, status.stderr);
    const report = JSON.parse(status.stdout);
    assert.equal(report.pending, 3);
    assert.equal(report.due, 3);
    const text = await cli(["status", ...args]);
    assert.match(text.stdout, /^\s+pending\s+3$/m);
  } finally {
    await sql.unsafe(
      `DROP TABLE IF EXISTS ${table}, ${table}_i, ${table}_migrations, ${table}_keys`,
    );
    await sql.end();
  }
});

test("node cli: SQLite (node:sqlite on Node >= 22)", async () => {
  const dir = mkdtempSync(join(tmpdir(), "outbox-cli-node-"));
  try {
    const store = `sqlite:${join(dir, "app.db")}`;
    const migrated = await cli(["migrate", "--store", store]);
    assert.equal(migrated.code, 0, migrated.stderr);
    const status = await cli(["status", "--store", store, "--json"]);
    assert.equal(status.code, 0, status.stderr);
    assert.equal(JSON.parse(status.stdout).pending, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("node cli: errors are one line on stderr with exit codes 2 (usage) and 1 (failure)", async () => {
  const usage = await cli(["status", "--store", "mysql://db/app"]);
  assert.equal(usage.code, 2);
  assert.equal(usage.stdout, "");
  assert.equal(usage.stderr.trimEnd().split("\n").length, 1);
  assert.match(usage.stderr, /^outbox-nats: unsupported store URL scheme/);

  const unreachable = await cli(["status", "--store", "postgres://postgres@127.0.0.1:1/test"]);
  assert.equal(unreachable.code, 1);
  assert.equal(unreachable.stderr.trimEnd().split("\n").length, 1, unreachable.stderr);
  assert.match(unreachable.stderr, /^outbox-nats: cannot connect to Postgres at .*ECONNREFUSED/);
  assert.doesNotMatch(unreachable.stderr, /^\s+at /m);
});
