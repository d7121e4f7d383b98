/**
 * Schema errors at the executor boundary: a statement of the SQL stores that fails because a
 * table or column is missing (Postgres 42P01 / 42703, SQLite "no such table" / "no such column")
 * becomes an {@linkcode OutboxSchemaError} naming the table, the version found and the fix. The
 * version is read only after such a failure, so the hot path runs no extra statement.
 *
 * @module
 */

import { OutboxSchemaError } from "../../core/errors.ts";
import type { SqlExecutor, SqlRow } from "./executors.ts";
import { getSqlOutboxMigrations } from "./migrations.ts";
import { outboxColumnsV2 } from "./schema.ts";
import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** What a driver error says is missing, or `undefined` for any other error. */
export function missingSchemaObject(
  error: unknown,
): { kind: "table" | "column"; name?: string; message: string } | undefined {
  if (error === null || typeof error !== "object") return undefined;
  const code = (error as { code?: unknown }).code;
  const message = String((error as { message?: unknown }).message ?? "");
  if (code === "42P01") return { kind: "table", name: quoted(message), message };
  if (code === "42703") return { kind: "column", name: quoted(message), message };
  const table = /no such table: ([\w."]+)/.exec(message);
  if (table) return { kind: "table", name: table[1].replaceAll('"', ""), message };
  const column = /no such column: ([\w."]+)|has no column named (\w+)/.exec(message);
  if (column) return { kind: "column", name: column[1] ?? column[2], message };
  return undefined;
}

function quoted(message: string): string | undefined {
  return /"([^"]+)"/.exec(message)?.[1];
}

/**
 * Wraps `executor` so a missing table or column surfaces as an {@linkcode OutboxSchemaError}
 * about `table` (a table of `tables`). Every other error, and every result, passes unchanged.
 */
export function withSchemaErrors(
  executor: SqlExecutor,
  dialect: SqlDialect,
  tables: ResolvedSqlOutboxTables,
  table: string,
): SqlExecutor {
  const translate = async (error: unknown): Promise<never> => {
    const missing = missingSchemaObject(error);
    if (!missing) throw error;
    const required = getSqlOutboxMigrations({ dialect, tables }).length;
    const named = missing.kind === "table" && missing.name !== undefined &&
        [tables.outbox, tables.inbox].includes(missing.name.split(".").pop()!)
      ? missing.name.split(".").pop()!
      : table;
    let found = await foundVersion(executor, dialect, tables, named);
    // Inside an aborted Postgres transaction nothing can be read; the error still tells a
    // missing table apart.
    if (found === undefined && missing.kind === "table") found = 0;
    throw new OutboxSchemaError(named, found, required, { cause: error, detail: missing.message });
  };
  const wrapped: SqlExecutor = {
    query: (sql, params) => executor.query(sql, params).then(undefined, translate),
  };
  if (typeof executor.transaction === "function") {
    wrapped.transaction = (fn) =>
      executor.transaction!((tx) => fn(withSchemaErrors(tx, dialect, tables, table)));
  }
  return wrapped;
}

/**
 * The schema version of `table`: the newest recorded migration, else the version its columns
 * show (0 when it does not exist), else `undefined` when nothing could be read.
 */
async function foundVersion(
  executor: SqlExecutor,
  dialect: SqlDialect,
  tables: ResolvedSqlOutboxTables,
  table: string,
): Promise<number | undefined> {
  try {
    const [row] = await executor.query(`SELECT max(version) AS v FROM ${tables.migrations}`, []);
    const version = Number(row?.v ?? 0);
    if (Number.isSafeInteger(version) && version > 0) return version;
  } catch {
    // no migrations table: fall back to the table's shape
  }
  try {
    const rows: SqlRow[] = dialect === "postgres"
      ? await executor.query(
        "SELECT a.attname AS name FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
        [table],
      )
      : await executor.query("SELECT name FROM pragma_table_info(?1)", [table]);
    if (rows.length === 0) return 0;
    const columns = new Set(rows.map((row) => String(row.name).toLowerCase()));
    // Tables created by the version 1 DDL have no migration record and no `seq` / `consumer`.
    if (table === tables.outbox) return outboxColumnsV2.every((c) => columns.has(c)) ? 2 : 1;
    return columns.has("consumer") ? 2 : 1;
  } catch {
    return undefined;
  }
}
