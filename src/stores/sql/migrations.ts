/**
 * Versioned schema artifacts and `migrate()`, which applies them for services without migration
 * tooling of their own.
 *
 * Version 1 is the reference's DDL, byte for byte (same id, statements and checksum). Version 2
 * upgrades a version 1 database in place, keeping every row: a FIFO tie-breaker `seq`
 * (backfilled in `created_at, id` order), a partial index over the rows still to dispatch (so
 * claims cost the same however much history is kept), a partial index for retention, and the
 * inbox consumer scope (primary key `(consumer, message_id)`). The `dead` state needs no DDL
 * (there is no state constraint); version 2's indexes leave dead rows out of claims. Version 3
 * (`schema_v3.ts`) adds the claim token, ordering keys and the indexes of the flat-cost claim, in
 * place. Version 4 (`schema_v4.ts`) adds the key fence's table (`<outbox>_keys`). Version 5
 * (`schema_v5.ts`) adds the index `prune` retires idle ordering keys with. Version 6
 * (`schema_v6.ts`) drops version 2's claim index, which nothing reads since version 3.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";
import type { SqlExecutor, SqlRow } from "./executors.ts";
import {
  claimIndex,
  inboxColumnsV1,
  inboxColumnsV2,
  inboxColumnsV3,
  indexesV2,
  outboxColumnsV1,
  outboxColumnsV2,
  outboxColumnsV3,
  schemaV1,
  schemaV1Down,
  schemaV2Fresh,
  schemaV3Fresh,
  schemaV4Fresh,
  schemaV5Fresh,
  sqliteInboxTable,
  sqliteOutboxTable,
} from "./schema.ts";
import { createPostgresOutboxSchema, createSqliteOutboxSchema } from "./schema.ts";
import { schemaV3Down, schemaV3Up } from "./schema_v3.ts";
import { keySequencesTable, schemaV4Down, schemaV4Up } from "./schema_v4.ts";
import { keySettledIndex, schemaV5Down, schemaV5Up } from "./schema_v5.ts";
import { schemaV6Down, schemaV6Up } from "./schema_v6.ts";
import {
  checkDialect,
  type ResolvedSqlOutboxTables,
  resolveSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxTables,
} from "./tables.ts";

/**
 * One versioned schema change: apply `up` in order to upgrade, `down` in order to revert.
 *
 * @example
 * ```ts
 * import { getSqlOutboxMigrations, type SqlOutboxMigration } from "@outbox/nats";
 * const [v1]: readonly SqlOutboxMigration[] = getSqlOutboxMigrations({ dialect: "sqlite" });
 * console.log(v1.id, v1.checksum);
 * ```
 */
export interface SqlOutboxMigration {
  /** Stable id, `trellis_sql_outbox_inbox_<dialect>_v<version>`. */
  readonly id: string;
  /** 1, 2, ... */
  readonly version: number;
  /** The dialect the statements are written for. */
  readonly dialect: SqlDialect;
  /** Statements that upgrade from `version - 1`. */
  readonly up: readonly string[];
  /** Statements that revert to `version - 1`; they never destroy data `up` did not create. */
  readonly down: readonly string[];
  /** `fnv1a64:<hex>` over `-- up`, the up statements, `-- down`, the down statements. */
  readonly checksum: string;
}

/**
 * Options for {@linkcode getSqlOutboxMigrations}.
 *
 * @example
 * ```ts
 * import type { SqlOutboxMigrationOptions } from "@outbox/nats";
 * const options: SqlOutboxMigrationOptions = { dialect: "postgres", tables: { outbox: "o", inbox: "i" } };
 * ```
 */
export interface SqlOutboxMigrationOptions {
  /** The database dialect. */
  dialect: SqlDialect;
  /**
   * Table names.
   *
   * @default {defaultSqlOutboxTables}
   */
  tables?: Partial<SqlOutboxTables>;
}

