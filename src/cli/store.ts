/**
 * Opening the store a store URL names, with the checks that turn a missing database, table or
 * bucket into one clear error before any command runs.
 *
 * @module
 */

import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import postgres from "postgres";
import {
  checkPostgresServer,
  createOutboxBucket,
  listenForOutboxWakeups,
  NatsKvOutboxRepository,
  type OutboxAdmin,
  type OutboxRepository,
  postgresJsExecutor,
  type ResolvedSqlOutboxTables,
  type SqlDialect,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../../mod.ts";
import { CliError, CliUsageError, describeError } from "./errors.ts";
import { redactNatsUrl } from "./format.ts";
import { connectNats } from "./nats.ts";
import type { NatsSecurity } from "./nats_auth.ts";
import { openSqlite } from "./sqlite.ts";
import type { StoreTarget } from "./store_url.ts";
import { resolveSqlOutboxTables } from "../stores/sql/tables.ts";

/** Names and connection settings from the command line. */
export interface StoreSettings {
  /** The parsed store URL. */
  target: StoreTarget;
  /** `--outbox-table`, `--inbox-table`, `--migrations-table`. */
  tables: { outbox?: string; inbox?: string; migrations?: string };
  /** `--nats`: required for `nats-kv://`. */
  natsUrl?: string;
  /** Credentials and TLS for `natsUrl` (`--nats-creds`, `--nats-tls-ca`, ...). */
  natsSecurity?: NatsSecurity;
  /** Who connects (shown to the database / NATS server). */
  client: string;
  /** Connections for Postgres. @default {1} */
  poolSize?: number;
  /** Keep reconnecting to NATS forever (the relay). @default {false} */
  reconnectForever?: boolean;
}

/** An open SQL database (before any table check). */
export interface SqlDatabase {
  /** The dialect. */
  dialect: SqlDialect;
  /** The executor. */
  executor: SqlExecutor;
  /** Validated table names. */
  tables: ResolvedSqlOutboxTables;
  /** postgres.js handle (Postgres only), for LISTEN. */
  postgres?: postgres.Sql;
  /** Closes the connections. */
  close(): Promise<void>;
}

/** An open outbox store. */
export interface OpenedStore {
  /** What kind of store. */
  kind: StoreTarget["kind"];
  /** The store, password hidden, and its table or bucket. */
  label: string;
  /** The outbox. */
  outbox: OutboxRepository & OutboxAdmin;
  /** The NATS connection of a `nats-kv` store (the relay publishes on it too). */
  nats?: NatsConnection;
  /**
   * Subscribes to the store's cross-process wake-ups (Postgres LISTEN, NATS KV watch);
   * `undefined` for stores without one (SQLite).
   */
  wakeups?: (onWake: () => void, channel?: string) => Promise<() => Promise<void>>;
  /** Closes everything the store opened. */
  close(): Promise<void>;
}

/** Table names from the options, validated (a bad name is a usage error). */
export function sqlTables(settings: StoreSettings): ResolvedSqlOutboxTables {
  try {
    return resolveSqlOutboxTables(settings.tables);
  } catch (error) {
    throw new CliUsageError(describeError(error), { cause: error });
  }
}

/**
 * Opens a Postgres or SQLite database and checks that it answers. `create` lets a SQLite file
 * be created (migrate).
 */
export async function openSqlDatabase(
  settings: StoreSettings,
  create: boolean,
): Promise<SqlDatabase> {
  const target = settings.target;
  const tables = sqlTables(settings);
  if (target.kind === "sqlite") {
    const db = openSqlite(target.path, create, migrateHint(settings));
    return {
      dialect: "sqlite",
      executor: db.executor,
      tables,
      close: () => Promise.resolve(db.close()),
    };
  }
  if (target.kind !== "postgres") throw new Error(`not a SQL store: ${target.kind}`);
  try {
    // postgres.js waits forever on a server that answers in another protocol (NATS's 4222).
    await checkPostgresServer(target.url, { timeoutMs: 10_000 });
  } catch (error) {
    throw new CliError(`cannot connect to Postgres at ${target.label}: ${describeError(error)}`, {
      cause: error,
    });
  }
  const sql = postgres(target.url, {
    max: settings.poolSize ?? 1,
    connect_timeout: 10,
    onnotice: () => {},
    connection: { application_name: settings.client },
  });
  const close = async () => {
    await sql.end({ timeout: 5 });
  };
  try {
    await sql.unsafe("SELECT 1");
  } catch (error) {
    await close().catch(() => {});
    throw new CliError(`cannot connect to Postgres at ${target.label}: ${describeError(error)}`, {
      cause: error,
    });
  }
  return { dialect: "postgres", executor: postgresJsExecutor(sql), tables, postgres: sql, close };
}

/**
 * The schema version the outbox table has: 0 when it does not exist, 1 without the `seq`
 * column (the reference's DDL), 2 with it, 3 with `claim_token` too.
 */
export async function outboxSchemaVersion(db: SqlDatabase): Promise<number> {
  const table = db.tables.outbox;
  const rows = db.dialect === "postgres"
    ? await db.executor.query(
      "SELECT a.attname AS name FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
      [table],
    )
    : await db.executor.query("SELECT name FROM pragma_table_info(?1)", [table]);
  if (rows.length === 0) return 0;
  const has = (column: string) => rows.some((row) => String(row.name).toLowerCase() === column);
  return has("claim_token") ? 3 : has("seq") ? 2 : 1;
}

/**
 * The `outbox-nats migrate` command line that creates or upgrades this store, repeating the
 * options that name it (tables, `--nats`), so the hint can be run as shown.
 */
export function migrateHint(settings: StoreSettings): string {
  const parts = ["outbox-nats migrate", "--store", settings.target.label];
  const { outbox, inbox, migrations } = settings.tables;
  if (settings.target.kind !== "nats-kv") {
    if (outbox) parts.push("--outbox-table", outbox);
    if (inbox) parts.push("--inbox-table", inbox);
    if (migrations) parts.push("--migrations-table", migrations);
  } else {
    parts.push("--nats", settings.natsUrl ? redactNatsUrl(settings.natsUrl) : "<url>");
  }
  return `"${parts.join(" ")}"`;
}

/** Opens the store for a command that reads or changes messages (everything but migrate). */
export async function openStore(settings: StoreSettings): Promise<OpenedStore> {
  const target = settings.target;
  if (target.kind === "nats-kv") return await openKvStore(settings, target.bucket);
  const db = await openSqlDatabase(settings, false);
  try {
    const version = await outboxSchemaVersion(db);
    const where = `${target.label}`;
    if (version === 0) {
      throw new CliError(
        `outbox table "${db.tables.outbox}" does not exist in ${where}; create it with ${
          migrateHint(settings)
        }`,
      );
    }
    if (version < 3) {
      throw new CliError(
        `outbox table "${db.tables.outbox}" in ${where} has schema version ${version}; upgrade it with ${
          migrateHint(settings)
        }`,
      );
    }
  } catch (error) {
    await db.close().catch(() => {});
    if (error instanceof CliError) throw error;
    throw new CliError(`cannot read the schema of ${target.label}: ${describeError(error)}`, {
      cause: error,
    });
  }
  const outbox = new SqlOutboxRepository(db.executor, db.dialect, db.tables);
  const sql = db.postgres;
  return {
    kind: target.kind,
    label: `${target.label} (table ${db.tables.outbox})`,
    outbox,
    wakeups: sql
      ? async (onWake, channel) => {
        const subscription = await listenForOutboxWakeups(sql, {
          tables: db.tables,
          channel,
          onWake: () => onWake(),
        });
        return () => subscription.close();
      }
      : undefined,
    close: () => db.close(),
  };
}

/** Connects to NATS for a `nats-kv://` store (`--nats` is required). */
export async function connectStoreNats(settings: StoreSettings): Promise<NatsConnection> {
  if (!settings.natsUrl) {
    throw new CliUsageError(
      `${settings.target.label} needs --nats <url> (or OUTBOX_NATS_URL): the NATS server holding the bucket`,
    );
  }
  return await connectNats(settings.natsUrl, {
    name: settings.client,
    reconnectForever: settings.reconnectForever,
    security: settings.natsSecurity,
  });
}

async function openKvStore(settings: StoreSettings, bucket: string): Promise<OpenedStore> {
  const nc = await connectStoreNats(settings);
  let outbox: NatsKvOutboxRepository;
  try {
    await requireBucket(nc, bucket, migrateHint(settings));
    outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), bucket));
  } catch (error) {
    await nc.close().catch(() => {});
    if (error instanceof CliError) throw error;
    throw new CliError(`cannot open NATS KV bucket "${bucket}": ${describeError(error)}`, {
      cause: error,
    });
  }
  return {
    kind: "nats-kv",
    label: `nats-kv://${bucket}`,
    outbox,
    nats: nc,
    wakeups: async (onWake) => {
      return await outbox.watch((work) => {
        if (work.dueAt === undefined) onWake();
      });
    },
    async close() {
      try {
        await outbox.close();
      } finally {
        await nc.close();
      }
    },
  };
}

/** Rejects with a clear error when the bucket's stream does not exist. */
export async function requireBucket(
  nc: NatsConnection,
  bucket: string,
  hint = `"outbox-nats migrate --store nats-kv://${bucket} --nats <url>"`,
): Promise<void> {
  const jsm = await jetstreamManager(nc);
  try {
    await jsm.streams.info(`KV_${bucket}`);
  } catch (error) {
    if (/stream not found/i.test(describeError(error))) {
      throw new CliError(
        `NATS KV bucket "${bucket}" does not exist; create it with ${hint}`,
      );
    }
    throw error;
  }
}
