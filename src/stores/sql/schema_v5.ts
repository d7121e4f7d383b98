/**
 * Schema version 5, in one place: the index that lets `prune` retire idle ordering keys. Version
 * 5 keeps every row and adds one partial index, `<outbox>_key_settled_idx`, over the rows of a
 * key that were dispatched and are no longer its head (`ordering_key, updated_at`): whether a key
 * had a message dispatched since a cutoff is then one index probe. `prune` forgets the key fence's
 * row (`<outbox>_keys`, schema_v4.ts) of a key that has no head, no waiting message and no
 * message dispatched since its `dispatchedBefore` (see retire_keys.ts); without the index that
 * question reads every row of the table.
 *
 * Cost: one more index entry per keyed message (written when it stops being its key's head);
 * rows without a key never enter it.
 *
 * @module
 */

import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** The rows the version 5 index holds (SQLite uses it only when a query repeats this). */
export const settledKeyRowsSql =
  "state = 'dispatched' AND ordering_key IS NOT NULL AND NOT key_head";

/** The name of the version 5 index. */
export function keySettledIndex(t: ResolvedSqlOutboxTables): string {
  return `${t.outbox}_key_settled_idx`;
}

/** The version 5 index (idempotent: the fresh schema and `up` both create it). */
export function keySettledIndexSql(_dialect: SqlDialect, t: ResolvedSqlOutboxTables): string {
  return `CREATE INDEX IF NOT EXISTS ${
    keySettledIndex(t)
  } ON ${t.outbox} (ordering_key, updated_at) WHERE ${settledKeyRowsSql}`;
}

/** Version 5 `up`: adds the index. */
export function schemaV5Up(dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [keySettledIndexSql(dialect, t)];
}

/** Version 5 `down`: drops the index (rows are untouched). */
export function schemaV5Down(_dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [`DROP INDEX IF EXISTS ${keySettledIndex(t)}`];
}
