/**
 * Schema version 6, in one place: it drops version 2's claim index, `<outbox>_claim_idx`
 * (`seq` of the rows in `state IN ('pending', 'claimed', 'failed')`; SQLite also carries
 * `next_attempt_at, state`). Since version 3 the claim reads `<outbox>_pending_idx` and
 * `<outbox>_retry_idx` instead, and `stats` counts the active rows through the version 3 partial
 * indexes (pending heads, waiting rows, claimed and failed rows), so nothing reads the claim
 * index; every claim and every mark still wrote it (a claim moves a row's entry, a dispatched mark
 * removes it). Version 6 keeps every row.
 *
 * Rolling upgrades: a relay of an earlier library version claims and marks against version 6
 * tables unchanged (its claims read the version 3 indexes too); only its `stats` (status, the
 * relay's backlog gauge) lost its index and reads the whole outbox table, dispatched history
 * included. This library's `stats` runs on version 5 tables unchanged (the index is then written
 * but not read).
 *
 * @module
 */

import { claimIndex, claimIndexSql } from "./schema.ts";
import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** Version 6 `up`: drops the claim index (rows are untouched). */
export function schemaV6Up(_dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [`DROP INDEX IF EXISTS ${claimIndex(t)}`];
}

/**
 * Version 6 `down`: creates the claim index again as version 2 made it (same columns and
 * predicate; building it reads the table).
 */
export function schemaV6Down(dialect: SqlDialect, t: ResolvedSqlOutboxTables): string[] {
  return [claimIndexSql(dialect, t, true)];
}