/**
 * The schema artifacts for a dialect and table names, oldest first, for your own migration
 * tooling (or use {@linkcode migrate}). Version 1 is identical to the reference's.
 *
 * @example
 * ```ts
 * import { getSqlOutboxMigrations } from "@outbox/nats";
 * for (const migration of getSqlOutboxMigrations({ dialect: "postgres" })) {
 *   console.log(migration.id, migration.up.length, migration.checksum);
 * }
 * ```
 */
export function getSqlOutboxMigrations(
  options: SqlOutboxMigrationOptions,
): readonly SqlOutboxMigration[] {
  const dialect = checkDialect(options?.dialect);
  const t = resolveSqlOutboxTables(options.tables);
  return Object.freeze([
    artifact(dialect, 1, schemaV1(dialect, t), schemaV1Down(t)),
    artifact(
      dialect,
      2,
      dialect === "postgres" ? postgresV2Up(t) : sqliteV2Up(t),
      dialect === "postgres" ? postgresV2Down(t) : sqliteV2Down(t),
    ),
    artifact(dialect, 3, schemaV3Up(dialect, t), schemaV3Down(dialect, t)),
    artifact(dialect, 4, schemaV4Up(dialect, t), schemaV4Down(dialect, t)),
    artifact(dialect, 5, schemaV5Up(dialect, t), schemaV5Down(dialect, t)),
    artifact(dialect, 6, schemaV6Up(dialect, t), schemaV6Down(dialect, t)),
  ]);
}

function artifact(
  dialect: SqlDialect,
  version: number,
  up: string[],
  down: string[],
): SqlOutboxMigration {
  return Object.freeze({
    id: `trellis_sql_outbox_inbox_${dialect}_v${version}`,
    version,
    dialect,
    up: Object.freeze(up),
    down: Object.freeze(down),
    checksum: migrationChecksum(up, down),
  });
}

/**
 * The checksum of an artifact: FNV-1a 64 over `-- up`, up..., `-- down`, down... joined by
 * newlines, as `fnv1a64:<16 hex digits>` (the reference's format).
 */
export function migrationChecksum(up: readonly string[], down: readonly string[]): string {
  return `fnv1a64:${fnv1a64(["-- up", ...up, "-- down", ...down].join("\n"))}`;
}

function fnv1a64(text: string): string {
  let hash = 0xcbf29ce484222325n;
  for (const character of text) {
    hash ^= BigInt(character.codePointAt(0)!);
    hash = BigInt.asUintN(64, hash * 0x100000001b3n);
  }
  return hash.toString(16).padStart(16, "0");
}

// --- version 2 ---------------------------------------------------------------------------------

const v1OutboxColumnList = outboxColumnsV1.join(", ");

function postgresV2Up(t: ResolvedSqlOutboxTables): string[] {
  return [
    `ALTER TABLE ${t.outbox} ADD COLUMN seq bigint`,
    `UPDATE ${t.outbox} AS t SET seq = o.n FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM ${t.outbox}) AS o WHERE t.id = o.id`,
    `ALTER TABLE ${t.outbox} ALTER COLUMN seq SET NOT NULL`,
    `ALTER TABLE ${t.outbox} ALTER COLUMN seq ADD GENERATED BY DEFAULT AS IDENTITY`,
    `SELECT setval(pg_get_serial_sequence('${t.outbox}', 'seq'), coalesce((SELECT max(seq) FROM ${t.outbox}), 0) + 1, false)`,
    `DROP INDEX IF EXISTS ${t.outbox}_due_idx`,
    `ALTER TABLE ${t.inbox} ADD COLUMN consumer text NOT NULL DEFAULT ''`,
    `ALTER TABLE ${t.inbox} DROP CONSTRAINT ${t.inbox}_pkey`,
    `ALTER TABLE ${t.inbox} ADD CONSTRAINT ${t.inbox}_pkey PRIMARY KEY (consumer, message_id)`,
    ...indexesV2("postgres", t, false),
  ];
}

