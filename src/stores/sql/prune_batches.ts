/**
 * When a SQL prune loop (outbox and inbox) stops: after a batch that found fewer than
 * `batchSize` prunable rows. On Postgres that is the batch's own count (`batch`, dialects.ts),
 * not the deleted one: a batch whose rows a concurrent pruner deleted, or a requeue changed,
 * while it waited for their locks deletes fewer rows than it found, and more prunable rows may
 * follow. Stopping on the deleted count left them all behind (three concurrent pruners with
 * batch sizes 1000, 10 and 37 left 19,000 of 20,000 prunable rows in two rounds of five).
 *
 * @module
 */

import type { SqlDialect } from "./tables.ts";
import { integer } from "./decode.ts";

/**
 * What the prune statement that returned `rows` did: the rows it deleted (Postgres: its count;
 * SQLite: a row per deletion) and whether it was the last batch.
 */
export function pruneBatch(
  dialect: SqlDialect,
  rows: readonly Record<string, unknown>[],
  batchSize: number,
): { deleted: number; last: boolean } {
  const deleted = dialect === "postgres" ? integer(rows[0]?.n) ?? 0 : rows.length;
  const found = dialect === "postgres" ? integer(rows[0]?.batch) ?? deleted : deleted;
  return { deleted, last: found < batchSize };
}
