/**
 * `outbox-nats migrate`: bring the SQL tables to the latest schema with `migrate()`, or print
 * the SQL of the pending migrations (`--print`) for a DBA. For a NATS KV store: create the
 * bucket with the settings the store needs.
 *
 * @module
 */

import { existsSync } from "node:fs";
import { Kvm } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import {
  createOutboxBucket,
  createPostgresOutboxSchema,
  createSqliteOutboxSchema,
  getSqlOutboxMigrations,
  migrate,
  type ResolvedSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxMigration,
} from "../../mod.ts";
import { detectShape } from "../stores/sql/migrations.ts";
import { type Command, integerValue, storeSettings } from "./args.ts";
import { CliError, describeError } from "./errors.ts";
import type { CliIo } from "./io.ts";
import { connectStoreNats, openSqlDatabase, type SqlDatabase, sqlTables } from "./store.ts";

/**
 * The version recorded in the migrations table (0 when it does not exist or is empty), read
 * without changing anything.
 */
async function recordedVersion(db: SqlDatabase): Promise<number> {
  const table = db.tables.migrations;
  const exists = db.dialect === "postgres"
    ? (await db.executor.query("SELECT to_regclass($1) IS NOT NULL AS ok", [table]))[0]?.ok ===
      true
    : (await db.executor.query(
      "SELECT 1 AS ok FROM sqlite_master WHERE type = 'table' AND name = ?1",
      [table],
    )).length > 0;
  if (!exists) return 0;
  const [row] = await db.executor.query(`SELECT max(version) AS v FROM ${table}`, []);
  return Number(row?.v ?? 0);
}

/** The SQL text of migrations, statement per line, with a header comment per migration. */
export function formatMigrations(migrations: readonly SqlOutboxMigration[]): string {
  return migrations.map((migration) =>
    [
      `-- ${migration.id} (version ${migration.version}, ${migration.checksum})`,
      ...migration.up.map((statement) => `${statement};`),
    ].join("\n")
  ).join("\n\n") + "\n";
}

/**
 * For a database without the tables: the current schema in one piece (what a fresh database
 * needs), rather than every migration from version 1. `outbox-nats migrate` adopts tables made
 * this way at the latest version.
 */
export function formatFreshSchema(
  dialect: SqlDialect,
  tables: ResolvedSqlOutboxTables,
  label: string,
): string {
  const latest = getSqlOutboxMigrations({ dialect, tables }).length;
  const ddl = dialect === "postgres"
    ? createPostgresOutboxSchema(tables)
    : createSqliteOutboxSchema(tables);
  return `-- ${label} has no outbox tables: the current schema (version ${latest}).\n` +
    `-- "outbox-nats migrate" creates the same and records it in ${tables.migrations}; run after\n` +
    `-- these statements, it adopts the tables at version ${latest}.\n\n` +
    ddl.map((statement) => `${statement};`).join("\n") + "\n";
}

async function printPending(db: SqlDatabase, io: CliIo, label: string): Promise<void> {
  const artifacts = getSqlOutboxMigrations({ dialect: db.dialect, tables: db.tables });
  let current = await recordedVersion(db);
  let note = "";
  if (current === 0) {
    // The version migrate() adopts the tables at (indexes included), not just their columns'.
    let shape: number;
    try {
      shape = await detectShape(db.executor, db.dialect, db.tables);
    } catch (error) {
      throw new CliError(`cannot migrate ${label}: ${describeError(error)}`, { cause: error });
    }
    if (shape === 0) {
      io.out(formatFreshSchema(db.dialect, db.tables, label));
      return;
    }
    if (shape > 0) {
      current = shape;
      note =
        `-- ${db.tables.outbox} exists without a migration record: "outbox-nats migrate" adopts it at version ${shape}.\n`;
    }
  }
  const pending = artifacts.slice(current);
  if (pending.length === 0) {
    io.out(`${note}-- nothing to migrate: ${label} is at version ${current} (the latest)\n`);
    return;
  }
  io.out(
    `-- ${pending.length} pending migration(s) for ${label}, version ${current} -> ${artifacts.length}.\n` +
      note +
      `-- "outbox-nats migrate" runs them in one transaction and records them in ${db.tables.migrations}.\n\n` +
      formatMigrations(pending),
  );
}