function postgresV2Down(t: ResolvedSqlOutboxTables): string[] {
  return [
    // Ids recorded under a consumer scope cannot be represented in version 1: refuse (the
    // CHECK fails on such rows) rather than delete them.
    `ALTER TABLE ${t.inbox} ADD CONSTRAINT ${t.inbox}_consumer_scoped_rows_block_downgrade CHECK (consumer = '')`,
    `DROP INDEX IF EXISTS ${t.inbox}_received_idx`,
    `ALTER TABLE ${t.inbox} DROP CONSTRAINT ${t.inbox}_pkey`,
    `ALTER TABLE ${t.inbox} ADD CONSTRAINT ${t.inbox}_pkey PRIMARY KEY (message_id)`,
    `ALTER TABLE ${t.inbox} DROP COLUMN consumer`,
    // Version 1 has no dead state: its dead rows become failed and due, as version 1 retried
    // every failure; their last_error is kept.
    `UPDATE ${t.outbox} SET state = 'failed', next_attempt_at = updated_at WHERE state = 'dead'`,
    `DROP INDEX IF EXISTS ${t.outbox}_retention_idx`,
    `DROP INDEX IF EXISTS ${t.outbox}_claim_idx`,
    `ALTER TABLE ${t.outbox} DROP COLUMN seq`,
    `CREATE INDEX IF NOT EXISTS ${t.outbox}_due_idx ON ${t.outbox} (state, next_attempt_at)`,
  ];
}

function sqliteV2Up(t: ResolvedSqlOutboxTables): string[] {
  // SQLite cannot add a rowid alias or change a primary key in place: rebuild both tables,
  // copying every row (outbox rows numbered in created_at, id order).
  return [
    sqliteOutboxTable(`${t.outbox}_v2`, false),
    `INSERT INTO ${t.outbox}_v2 (${v1OutboxColumnList}) SELECT ${v1OutboxColumnList} FROM ${t.outbox} ORDER BY created_at, id`,
    `DROP TABLE ${t.outbox}`,
    `ALTER TABLE ${t.outbox}_v2 RENAME TO ${t.outbox}`,
    sqliteInboxTable(`${t.inbox}_v2`, false),
    `INSERT INTO ${t.inbox}_v2 (message_id, received_at) SELECT message_id, received_at FROM ${t.inbox}`,
    `DROP TABLE ${t.inbox}`,
    `ALTER TABLE ${t.inbox}_v2 RENAME TO ${t.inbox}`,
    ...indexesV2("sqlite", t, false),
  ];
}

function sqliteV2Down(t: ResolvedSqlOutboxTables): string[] {
  const [outboxV1, , inboxV1] = schemaV1("sqlite", {
    ...t,
    outbox: `${t.outbox}_v1`,
    inbox: `${t.inbox}_v1`,
  });
  const copiedColumns = outboxColumnsV1.map((column) =>
    column === "state"
      ? "CASE state WHEN 'dead' THEN 'failed' ELSE state END"
      : column === "next_attempt_at"
      ? "CASE state WHEN 'dead' THEN updated_at ELSE next_attempt_at END"
      : column
  ).join(", ");
  return [
    // Refuse (the CHECK fails) rather than drop ids recorded under a consumer scope.
    `CREATE TABLE ${t.inbox}_downgrade_guard (consumer TEXT NOT NULL CONSTRAINT consumer_scoped_inbox_rows_block_downgrade CHECK (consumer = ''))`,
    `INSERT INTO ${t.inbox}_downgrade_guard (consumer) SELECT consumer FROM ${t.inbox} WHERE consumer <> '' LIMIT 1`,
    `DROP TABLE ${t.inbox}_downgrade_guard`,
    inboxV1,
    `INSERT INTO ${t.inbox}_v1 (message_id, received_at) SELECT message_id, received_at FROM ${t.inbox}`,
    `DROP TABLE ${t.inbox}`,
    `ALTER TABLE ${t.inbox}_v1 RENAME TO ${t.inbox}`,
    // Dead rows become failed and due (version 1 retried every failure); last_error is kept.
    outboxV1,
    `INSERT INTO ${t.outbox}_v1 (${v1OutboxColumnList}) SELECT ${copiedColumns} FROM ${t.outbox} ORDER BY seq`,
    `DROP TABLE ${t.outbox}`,
    `ALTER TABLE ${t.outbox}_v1 RENAME TO ${t.outbox}`,
    `CREATE INDEX IF NOT EXISTS ${t.outbox}_due_idx ON ${t.outbox} (state, next_attempt_at)`,
  ];
}

