/**
 * Schema version 3, in one place: what it adds to the outbox table (columns and indexes), the
 * in-place `up` and `down` statements, and how the fresh schema includes it. Version 3 keeps
 * every row; it adds:
 *
 * - `claim_token`: the fencing token a claim writes and every mark compares (see `OutboxClaim`),
 *   so the fence never depends on how a driver decodes a timestamp.
 * - `<outbox>_pending_idx` (`seq` of pending rows) and `<outbox>_retry_idx` (`next_attempt_at` of
 *   claimed and failed rows): the claim reads the oldest pending rows and the earliest due
 *   retries through them, so its cost does not grow with a backlog of failed rows waiting for
 *   their retry time.
 *
 * To extend version 3 before it ships, add to {@linkcode outboxColumnsAddedInV3} and
 * {@linkcode indexesV3}; `up`, `down`, the fresh schema and `migrate()`'s shape detection
 * follow from them.
 *
 * @module
 */

import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** One column added by version 3: its name and its type per dialect (all nullable). */
export interface AddedColumn {
  readonly name: string;
  readonly postgres: string;
  readonly sqlite: string;
}

/** Columns version 3 adds to the outbox table, appended in this order. */
export const outboxColumnsAddedInV3: readonly AddedColumn[] = [
  { name: "claim_token", postgres: "text", sqlite: "TEXT" },
];

/** The version 3 indexes; `ifNotExists` for the idempotent fresh schema. */
export function indexesV3(
  _dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
  ifNotExists: boolean,
): string[] {
  const create = ifNotExists ? "CREATE INDEX IF NOT EXISTS" : "CREATE INDEX";
  // The claim statement repeats these WHERE terms literally (SQLite needs that to use a
  // partial index): see `pendingSql` and `retrySql`.
  return [
    `${create} ${t.outbox}_pending_idx ON ${t.outbox} (seq) WHERE ${pendingSql}`,
    `${create} ${t.outbox}_retry_idx ON ${t.outbox} (next_attempt_at) WHERE ${retrySql}`,
  ];
}

/** Rows never attempted (or requeued): the claim takes them in enqueue order. */
export const pendingSql = "state = 'pending'";
/** Rows with a due time (lease expiry or retry time): the claim takes them when it has passed. */
export const retrySql = "state IN ('claimed', 'failed')";

/** Version 3 `up`: in place, every row kept. */
export function schemaV3Up(dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [
    ...outboxColumnsAddedInV3.map((column) =>
      `ALTER TABLE ${t.outbox} ADD COLUMN ${column.name} ${column[dialect]}`
    ),
    ...indexesV3(dialect, t, false),
  ];
}

/** Version 3 `down`: drops what `up` added (claims then fall back to the version 2 fence). */
export function schemaV3Down(_dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [
    `DROP INDEX IF EXISTS ${t.outbox}_retry_idx`,
    `DROP INDEX IF EXISTS ${t.outbox}_pending_idx`,
    ...[...outboxColumnsAddedInV3].reverse().map((column) =>
      `ALTER TABLE ${t.outbox} DROP COLUMN ${column.name}`
    ),
  ];
}

/** A version 2 `CREATE TABLE` text of the outbox with the version 3 columns appended. */
export function withV3Columns(createTable: string, dialect: SqlDialect): string {
  const added = outboxColumnsAddedInV3.map((column) => `, ${column.name} ${column[dialect]}`);
  return `${createTable.slice(0, -1)}${added.join("")})`;
}
