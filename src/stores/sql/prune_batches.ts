/**
 * When a SQL prune loop (outbox and inbox) stops: after a batch that found fewer than
 * `batchSize` prunable rows. On Postgres that is the batch's own count (`batch`, dialects.ts):
 * the rows it locked, skipping those another transaction holds (another pruner's batch, a
 * requeue, a keyed enqueue that locked its key's head), never waiting for them. A full batch
 * means more prunable rows may follow, whatever it deleted; a batch that finds fewer leaves only
 * rows others held just then, which their pruner deletes or a later run does. (Stopping on the
 * deleted count, when batches still waited for such rows, left 19,000 of 20,000 prunable rows
 * behind: three concurrent pruners with batch sizes 1000, 10 and 37, two rounds of five.)
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