// --- migrate -----------------------------------------------------------------------------------

/**
 * `migrate()` refused to touch the database: an applied artifact changed, the database is newer
 * than this library, its tables have a shape no version produces, or the executor cannot open a
 * transaction. Nothing was changed.
 *
 * @example
 * ```ts
 * import { OutboxMigrationError } from "@outbox/nats";
 * const error = new OutboxMigrationError("changed", "checksum differs");
 * console.log(error.code);
 * ```
 */
export class OutboxMigrationError extends Error {
  /** Why: `changed`, `newer`, `unrecognised` or `no_transaction`. */
  readonly code: "changed" | "newer" | "unrecognised" | "no_transaction";
  /** Creates the error. */
  constructor(
    code: "changed" | "newer" | "unrecognised" | "no_transaction",
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "OutboxMigrationError";
    this.code = code;
  }
}

/**
 * Options for {@linkcode migrate}.
 *
 * @example
 * ```ts
 * import type { MigrateOptions } from "@outbox/nats";
 * const options: MigrateOptions = { dialect: "sqlite", tables: { outbox: "o", inbox: "i" } };
 * ```
 */
export interface MigrateOptions extends SqlOutboxMigrationOptions {
  /**
   * Target version: lower than the current one reverts (runs `down` artifacts).
   *
   * @default {the latest version}
   */
  to?: number;
}

/**
 * What {@linkcode migrate} did.
 *
 * @example
 * ```ts
 * import type { MigrateResult } from "@outbox/nats";
 * const result: MigrateResult = { from: 1, to: 2, applied: ["trellis_sql_outbox_inbox_sqlite_v2"], reverted: [], adopted: true };
 * ```
 */
export interface MigrateResult {
  /** The version before. */
  from: number;
  /** The version after. */
  to: number;
  /** Ids of the artifacts applied (`up`), in order. */
  applied: string[];
  /** Ids of the artifacts reverted (`down`), in order. */
  reverted: string[];
  /**
   * Whether the tables existed without a migration record (created by the reference's DDL or
   * by `createSqliteOutboxSchema` / `createPostgresOutboxSchema`) and were adopted at the
   * version their shape shows.
   */
  adopted: boolean;
}

/**
 * Brings the outbox and inbox tables to the latest version (or to `options.to`), in one
 * transaction under a lock (Postgres: a transaction-scoped advisory lock; SQLite:
 * `BEGIN IMMEDIATE`), so concurrent starts are safe. Applied artifacts are recorded with their
 * checksums in the migrations table (`<outbox>_migrations`); an applied artifact whose checksum
 * changed is an error. Tables that exist without a record (a database created by the
 * reference's version 1 DDL, or by the current schema DDL) are recognised by their columns and
 * adopted at that version. The executor needs `transaction` (every bundled adapter has it).
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { migrate, nodeSqliteExecutor } from "@outbox/nats";
 * const result = await migrate(nodeSqliteExecutor(new DatabaseSync(":memory:")), { dialect: "sqlite" });
 * console.log(result.from, "->", result.to); // 0 -> 6
 * ```
 */
