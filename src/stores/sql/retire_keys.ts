/**
 * Idle-key retirement, the last step of the outbox's `prune` (with `dispatchedBefore`): the key
 * fence's row (`<outbox>_keys`, schema_v4.ts) of an ordering key that is idle is deleted, so the
 * table holds the keys in use instead of every key ever used (one key per aggregate, such as an
 * order id, would otherwise leave a row per aggregate forever).
 *
 * A key is idle at cutoff `C` when it has no head (no `pending`, `claimed` or `failed` message,
 * no dead head that blocks it: `key_head_idx`), no message waiting behind one (`key_next_idx`),
 * and no message dispatched at or after `C` still in the table (`key_settled_idx`, schema
 * version 5). Its rows dispatched before `C` are the row batches' to delete; a skipped (dead)
 * message does not keep its key. A key's messages live in the outbox rows alone (the head and
 * the waiting rows), so retiring its fence row never changes which message a claim may take: it
 * cannot strand a message or let two of a key run at once. It only makes the key's next message
 * go out without the broker fence, like a key's first message.
 *
 * The walk goes through `<outbox>_keys` in primary-key order, `batchSize` keys per round:
 *
 * - Postgres: in one transaction, the round's key rows are locked (`FOR UPDATE SKIP LOCKED`,
 *   skipping those a concurrent mark or pruner holds), THEN a second statement, whose snapshot
 *   is taken after the locks, deletes those that are idle. A mark that records a sequence for
 *   the key (it upserts the row, in the same statement as it settles its message) either
 *   committed before the locks, and the delete sees its message dispatched after `C` (or, still
 *   head, see it as the head), or it waits for the retirement to commit and then inserts the
 *   row again. (One DELETE with `NOT EXISTS` conditions would not do: under READ COMMITTED, a
 *   DELETE that waited for the row lock of a mark re-checks the row, but its subqueries still
 *   read the statement's old snapshot, in which the key was idle, and it deletes the sequence
 *   the mark has just written: tests/sql_retire_keys_test.ts.) A keyed enqueue does not touch
 *   the row; one still in flight when the delete runs makes its message the key's first again.
 * - SQLite: one writer; the delete is one statement that sees every committed row.
 *
 * @module
 */

import { integer } from "./decode.ts";
import type { SqlExecutor, SqlRow } from "./executors.ts";
import { waitingSql } from "./ordering_schema.ts";
import { keySequencesTable } from "./schema_v4.ts";
import { settledKeyRowsSql } from "./schema_v5.ts";
import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** The statements of one retirement round. */
export interface RetireKeyStatements {
  /** $1 the last key of the previous round ('' at first), $2 batch size: the round's keys. */
  keys: string;
  /**
   * $1 JSON array of the round's keys, $2 cutoff: deletes the idle ones; a row per deletion
   * (SQLite) or their count `n` (Postgres).
   */
  retire: string;
}

const cache = new Map<string, RetireKeyStatements>();

/** The retirement statements for `dialect` and `tables`. */
export function retireKeyStatements(
  dialect: SqlDialect,
  t: ResolvedSqlOutboxTables,
): RetireKeyStatements {
  const cacheKey = `${dialect}\u0000${t.outbox}`;
  let statements = cache.get(cacheKey);
  if (statements) return statements;
  const o = t.outbox;
  const keys = keySequencesTable(t);
  // Idle: each term is one probe of a partial index (the index's WHERE term repeated, which
  // SQLite needs to use it). Scalar subqueries, not EXISTS: Postgres may turn a correlated EXISTS
  // into a hash of every row it could match, and a generic plan made on an empty table did (a
  // sequential scan of the outbox for every round: tests/sql_plan_generation_test.ts).
  const idle = (k: string, cutoff: string) =>
    `coalesce((SELECT 1 FROM ${o} WHERE ordering_key = ${k} AND key_head AND ordering_key IS NOT NULL LIMIT 1), (SELECT 1 FROM ${o} WHERE ordering_key = ${k} AND ${waitingSql} LIMIT 1), (SELECT 1 FROM ${o} WHERE ordering_key = ${k} AND ${settledKeyRowsSql} AND updated_at >= ${cutoff} LIMIT 1)) IS NULL`;
  statements = dialect === "postgres"
    ? {
      keys:
        `SELECT ordering_key FROM ${keys} WHERE ordering_key > $1::text ORDER BY ordering_key LIMIT $2::bigint FOR UPDATE SKIP LOCKED`,
      retire:
        `WITH gone AS (DELETE FROM ${keys} AS k WHERE k.ordering_key = ANY(ARRAY(SELECT json_array_elements_text($1::text::json))) AND ${
          idle("k.ordering_key", "$2::timestamptz")
        } RETURNING 1) SELECT count(*) AS n FROM gone`,
    }
    : {
      keys:
        `SELECT ordering_key FROM ${keys} WHERE ordering_key > ?1 ORDER BY ordering_key LIMIT ?2`,
      retire: `DELETE FROM ${keys} WHERE ordering_key IN (SELECT value FROM json_each(?1)) AND ${
        idle(`${keys}.ordering_key`, "?2")
      } RETURNING 1 AS n`,
    };
  cache.set(cacheKey, statements);
  return statements;
}

/**
 * Retires the idle keys at `cutoff` (ISO text), `batchSize` keys per round; resolves with how
 * many key rows it deleted. `inTransaction` runs a round in a transaction (Postgres: needed for
 * the locks to last until the delete commits).
 */
export async function retireIdleKeys(
  dialect: SqlDialect,
  statements: RetireKeyStatements,
  inTransaction: <T>(work: (db: SqlExecutor) => Promise<T>) => Promise<T>,
  cutoff: string,
  batchSize: number,
): Promise<number> {
  let after = "";
  let retired = 0;
  while (true) {
    const round = await inTransaction(async (db) => {
      // Planned for each round's values: a generic plan cached while the outbox was small (and
      // analyzed) scans the whole outbox once per key (a round of 1,000 keys took 39 s at 100,000
      // rows), and the round holds its key rows locked, which marks then wait for.
      if (dialect === "postgres") {
        await db.query("SELECT set_config('plan_cache_mode', 'force_custom_plan', true)", []);
      }
      const rows = await db.query(statements.keys, [after, batchSize]);
      if (rows.length === 0) return { found: 0, last: after, deleted: 0 };
      const found = rows.map((row: SqlRow) => String(row.ordering_key));
      const deleted = await db.query(statements.retire, [JSON.stringify(found), cutoff]);
      return {
        found: found.length,
        last: found[found.length - 1],
        deleted: dialect === "postgres" ? integer(deleted[0]?.n) ?? 0 : deleted.length,
      };
    });
    retired += round.deleted;
    after = round.last;
    if (round.found < batchSize) return retired;
  }
}
