/**
 * `outbox-nats migrate` as a subprocess: --print shows the pending SQL and changes nothing;
 * without it the tables are created or upgraded with migrate(). Postgres, SQLite, NATS KV.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import postgres from "postgres";
import { migrate, nodeSqliteExecutor } from "../mod.ts";
import { runCli } from "./helpers/cli.ts";
import { connectNats, createTestDatabase, natsUrl, uniqueName } from "./kit/mod.ts";
import { schemaV1 } from "../src/stores/sql/schema.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";

Deno.test("cli migrate postgres: --print lists pending SQL without changing anything; migrate applies it", async () => {
  await using database = await createTestDatabase();
  const sql = postgres(database.url, { max: 1, onnotice: () => {} });
  try {
    const outbox = uniqueName("cli_m");
    const args = [
      "--store",
      database.url,
      "--outbox-table",
      outbox,
      "--inbox-table",
      `${outbox}_i`,
    ];
    const exists = async () =>
      (await sql.unsafe("SELECT to_regclass($1) IS NOT NULL AS ok", [outbox]))[0].ok;

    const printed = await runCli(["migrate", "--print", ...args]);
    assert.equal(printed.code, 0, printed.stderr);
    // An empty database gets the current schema in one piece, not version 1 plus ALTERs.
    assert.match(printed.stdout, /has no outbox tables: the current schema \(version 6\)/);
    assert.match(
      printed.stdout,
      new RegExp(`^CREATE TABLE IF NOT EXISTS ${outbox} \\(.*\\bseq\\b.*\\bclaim_token\\b`, "m"),
    );
    assert.doesNotMatch(printed.stdout, /ALTER TABLE|_v1 \(version 1/);
    assert.equal(await exists(), false, "--print changed nothing");

    const applied = await runCli(["migrate", ...args]);
    assert.equal(applied.code, 0, applied.stderr);
    assert.match(
      applied.stdout,
      /from version 0 to 6: applied trellis_sql_outbox_inbox_postgres_v1, trellis_sql_outbox_inbox_postgres_v2, trellis_sql_outbox_inbox_postgres_v3, trellis_sql_outbox_inbox_postgres_v4, trellis_sql_outbox_inbox_postgres_v5, trellis_sql_outbox_inbox_postgres_v6/,
    );
    assert.equal(await exists(), true);

    const again = await runCli(["migrate", "--print", ...args]);
    assert.match(again.stdout, /nothing to migrate: .* at version 6/);
    const status = await runCli(["status", ...args, "--json"]);
    assert.equal(status.code, 0, status.stderr);
    assert.equal(JSON.parse(status.stdout).pending, 0);
  } finally {
    await sql.end();
  }
});

Deno.test("cli migrate postgres: tables made by the reference's DDL are upgraded from version 1", async () => {
  await using database = await createTestDatabase();
  const sql = postgres(database.url, { max: 1, onnotice: () => {} });
  try {
    const outbox = uniqueName("cli_v1");
    const tables = resolveSqlOutboxTables({ outbox, inbox: `${outbox}_i` });
    for (const statement of schemaV1("postgres", tables)) await sql.unsafe(statement);
    const args = [
      "--store",
      database.url,
      "--outbox-table",
      outbox,
      "--inbox-table",
      `${outbox}_i`,
    ];

    const status = await runCli(["status", ...args]);
    assert.equal(status.code, 1);
    assert.match(
      status.stderr,
      new RegExp(
        `has schema version 1; upgrade it with "outbox-nats migrate --store postgres://\\S+ --outbox-table ${outbox} --inbox-table ${outbox}_i"`,
      ),
    );

    const printed = await runCli(["migrate", "--print", ...args]);
    assert.match(
      printed.stdout,
      /exists without a migration record: "outbox-nats migrate" adopts it at version 1/,
    );
    assert.match(printed.stdout, /version 1 -> 6/);
    assert.doesNotMatch(printed.stdout, /_v1 \(version 1/);
    assert.match(printed.stdout, new RegExp(`^ALTER TABLE ${outbox} ADD COLUMN seq bigint;$`, "m"));

    const applied = await runCli(["migrate", ...args]);
    assert.equal(applied.code, 0, applied.stderr);
    assert.match(applied.stdout, /from version 1 to 6 \(existing tables adopted at version 1\)/);
    assert.equal((await runCli(["status", ...args])).code, 0);
  } finally {
    await sql.end();
  }
});

Deno.test("cli migrate sqlite: --print on a missing file, then migrate creates the file and tables", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox-cli-" });
  try {
    const path = join(dir, "app.db");
    const printed = await runCli(["migrate", "--print", "--store", `sqlite:${path}`]);
    assert.equal(printed.code, 0, printed.stderr);
    assert.match(printed.stdout, /\(it does not exist\) has no outbox tables: the current schema/);
    assert.match(
      printed.stdout,
      /^CREATE TABLE IF NOT EXISTS trellis_outbox \(.*\bseq INTEGER PRIMARY KEY/m,
    );
    assert.doesNotMatch(printed.stdout, /ALTER TABLE/);
    await assert.rejects(Deno.stat(path), Deno.errors.NotFound);

    const applied = await runCli(["migrate", "--store", `sqlite:${path}`]);
    assert.equal(applied.code, 0, applied.stderr);
    assert.match(applied.stdout, /from version 0 to 6/);
    const db = new DatabaseSync(path);
    try {
      const rows = db.prepare("SELECT version FROM trellis_outbox_migrations ORDER BY version")
        .all() as Array<{ version: number }>;
      assert.deepEqual(rows.map((row) => Number(row.version)), [1, 2, 3, 4, 5, 6]);
    } finally {
      db.close();
    }
    const again = await runCli(["migrate", "--print", "--store", `sqlite:${path}`]);
    assert.match(again.stdout, /nothing to migrate/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * Runs on the SQLite file at `path` the SQL `migrate --print` shows for it, as a DBA would (for
 * an empty file: the current schema, without a migration record).
 */