/** `migrate`. */
export const migrateCommand: Command = {
  name: "migrate",
  summary: "Create or upgrade the SQL tables (or print the pending SQL); create a KV bucket",
  description:
    "SQL stores: applies the pending schema migrations with migrate(): one transaction under a lock,\n" +
    "so concurrent runs are safe; tables created without a record are recognised and adopted.\n" +
    "--print shows the SQL of the pending migrations instead and changes nothing.\n" +
    "NATS KV stores: creates the bucket (history 1, file storage, no expiry) if it is missing.",
  options: {
    print: { type: "boolean", description: "Print the SQL of pending migrations; change nothing" },
    replicas: {
      type: "string",
      value: "<n>",
      default: "1",
      description: "NATS KV: stream replicas of a new bucket (1, 3 or 5)",
    },
  },
  examples: [
    "outbox-nats migrate --store postgres://app@db:5432/app --print > outbox.sql",
    "outbox-nats migrate --store sqlite:./app.db",
    "outbox-nats migrate --store nats-kv://orders_outbox --nats nats://127.0.0.1:4222",
  ],
  async run({ values }, io) {
    const settings = storeSettings(values, "outbox-nats migrate");
    const print = values.print === true;
    const target = settings.target;
    if (target.kind === "nats-kv") {
      const replicas = integerValue(values, "replicas", 1);
      const nc = await connectStoreNats(settings);
      try {
        const jsm = await jetstreamManager(nc);
        const exists = await jsm.streams.info(`KV_${target.bucket}`).then(() => true, (error) => {
          if (/stream not found/i.test(describeError(error))) return false;
          throw error;
        });
        if (exists) {
          io.out(`NATS KV bucket "${target.bucket}" exists: nothing to do\n`);
          return 0;
        }
        if (print) {
          io.out(
            `would create NATS KV bucket "${target.bucket}" (history 1, file storage, no expiry, ${replicas} replica(s))\n`,
          );
          return 0;
        }
        try {
          await createOutboxBucket(new Kvm(nc), target.bucket, { replicas });
        } catch (error) {
          throw new CliError(
            `cannot create NATS KV bucket "${target.bucket}": ${describeError(error)}`,
            { cause: error },
          );
        }
        io.out(`created NATS KV bucket "${target.bucket}" (${replicas} replica(s))\n`);
        return 0;
      } finally {
        await nc.close();
      }
    }
    if (print && target.kind === "sqlite" && !existsSync(target.path)) {
      io.out(
        formatFreshSchema("sqlite", sqlTables(settings), `${target.path} (it does not exist)`),
      );
      return 0;
    }
    const db = await openSqlDatabase(settings, !print);
    try {
      const label = `${target.label} (table ${db.tables.outbox})`;
      if (print) {
        await printPending(db, io, label);
        return 0;
      }
      let result;
      try {
        result = await migrate(db.executor, { dialect: db.dialect, tables: db.tables });
      } catch (error) {
        throw new CliError(`migration of ${label} failed: ${describeError(error)}`, {
          cause: error,
        });
      }
      const adopted = result.adopted ? ` (existing tables adopted at version ${result.from})` : "";
      io.out(
        result.applied.length === 0
          ? `${label} is at version ${result.to} (the latest): nothing to migrate${adopted}\n`
          : `migrated ${label} from version ${result.from} to ${result.to}${adopted}: applied ${
            result.applied.join(", ")
          }\n`,
      );
      return 0;
    } finally {
      await db.close();
    }
  },
};
