/**
 * Schema version 4, in one place: the key fence's table (#18). Version 4 keeps every row and
 * adds one table, `<outbox>_keys`: per ordering key, the JetStream stream sequence at which the
 * key's last message was stored (`stream_seq`), as recorded by the `sequence` of the dispatched
 * mark that settled it. A claim reads it per claimed keyed row through the primary key (the
 * message's `keySequence`), so it costs the same however long ago the key's previous message
 * was dispatched. A `dead` mark of a keyed message deletes its key's
 * row (the key's next publish goes out without a fence). One row per key that had a message
 * dispatched with a sequence; `prune` deletes the rows of keys idle since its cutoff
 * (retire_keys.ts).
 *
 * @module
 */

import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** The key fence's table for an outbox table. */
export function keySequencesTable(t: ResolvedSqlOutboxTables): string {
  return `${t.outbox}_keys`;
}

/** The `CREATE TABLE` of the key fence's table; `ifNotExists` for the idempotent fresh schema. */
export function keySequencesTableSql(
  dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
  ifNotExists: boolean,
): string {
  const exists = ifNotExists ? "IF NOT EXISTS " : "";
  return dialect === "postgres"
    ? `CREATE TABLE ${exists}${
      keySequencesTable(t)
    } (ordering_key text PRIMARY KEY, stream_seq bigint NOT NULL)`
    : `CREATE TABLE ${exists}${
      keySequencesTable(t)
    } (ordering_key TEXT PRIMARY KEY, stream_seq INTEGER NOT NULL)`;
}

/** Version 4 `up`: adds the key fence's table. */
export function schemaV4Up(dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [keySequencesTableSql(dialect, t, false)];
}

/**
 * Version 4 `down`: drops the key fence's table (only what `up` created; a fence switched on
 * again after an upgrade starts each key unfenced).
 */
export function schemaV4Down(_dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [`DROP TABLE IF EXISTS ${keySequencesTable(t)}`];
}