async function runPrintedSchema(path: string): Promise<void> {
  const printed = await runCli(["migrate", "--print", "--store", `sqlite:${path}`]);
  assert.equal(printed.code, 0, printed.stderr);
  const db = new DatabaseSync(path);
  try {
    db.exec(printed.stdout);
  } finally {
    db.close();
  }
}

Deno.test("cli migrate sqlite: the SQL --print shows for an empty database is what migrate adopts", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox-cli-" });
  try {
    const path = join(dir, "app.db");
    await runPrintedSchema(path);
    const adopted = await runCli(["migrate", "--store", `sqlite:${path}`]);
    assert.equal(adopted.code, 0, adopted.stderr);
    assert.match(
      adopted.stdout,
      /at version 6 \(the latest\): nothing to migrate \(existing tables adopted at version 6\)/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cli migrate nats-kv: creates the bucket once (--print creates nothing)", async () => {
  const bucket = uniqueName("cli_mkv");
  const args = ["--store", `nats-kv://${bucket}`, "--nats", await natsUrl()];
  const nc = await connectNats();
  try {
    const jsm = await jetstreamManager(nc);
    const printed = await runCli(["migrate", "--print", ...args]);
    assert.equal(printed.code, 0, printed.stderr);
    assert.match(printed.stdout, new RegExp(`would create NATS KV bucket "${bucket}"`));
    await assert.rejects(jsm.streams.info(`KV_${bucket}`));

    const created = await runCli(["migrate", ...args]);
    assert.equal(created.code, 0, created.stderr);
    assert.match(created.stdout, new RegExp(`created NATS KV bucket "${bucket}"`));
    const info = await jsm.streams.info(`KV_${bucket}`);
    assert.equal(info.config.max_msgs_per_subject, 1);

    const again = await runCli(["migrate", ...args]);
    assert.match(again.stdout, /exists: nothing to do/);
    const status = await runCli(["status", ...args, "--json"]);
    assert.equal(status.code, 0, status.stderr);
  } finally {
    await (await new Kvm(nc).open(bucket)).destroy().catch(() => {});
    await nc.close();
  }
});

Deno.test("cli: a version 2 outbox is refused by status until migrated to version 6", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox-cli-" });
  try {
    const path = join(dir, "app.db");
    const db = new DatabaseSync(path);
    try {
      await migrate(nodeSqliteExecutor(db), { dialect: "sqlite", to: 2 });
    } finally {
      db.close();
    }
    const store = ["--store", `sqlite:${path}`];
    const status = await runCli(["status", ...store]);
    assert.equal(status.code, 1);
    assert.match(
      status.stderr,
      /has schema version 2; upgrade it with "outbox-nats migrate --store /,
    );
    const printed = await runCli(["migrate", "--print", ...store]);
    assert.match(printed.stdout, /4 pending migration\(s\) for .* version 2 -> 6/);
    assert.match(printed.stdout, /^ALTER TABLE trellis_outbox ADD COLUMN claim_token TEXT;$/m);
    assert.equal((await runCli(["migrate", ...store])).code, 0);
    assert.equal((await runCli(["status", ...store])).code, 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cli migrate sqlite: --print on tables without a migration record shows the version migrate adopts them at", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox-cli-" });
  try {
    const path = join(dir, "app.db");
    await runPrintedSchema(path);
    // migrate adopts these tables at 6 with nothing to run; --print must not list versions 4
    // to 6 (version 4's CREATE TABLE of the key fence would fail on them).
    const again = await runCli(["migrate", "--print", "--store", `sqlite:${path}`]);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /adopts it at version 6/);
    assert.match(again.stdout, /nothing to migrate: .* at version 6/);
    assert.doesNotMatch(again.stdout, /CREATE TABLE/);

    // The previous release's schema (version 5: the claim index still there): only version 6.
    const v5 = new DatabaseSync(path);
    try {
      v5.exec(
        "CREATE INDEX trellis_outbox_claim_idx ON trellis_outbox (seq, next_attempt_at, state) WHERE state IN ('pending', 'claimed', 'failed')",
      );
    } finally {
      v5.close();
    }
    const pending = await runCli(["migrate", "--print", "--store", `sqlite:${path}`]);
    assert.equal(pending.code, 0, pending.stderr);
    assert.match(pending.stdout, /adopts it at version 5/);
    assert.match(pending.stdout, /1 pending migration\(s\) for .*, version 5 -> 6/);
    assert.doesNotMatch(pending.stdout, /_v4 \(version 4/);
    const applied = await runCli(["migrate", "--store", `sqlite:${path}`]);
    assert.match(applied.stdout, /from version 5 to 6 \(existing tables adopted at version 5\)/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