export async function migrate(
  executor: SqlExecutor,
  options: MigrateOptions,
): Promise<MigrateResult> {
  const dialect = checkDialect(options?.dialect);
  const tables = resolveSqlOutboxTables(options.tables);
  const artifacts = getSqlOutboxMigrations({ dialect, tables });
  const latest = artifacts.length;
  const target = options.to ?? latest;
  if (!Number.isSafeInteger(target) || target < 0 || target > latest) {
    throw new OutboxValidationError("to", `Migration target must be an integer in 0..${latest}`);
  }
  if (typeof executor?.transaction !== "function") {
    throw new OutboxMigrationError(
      "no_transaction",
      "migrate() needs an executor with transaction(); use postgresJsExecutor, pgExecutor, nodeSqliteExecutor or betterSqlite3Executor, or add transaction() to yours",
    );
  }
  return await executor.transaction((tx) => migrateLocked(tx, dialect, tables, artifacts, target));
}

async function migrateLocked(
  tx: SqlExecutor,
  dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
  artifacts: readonly SqlOutboxMigration[],
  target: number,
): Promise<MigrateResult> {
  const now = new Date().toISOString();
  if (dialect === "postgres") {
    await tx.query("SELECT pg_advisory_xact_lock($1::bigint)", [lockKey(t)]);
    await tx.query(
      `CREATE TABLE IF NOT EXISTS ${t.migrations} (version integer PRIMARY KEY, id text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL)`,
      [],
    );
  } else {
    await tx.query(
      `CREATE TABLE IF NOT EXISTS ${t.migrations} (version INTEGER PRIMARY KEY, id TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TEXT NOT NULL)`,
      [],
    );
  }
  const param = (n: number) => dialect === "postgres" ? `$${n}` : `?${n}`;
  const record = async (migration: SqlOutboxMigration) => {
    await tx.query(
      `INSERT INTO ${t.migrations} (version, id, checksum, applied_at) VALUES (${param(1)}, ${
        param(2)
      }, ${param(3)}, ${dialect === "postgres" ? "$4::timestamptz" : "?4"})`,
      [migration.version, migration.id, migration.checksum, now],
    );
  };

  const rows = await tx.query(
    `SELECT version, id, checksum FROM ${t.migrations} ORDER BY version`,
    [],
  );
  let current = 0;
  for (const row of rows) {
    const version = Number(row.version);
    const known = artifacts[version - 1];
    if (!known) {
      throw new OutboxMigrationError(
        "newer",
        `${t.migrations} records version ${version} (${row.id}); this library knows versions up to ${artifacts.length}. Upgrade the library.`,
      );
    }
    if (known.id !== row.id || known.checksum !== row.checksum) {
      throw new OutboxMigrationError(
        "changed",
        `Applied migration ${row.id} (version ${version}) has checksum ${row.checksum}, but this library's artifact ${known.id} has ${known.checksum}: the artifact changed since it was applied (different table names or an edited artifact)`,
      );
    }
    current = version;
  }
  if (rows.length !== current) {
    throw new OutboxMigrationError(
      "unrecognised",
      `${t.migrations} has gaps in its versions; expected 1..${rows.length}`,
    );
  }

  let adopted = false;
  if (current === 0) {
    const shape = await detectShape(tx, dialect, t);
    if (shape > 0) {
      adopted = true;
      // Complete what an interrupted or partial setup may have left out (both are idempotent).
      const ddl = shape === 1
        ? schemaV1(dialect, t)
        : shape === 2
        ? schemaV2Fresh(dialect, t)
        : shape === 3
        ? schemaV3Fresh(dialect, t)
        : shape === 4
        ? schemaV4Fresh(dialect, t)
        : shape === 5
        ? schemaV5Fresh(dialect, t)
        : dialect === "postgres"
        ? createPostgresOutboxSchema(t)
        : createSqliteOutboxSchema(t);
      for (const statement of ddl) await tx.query(statement, []);
      for (const migration of artifacts.slice(0, shape)) await record(migration);
      current = shape;
    }
  }

  const from = current;
  const applied: string[] = [];
  const reverted: string[] = [];
  while (current < target) {
    const migration = artifacts[current];
    for (const statement of migration.up) await tx.query(statement, []);
    await record(migration);
    applied.push(migration.id);
    current += 1;
  }
  while (current > target) {
    const migration = artifacts[current - 1];
    for (const statement of migration.down) await tx.query(statement, []);
    await tx.query(`DELETE FROM ${t.migrations} WHERE version = ${param(1)}`, [migration.version]);
    reverted.push(migration.id);
    current -= 1;
  }
  return { from, to: current, applied, reverted, adopted };
}

