/**
 * What ordering keys add to the outbox table (schema version 3), in one place: the columns, the
 * indexes, and the SQL terms the statements repeat so the partial indexes are used.
 *
 * - `ordering_key`: the message's ordering key, `NULL` for messages without one.
 * - `key_head`: whether ordering lets a claim take the row. Always true for rows without a key;
 *   for a key, true on exactly one row, its head: the oldest message not yet settled. Settling
 *   a head as dispatched (or skipping a dead one) hands `key_head` to the next row of the key in
 *   the same statement (or transaction); a `dead` head keeps it, which blocks the key.
 * - `<outbox>_key_head_idx` (`ordering_key` of heads): at most one head per key (Postgres: a
 *   unique index, so two transactions that both see a key without a head cannot both insert
 *   one); finds a key's head.
 * - `<outbox>_key_next_idx` (`ordering_key, seq` of waiting rows): the next row of a key.
 * - `<outbox>_key_held_idx` (`seq` of keyed heads that are `dispatched` or `dead`): blocked keys,
 *   and heads whose hand-over is still to do. Both are few, so the claim can look at them every
 *   time.
 *
 * The claim's pending index (`pendingSql` in schema_v3.ts) has the term `key_head`, so waiting
 * rows are never read by a claim.
 *
 * @module
 */

import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** One column added for ordering keys: its name and its type per dialect. */
export interface OrderingColumn {
  readonly name: string;
  readonly postgres: string;
  readonly sqlite: string;
}

/** Columns ordering keys add to the outbox table (in version 3, after `claim_token`). */
export const orderingColumns: readonly OrderingColumn[] = [
  { name: "ordering_key", postgres: "text", sqlite: "TEXT" },
  {
    name: "key_head",
    postgres: "boolean NOT NULL DEFAULT true",
    sqlite: "INTEGER NOT NULL DEFAULT 1",
  },
];

/** Rows waiting behind their key's head. */
export const waitingSql = "state = 'pending' AND NOT key_head";
/** Keyed heads that are settled: blocked keys (`dead`) and hand-overs still to do. */
export const heldHeadsSql =
  "key_head AND ordering_key IS NOT NULL AND state IN ('dispatched', 'dead')";

/** The ordering-key indexes (part of version 3's, see `schema_v3.ts`). */
export function orderingIndexes(
  dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
  ifNotExists: boolean,
): string[] {
  const exists = ifNotExists ? " IF NOT EXISTS" : "";
  // SQLite has one writer: a key cannot gain two heads there, so its head index need not be
  // unique (the hand-over then updates both rows in one statement, in any order).
  const unique = dialect === "postgres" ? "UNIQUE " : "";
  return [
    `CREATE ${unique}INDEX${exists} ${t.outbox}_key_head_idx ON ${t.outbox} (ordering_key) WHERE key_head AND ordering_key IS NOT NULL`,
    `CREATE INDEX${exists} ${t.outbox}_key_next_idx ON ${t.outbox} (ordering_key, seq) WHERE ${waitingSql}`,
    `CREATE INDEX${exists} ${t.outbox}_key_held_idx ON ${t.outbox} (seq) WHERE ${heldHeadsSql}`,
  ];
}
