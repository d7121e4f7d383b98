/**
 * Table names of the SQL stores and their validation. Names are interpolated into SQL text, so
 * they must be plain identifiers; anything else is rejected before a statement runs.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";

/**
 * The SQL dialects the SQL stores speak.
 *
 * @example
 * ```ts
 * import type { SqlDialect } from "@outbox/nats";
 * const dialect: SqlDialect = "postgres";
 * ```
 */
export type SqlDialect = "postgres" | "sqlite";

/**
 * Names of the tables the SQL stores use.
 *
 * @example
 * ```ts
 * import type { SqlOutboxTables } from "@outbox/nats";
 * const tables: SqlOutboxTables = { outbox: "orders_outbox", inbox: "orders_inbox" };
 * ```
 */
export interface SqlOutboxTables {
  /** The outbox table. */
  outbox: string;
  /** The inbox table. */
  inbox: string;
  /**
   * The table in which `migrate()` records applied migrations.
   *
   * @default {"<outbox>_migrations"}
   */
  migrations?: string;
}

/**
 * Validated table names with every name filled in (as repositories expose them in `tables`).
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { nodeSqliteExecutor, type ResolvedSqlOutboxTables, SqlOutboxRepository } from "@outbox/nats";
 * const outbox = new SqlOutboxRepository(nodeSqliteExecutor(new DatabaseSync(":memory:")), "sqlite");
 * const tables: ResolvedSqlOutboxTables = outbox.tables;
 * console.log(tables.migrations); // "trellis_outbox_migrations"
 * ```
 */
export interface ResolvedSqlOutboxTables {
  /** The outbox table. */
  readonly outbox: string;
  /** The inbox table. */
  readonly inbox: string;
  /** The migrations table. */
  readonly migrations: string;
}

/**
 * The default table names, as in the reference: `trellis_outbox` and `trellis_inbox`.
 *
 * @example
 * ```ts
 * import { defaultSqlOutboxTables } from "@outbox/nats";
 * console.log(defaultSqlOutboxTables.outbox); // "trellis_outbox"
 * ```
 */
export const defaultSqlOutboxTables: Readonly<{ outbox: string; inbox: string }> = Object.freeze({
  outbox: "trellis_outbox",
  inbox: "trellis_inbox",
});

const identifier = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Longest accepted table name. Postgres truncates identifiers to 63 bytes, and the stores derive
 * index and helper names by appending suffixes of up to 15 characters (`_retention_idx`,
 * `_migrations`); two long names sharing a prefix would otherwise collide silently.
 *
 * @example
 * ```ts
 * import { maxSqlTableNameLength } from "@outbox/nats";
 * console.log(maxSqlTableNameLength); // 48
 * ```
 */
export const maxSqlTableNameLength = 48;

/**
 * Validates and completes table names (defaults for missing names). Throws
 * `OutboxValidationError` with field `tables.<name>` for anything but a plain identifier
 * (`^[A-Za-z_][A-Za-z0-9_]*$`, at most 48 characters), and when two names coincide (or one is
 * `<outbox>_keys`, the key fence's table).
 */
export function resolveSqlOutboxTables(tables?: Partial<SqlOutboxTables>): ResolvedSqlOutboxTables {
  if (tables !== undefined && (tables === null || typeof tables !== "object")) {
    throw new OutboxValidationError("tables", "SQL tables must be an object of table names");
  }
  const outbox = checkName("outbox", tables?.outbox ?? defaultSqlOutboxTables.outbox);
  const inbox = checkName("inbox", tables?.inbox ?? defaultSqlOutboxTables.inbox);
  const migrations = checkName("migrations", tables?.migrations ?? `${outbox}_migrations`);
  // `<outbox>_keys` is the key fence's table (schema version 4): another table of that name
  // would make migrate fail half way.
  const names = [outbox, inbox, migrations, `${outbox}_keys`].map((name) => name.toLowerCase());
  if (new Set(names).size !== names.length) {
    throw new OutboxValidationError(
      "tables",
      `SQL table names must differ (case-insensitively), and from ${outbox}_keys (the key fence's table): ${outbox}, ${inbox}, ${migrations}`,
    );
  }
  return Object.freeze({ outbox, inbox, migrations });
}

/** Returns `dialect` if it is a known {@linkcode SqlDialect}, else throws. */
export function checkDialect(dialect: unknown): SqlDialect {
  if (dialect !== "postgres" && dialect !== "sqlite") {
    throw new OutboxValidationError(
      "dialect",
      `Unknown SQL dialect ${JSON.stringify(dialect)}; expected "postgres" or "sqlite"`,
    );
  }
  return dialect;
}

function checkName(kind: string, name: unknown): string {
  if (typeof name !== "string" || !identifier.test(name)) {
    throw new OutboxValidationError(
      `tables.${kind}`,
      `Invalid SQL ${kind} table name ${
        typeof name === "string" ? JSON.stringify(name) : String(name)
      }. Use a simple identifier matching ${identifier.source}.`,
    );
  }
  if (name.length > maxSqlTableNameLength) {
    throw new OutboxValidationError(
      `tables.${kind}`,
      `SQL ${kind} table name "${name}" is longer than ${maxSqlTableNameLength} characters (derived index names must stay within Postgres' 63-byte identifier limit)`,
    );
  }
  return name;
}