/**
 * The version `migrate()` adopts tables without a migration record at: 0 when neither table
 * exists; throws `OutboxMigrationError` (`unrecognised`) for tables of no known shape. Read-only
 * (`outbox-nats migrate --print` asks it too, so what it prints is what `migrate()` runs).
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { nodeSqliteExecutor } from "@outbox/nats";
 * import { detectShape } from "./migrations.ts";
 * import { resolveSqlOutboxTables } from "./tables.ts";
 * const executor = nodeSqliteExecutor(new DatabaseSync(":memory:"));
 * console.log(await detectShape(executor, "sqlite", resolveSqlOutboxTables())); // 0
 * ```
 */
export async function detectShape(
  tx: SqlExecutor,
  dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
): Promise<number> {
  const columnsOf = async (table: string): Promise<string[]> => {
    const rows: SqlRow[] = dialect === "postgres"
      ? await tx.query(
        "SELECT a.attname AS name FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [table],
      )
      : await tx.query("SELECT name FROM pragma_table_info(?1) ORDER BY cid", [table]);
    return rows.map((row) => String(row.name).toLowerCase());
  };
  const outbox = await columnsOf(t.outbox);
  const inbox = await columnsOf(t.inbox);
  if (outbox.length === 0 && inbox.length === 0) return 0;
  const same = (actual: string[], expected: readonly string[]) =>
    actual.length === 0 ||
    (actual.length === expected.length && expected.every((column) => actual.includes(column)));
  if (same(outbox, outboxColumnsV1) && same(inbox, inboxColumnsV1)) return 1;
  if (same(outbox, outboxColumnsV2) && same(inbox, inboxColumnsV2)) return 2;
  if (same(outbox, outboxColumnsV3) && same(inbox, inboxColumnsV3)) {
    if ((await columnsOf(keySequencesTable(t))).length === 0) return 3;
    const hasIndex = async (name: string): Promise<boolean> => {
      const index = dialect === "postgres"
        ? await tx.query("SELECT to_regclass($1) IS NOT NULL AS found", [name])
        : await tx.query(
          "SELECT 1 AS found FROM sqlite_master WHERE type = 'index' AND name = ?1",
          [name],
        );
      const found = index[0]?.found;
      return found === true || found === 1 || found === 1n;
    };
    // Version 5 adds an index only; version 6 drops one (the claim index of version 2).
    if (!await hasIndex(keySettledIndex(t))) return 4;
    return await hasIndex(claimIndex(t)) ? 5 : 6;
  }
  throw new OutboxMigrationError(
    "unrecognised",
    `Tables ${t.outbox} (${outbox.join(", ") || "missing"}) and ${t.inbox} (${
      inbox.join(", ") || "missing"
    }) exist without a migration record and match no known version; refusing to change them`,
  );
}

/** A 64-bit advisory lock key per table set, so different outboxes migrate independently. */
function lockKey(t: ResolvedSqlOutboxTables): string {
  const hex = fnv1a64(`@outbox/nats migrate ${t.outbox.toLowerCase()}`);
  return BigInt.asIntN(64, BigInt(`0x${hex}`)).toString();
}
