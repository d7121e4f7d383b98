/**
 * The SQL text of every store operation, per dialect and table names. Texts are built once per
 * (dialect, tables, notify) and cached, so a repository over a transaction's executor costs a
 * map lookup to construct. Table names are validated identifiers; every value is a parameter.
 *
 * Conventions: Postgres parameters are `$n` with explicit casts (drivers send them untyped);
 * SQLite parameters are `?n` and timestamps are ISO-8601 text (`Date#toISOString()`), which
 * sorts chronologically. Batches travel as ONE JSON parameter (`json_to_recordset` /
 * `json_each`), so every driver binds them the same way.
 *
 * @module
 */

import { heldHeadsSql, waitingSql } from "./ordering_schema.ts";
import { outboxColumnsV3, terminalStatesSql } from "./schema.ts";
import { pendingSql, retrySql } from "./schema_v3.ts";
import { keySequencesTable } from "./schema_v4.ts";
import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** Every statement a repository runs. Parameter order is documented per field. */
export interface OutboxStatements {
  /**
   * $1 id, $2 kind, $3 name, $4 subject, $5 payload, $6 headers JSON, $7 now, $8 ordering key
   * [, $9 channel]
   */
  insertOne: string;
  /**
   * $1 JSON array of records (headers as JSON text, `orderingKey` or none), $2 now
   * [, $3 channel]. A row whose key has no head and which is not the first of its key in the
   * batch is held back (not inserted): insert it again once the first is in.
   */
  insertMany: string;
  /**
   * `insertMany` for a batch without ordering keys (same parameters and result). Postgres: its
   * rows inserted in batch order (no key to order by), as a single pass over the batch; SQLite:
   * the same text as `insertMany`.
   */
  insertManyUnkeyed: string;
  /** $1 id */
  get: string;
  /** $1 JSON array of ids */
  getMany: string;
  /**
   * $1 now, $2 lease expiry, $3 limit, $4 claim token. Returns only {@linkcode claimColumns}
   * (the rest is what the claim wrote: its parameters) and `key_sequence`. Postgres: each row
   * also says whether hand-overs are due (`stale_heads`); SQLite: no `stale_heads` (run
   * `staleHeads` after it).
   */
  claim: string;
  /** no parameters: `stale` is true when some dispatched head still has to hand over */
  staleHeads: string;
  /**
   * The key fence (schema version 4), for batches in which a mark carries a `sequence` or is
   * `dead`: for the keyed messages whose mark applies, a dispatched mark's sequence becomes
   * its key's `stream_seq`, a dead mark deletes its key's row. Postgres: `markManyRecordingKeys`
   * is `markMany` with that done in the same statement (same parameters and result); SQLite:
   * `keySequences` run in order before `markMany` ($1 the same JSON array of marks). The claim
   * returns each row's `key_sequence`.
   */
  keySequences: readonly string[];
  /** Postgres: `markMany` that also records key sequences (see `keySequences`); SQLite: "". */
  markManyRecordingKeys: string;
  /** $1 seq, $2 claim token written by the claim, $3 error, $4 now */
  deadCorrupt: string;
  /**
   * $1 JSON array of marks {id, attempts, lease, token, state, error, next, outcome}, $2 now;
   * returns `id`, `seq` and `stale` (a dispatched head whose key showed no next message to hand
   * over to) of the rows it changed
   */
  markMany: string;
  /**
   * The common batch's mark: $1 JSON object `{id: [attempts, token]}` (marks of distinct ids,
   * all dispatched, with a claim token, no outcome, no sequence), $2 now; settles only rows without an ordering key
   * (fenced by token and attempts, as `markMany`) and returns the `id` of the rows it changed.
   * A mark it did not apply (superseded, already applied, or a keyed row) goes to `markMany`.
   */
  markDispatchedFast: string;
  /**
   * SQLite: `markDispatchedFast` for marks of ONE claim (the batch of a single `claimDue`, the
   * usual case): $1 JSON object `{id: attempts}`, $2 now, $3 the claim token they all carry; same
   * fence and the same answer (the ids it changed). The token is bound once instead of repeated
   * in every entry, and each entry's attempts are read without parsing a nested array. (Returning
   * a count instead of the ids saved ~1 µs per mark but needed a second statement to tell which
   * marks applied when some did not, and a row pruned between the two was then reported not
   * applied: tests/sql_mark_counted_race_test.ts.) Postgres: "" (unused).
   */
  markDispatchedOneClaim: string;
  /**
   * $1 JSON array of {id, attempts, token, state}: the ids already in `state` with claim token
   * `token` and the same attempts
   * (marks applied before by the same claim)
   */
  markApplied: string;
  /**
   * $1 JSON array of ids or NULL (any), $2 limit: the `id` of dispatched heads still to hand
   * over (Postgres: locked, skipping those an enqueue of their key holds)
   */
  heldStale: string;
  /** $1 ordering key: the `id` of the key's dead head (Postgres: locked) */
  heldBlocked: string;
  /**
   * Postgres: $1 JSON array of ids of held heads: the `id` of those whose key lock this
   * transaction took (no keyed enqueue of their key in flight); SQLite: unused
   */
  keyLocks: string;
  /** Postgres: $1 ordering key: waits for the key lock (for a skip); SQLite: unused */
  keyLock: string;
  /**
   * $1 JSON array of ids of settled heads: each hands over to its next row; Postgres: $2 JSON
   * array of the ids that may leave their key without a head when it has no next row (their key
   * lock is held), returns `released` and `promoted` counts; SQLite: a row per changed row
   * (`promoted` true or false)
   */
  release: string;
  /** $1 ordering key, $2 now: requeues the key's dead head; returns its id */
  retryKey: string;
  /** $1 limit: blocked keys (dead heads), longest blocked first, with their waiting counts */
  blockedKeys: string;
  /** $1 JSON array of ids, $2 now */
  requeue: string;
  /** $1 limit */
  listDead: string;
  /** $1 now */
  stats: string;
  /**
   * $1 cutoff, $2 batch size; resolves with one row per deletion (SQLite) or, on Postgres, the
   * deleted count (`n`) and the prunable rows the batch locked (`batch`), skipping those another
   * transaction holds (left to a later batch or run): the batch is full when `batch` is $2,
   * whatever `n` is.
   */
  prune: Readonly<Record<"dispatched" | "dead", string>>;
  /** $1 cutoff */
  count: Readonly<Record<"dispatched" | "dead", string>>;
  /** $1 consumer, $2 message id, $3 now */
  inboxRecord: string;
  /** $1 consumer, $2 message id */
  inboxHas: string;
  /** $1 cutoff, $2 batch size; resolves as `prune` */
  inboxPrune: string;
}

const cache = new Map<string, OutboxStatements>();

/** The statements for `dialect` and `tables`; `notify` adds `pg_notify` to the inserts. */
export function outboxStatements(
  dialect: SqlDialect,
  tables: ResolvedSqlOutboxTables,
  notify: boolean,
): OutboxStatements {
  const key = `${dialect}\u0000${tables.outbox}\u0000${tables.inbox}\u0000${notify}`;
  let statements = cache.get(key);
  if (!statements) {
    const built = dialect === "postgres" ? postgres(tables, notify) : sqlite(tables);
    if (dialect === "postgres") {
      built.markManyRecordingKeys = postgresRecordingKeys(built.markMany, tables);
    }
    statements = Object.freeze(built);
    cache.set(key, statements);
  }
  return statements;
}

/**
 * Postgres: `markMany` with the key fence's recording in the same statement (one commit, and
 * atomic with the marks), as data-modifying CTEs after its `settled` CTE. They record only for
 * the rows `settled` actually changed (its RETURNING): a CTE's plain read of the outbox would
 * use the statement's snapshot, which under READ COMMITTED may still show a row `claimed` by a
 * stale claim that `settled`'s re-check (after waiting on a row lock) finds superseded, and its
 * old sequence would overwrite the key's newer one. At most one row per key (`DISTINCT ON`: an
 * upsert may not touch a row twice).
 */
function postgresRecordingKeys(markMany: string, t: ResolvedSqlOutboxTables): string {
  const keys = keySequencesTable(t);
  const ctes =
    `fence_marks AS (SELECT * FROM json_to_recordset($1::text::json) AS m(id text, state text, sequence bigint)), fence_hits AS (SELECT DISTINCT ON (s.ordering_key) s.ordering_key, m.state, m.sequence FROM settled AS s JOIN fence_marks AS m ON s.id = m.id WHERE s.ordering_key IS NOT NULL AND (m.state = 'dead' OR (m.state = 'dispatched' AND m.sequence IS NOT NULL)) ORDER BY s.ordering_key, s.seq DESC), fence_seen AS (INSERT INTO ${keys} AS k (ordering_key, stream_seq) SELECT ordering_key, sequence FROM fence_hits WHERE state = 'dispatched' ON CONFLICT (ordering_key) DO UPDATE SET stream_seq = excluded.stream_seq RETURNING 1), fence_forgot AS (DELETE FROM ${keys} WHERE ordering_key IN (SELECT ordering_key FROM fence_hits WHERE state = 'dead') RETURNING 1)`;
  const tail = " SELECT id, seq, stale FROM settled";
  if (!markMany.endsWith(tail)) throw new Error("markMany does not end with its SELECT");
  return `${markMany.slice(0, -tail.length)}, ${ctes}${tail}`;
}

const insertColumns =
  "id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head";
// Ordering keys: what reads or writes `ordering_key` / `key_head` below implements the per-key
// head described in ordering_schema.ts.

function postgres(t: ResolvedSqlOutboxTables, notify: boolean): OutboxStatements {
  const o = t.outbox;
  // Qualified with the alias `t` (UPDATE ... FROM would otherwise be ambiguous); JSON columns
  // as text so a JSON `null` outcome survives and every driver returns the same thing.
  // Timestamps are read back as ISO-8601 UTC text made by SQL (`iso`), never through the
  // session's DateStyle and TimeZone, which drivers would have to parse.
  const columns =
    `t.seq, t.id, t.kind, t.name, t.subject, t.payload, t.headers::text AS headers, t.state, t.attempts, ${
      iso("t.created_at")
    } AS created_at, ${iso("t.updated_at")} AS updated_at, ${
      iso("t.next_attempt_at")
    } AS next_attempt_at, t.last_error, t.outcome::text AS outcome, t.claim_token, t.ordering_key`;
  // What a claim returns: the columns it did not write (claimColumns), read as `columns` reads
  // them.
  const claimed = claimColumns.map((column) =>
    column === "headers" || column === "outcome"
      ? `t.${column}::text AS ${column}`
      : column === "created_at"
      ? `${iso("t.created_at")} AS created_at`
      : `t.${column}`
  ).join(", ");
  const withNotify = (ctes: string, insert: string, channel: string) =>
    notify
      ? `WITH ${ctes}, ins AS (${insert}) SELECT ins.* FROM ins, (SELECT pg_notify(${channel}, '${o}')) AS wake`
      : `WITH ${ctes} ${insert}`;
  const stale =
    `(SELECT EXISTS (SELECT 1 FROM ${o} WHERE ${heldHeadsSql} AND state = 'dispatched'))`;
  // The per-key lock (a transaction-level advisory lock on the table and key): every keyed
  // enqueue (and requeue) takes it shared before it reads its key's head and holds it until it
  // commits; a hand-over that would leave a key without a head takes it exclusively first (and
  // then looks for a next row in a later statement), so it never misses an enqueue in flight,
  // whichever head that enqueue saw. A hand-over to a visible next row needs no lock.
  const keyLockArgs = (key: string) => `hashtext('${o}'), hashtext(${key})`;
  // The next waiting row of the key of the row aliased `alias` (key_next_idx).
  const nextOf = (alias: string) =>
    `(SELECT id FROM ${o} WHERE ordering_key = ${alias}.ordering_key AND ${waitingSql} ORDER BY seq LIMIT 1)`;
  // Enqueue: a keyed row becomes its key's head when the key has none. The head it sees is
  // locked FOR KEY SHARE until the enqueue commits: a hand-over that could leave the key
  // without a head locks the head FOR UPDATE first, so it waits for (or skips) this enqueue
  // and then sees its row. Two enqueues that both see no head both try to insert one: the
  // unique key_head_idx makes the second wait for the first, and if that commits, its insert
  // does nothing (ON CONFLICT) and the repository inserts again, now behind the new head.
  // `(SELECT count(*) FROM lk) >= 0` makes the scan take the key lock before it locks a row.
  const head = `lk AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(${
    keyLockArgs("$8::text")
  }) WHERE $8::text IS NOT NULL), head AS (SELECT 1 FROM ${o} WHERE (SELECT count(*) FROM lk) >= 0 AND ordering_key = $8::text AND key_head FOR KEY SHARE)`;
  // `heads`: one probe of the key head index per key of the batch (LIMIT 1 keeps the lateral
  // subquery from being flattened): as `ordering_key IN (...)`, the generic plan made while the
  // table was small hashed the keys against a sequential scan of every row, on every keyed
  // enqueueMany of a producer (whose statements plan generations never reach: it never claims).
  //
  // Lock order: every key lock, head lock and head index entry a batch takes, it takes in one
  // order that does not depend on the batch's order: key order (`batch_keys`; rows sorted by
  // key). Rows inserted in batch order, two batches that gave two new keys their heads in
  // opposite orders each waited for the other's uncommitted entry in the unique key_head_idx: a
  // deadlock, which aborted a producer's transaction (tests/sql_enqueue_lock_order_test.ts). Rows
  // in key order, two batches wait for each other's entries only at their first new key in
  // common, which the first to get there holds. So the rows number themselves (`seq`, the
  // column's default) in key order, then batch order within a key, the unkeyed rows last: each
  // key keeps its messages' order, and messages of different keys in one batch, which have no
  // order between them, are claimed in key order. (Numbering them in batch order first would
  // need `nextval` on the identity sequence, a grant a producer role may not have. Primary key
  // entries are taken in that order too: two concurrent batches that store the same ids in
  // opposite orders can still wait for each other.)
  // `COLLATE "C"`: byte order, the cheapest to sort by; any order every batch takes would do.
  // The batch is parsed once (`json_to_recordset`), not once per field read.
  const batchKeys =
    `batch_keys AS (SELECT k FROM input WHERE k IS NOT NULL GROUP BY k ORDER BY k COLLATE "C")`;
  const batch =
    `input AS (SELECT r.* FROM ROWS FROM (json_to_recordset($1::text::json) AS (id text, kind text, name text, subject text, payload text, headers text, "orderingKey" text)) WITH ORDINALITY AS r(id, kind, name, subject, payload, headers, k, ord)), ${batchKeys}, lk AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(${
      keyLockArgs("d.k")
    }) FROM batch_keys AS d), heads AS (SELECT h.ordering_key FROM batch_keys AS d CROSS JOIN LATERAL (SELECT ordering_key FROM ${o} WHERE (SELECT count(*) FROM lk) >= 0 AND key_head AND ordering_key IS NOT NULL AND ordering_key = d.k LIMIT 1 FOR KEY SHARE) AS h), firsts AS (SELECT min(ord) AS ord FROM input WHERE k IS NOT NULL GROUP BY k), batch_rows AS (SELECT i.*, (i.k IS NULL OR (i.k NOT IN (SELECT ordering_key FROM heads) AND i.ord IN (SELECT ord FROM firsts))) AS head FROM input AS i)`;
  // Followers of a row that would become a new head are held back (a new head may lose to a
  // concurrent one and be inserted again later, after them); they go in the next round.
  const batchInsert =
    `INSERT INTO ${o} AS t (${insertColumns}) SELECT id, kind, name, subject, payload, headers::jsonb, 'pending', 0, $2::timestamptz, $2::timestamptz, k, head FROM batch_rows WHERE NOT EXISTS (SELECT 1 FROM ${o} AS x JOIN input AS i ON x.id = i.id) AND (head OR k IN (SELECT ordering_key FROM heads)) ORDER BY k COLLATE "C" NULLS LAST, ord ON CONFLICT DO NOTHING RETURNING ${columns}`;
  // A batch without keys takes no key lock, head lock or head entry: its rows go in batch
  // order, read from the batch as they are inserted. (Numbered and sorted as a keyed batch is,
  // 1,000-row batches cost more backend CPU than this.)
  const unkeyedInput =
    "input AS (SELECT r.v, r.ord FROM json_array_elements($1::text::json) WITH ORDINALITY AS r(v, ord))";
  const unkeyedInsert =
    `INSERT INTO ${o} AS t (${insertColumns}) SELECT v->>'id', v->>'kind', v->>'name', v->>'subject', v->>'payload', (v->>'headers')::jsonb, 'pending', 0, $2::timestamptz, $2::timestamptz, NULL, true FROM input WHERE NOT EXISTS (SELECT 1 FROM ${o} AS x JOIN input AS i ON x.id = i.v->>'id') ORDER BY ord ON CONFLICT DO NOTHING RETURNING ${columns}`;
  // markMany: the fence is written `state || '' = 'claimed'` on purpose. A plain `state =
  // 'claimed'` lets the planner prove the partial claim index usable and, misled by its estimate
  // of claimed rows, scan every active row for a hash join; the batch must instead probe the
  // primary key once per mark (checked with EXPLAIN in tests/sql_claim_plan_test.ts).
  const keep = "(ordering_key IS NULL OR NOT key_head)";
  // A batch is up to $2 prunable rows, oldest first by the retention index's own order
  // (updated_at), that no other transaction holds: it locks them FOR UPDATE SKIP LOCKED, which
  // re-checks every prune condition (state, cutoff, not a held keyed head) on the row's latest
  // version, and deletes exactly those rows (by id). A prune never waits for a row lock, so it
  // can never close a lock cycle: deleting a range instead, it waited for rows that keyed
  // enqueues hold FOR KEY SHARE (a head the enqueue locked, handed over since) while holding the
  // rows it had deleted, which an enqueue whose snapshot still saw one of them as its key's head
  // waited for in turn: "deadlock detected", and the producer's transaction was lost
  // (tests/sql_prune_deadlock_test.ts). A skipped row is left to a later batch or run: it is
  // being deleted by another pruner, or held by a transaction in flight. FOR UPDATE, not a
  // weaker lock: it conflicts with every lock a concurrent statement could still take on the row,
  // so the DELETE never waits either. Plans (tests/sql_plan_generation_test.ts), as a generic
  // plan made on an empty table must read only the batch: ordered by the index's own order, the
  // batch is read from the retention index (ordered by (updated_at, seq), it sorted every
  // prunable row); the DELETE reads the retention index's range from the batch's oldest
  // updated_at to its newest, and joins it to the batch on the locked row's address and id
  // (`ctid` alone is not unique across partitions). The plans Postgres 15 makes of it are
  // linear in the batch: a probe of the row's address per batch row, or a hash of one side
  // probed by the other (tests/sql_prune_linear_test.ts: generic plans made on an empty table,
  // custom and generic plans before and after ANALYZE). It is a cost choice, not a guarantee:
  // joined on (tableoid, ctid) instead, a custom plan on an unanalyzed table compared every row
  // of the range with every row of the batch. Keeping the rows whose id is `= ANY(ARRAY(SELECT id FROM batch))` instead,
  // a filter that searched the whole array for every row of the range: quadratic in the batch
  // (1.3 s for a batch of 10,000, 130 s for 100,000). Without the range, the join's plans
  // hashed the batch against every prunable row. The DELETE re-checks the conditions on its
  // snapshot's version; a row whose locked version differs from it (updated since, still
  // prunable) has another address: it stays, for the next batch.
  const prune = (state: "dispatched" | "dead") =>
    `WITH batch AS MATERIALIZED (SELECT ctid AS at, id, updated_at FROM ${o} WHERE state = '${state}' AND updated_at < $1::timestamptz AND ${keep} ORDER BY updated_at LIMIT $2::bigint FOR UPDATE SKIP LOCKED), gone AS (DELETE FROM ${o} AS d USING batch AS b WHERE d.ctid = b.at AND d.id = b.id AND d.state = '${state}' AND d.updated_at < $1::timestamptz AND d.updated_at >= (SELECT min(updated_at) FROM batch) AND d.updated_at <= (SELECT max(updated_at) FROM batch) AND (d.ordering_key IS NULL OR NOT d.key_head) RETURNING 1) SELECT count(*) AS n, (SELECT count(*) FROM batch) AS batch FROM gone`;
  const marks =
    "json_to_recordset($1::text::json) AS m(id text, attempts integer, lease timestamptz, token text, state text, error text, next timestamptz, outcome text)";
  // The key fence (schema_v4.ts): a claimed row's key sequence.
  const keys = keySequencesTable(t);
  const keySequence =
    `(SELECT k.stream_seq FROM ${keys} AS k WHERE k.ordering_key = t.ordering_key)`;

  return {
    insertOne: withNotify(
      head,
      `INSERT INTO ${o} AS t (${insertColumns}) VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, 'pending', 0, $7::timestamptz, $7::timestamptz, $8::text, $8::text IS NULL OR NOT EXISTS (SELECT 1 FROM head)) ON CONFLICT DO NOTHING RETURNING ${columns}`,
      "$9",
    ),
    insertMany: withNotify(batch, batchInsert, "$3"),
    insertManyUnkeyed: withNotify(unkeyedInput, unkeyedInsert, "$3"),
    get: `SELECT ${columns} FROM ${o} AS t WHERE t.id = $1`,
    // One primary-key probe per id (LIMIT 1 keeps the subquery from being flattened into a
    // join): as `t.id IN (...)`, the generic plan made while the table was small hashed the ids
    // and read the whole table, on every enqueueMany that met a stored id.
    getMany:
      `SELECT ${columns} FROM json_array_elements_text($1::text::json) AS m(id) CROSS JOIN LATERAL (SELECT * FROM ${o} AS x WHERE x.id = m.id LIMIT 1) AS t`,
    // The claimed ids are collected first (an InitPlan) and the rows fetched through the primary
    // key: joined to the table instead, large batches on mid-sized tables got a hash join over
    // a sequential scan of the whole table. The candidates are the oldest pending rows
    // (pending_idx, in seq order) and the earliest due retries and expired leases (retry_idx, in
    // due-time order), each locked as found; the claim takes the oldest of them by seq. Neither
    // scan reads rows that are not due, so a backlog of failed rows waiting for their retry
    // time costs a claim nothing. A `claimed` or `failed` row without a due time (set to NULL
    // by hand to retry now, or left by another writer) is due, as in version 2, in `stats()`
    // and in the other stores: a third scan of retry_idx (`IS NULL`) finds those. Its `ORDER BY
    // next_attempt_at DESC` orders nothing (all NULL) but makes the planner probe the index
    // (backwards, NULLs first) instead of a sequential scan that column statistics can favour.
    // FOR NO KEY UPDATE: an enqueue holding its key's head FOR KEY SHARE never hides the head
    // from a claim.
    claim:
      `UPDATE ${o} AS t SET state = 'claimed', attempts = t.attempts + 1, updated_at = $1::timestamptz, next_attempt_at = $2::timestamptz, claim_token = $4 WHERE t.id = ANY(ARRAY(WITH p AS (SELECT id, seq FROM ${o} WHERE ${pendingSql} ORDER BY seq LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED), r AS (SELECT id, seq FROM ${o} WHERE ${retrySql} AND next_attempt_at <= $1::timestamptz ORDER BY next_attempt_at LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED), u AS (SELECT id, seq FROM ${o} WHERE ${retrySql} AND next_attempt_at IS NULL ORDER BY next_attempt_at DESC LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED) SELECT c.id FROM (SELECT id, seq FROM p UNION ALL SELECT id, seq FROM r UNION ALL SELECT id, seq FROM u) AS c ORDER BY c.seq LIMIT $3::int)) RETURNING ${claimed}, ${stale} AS stale_heads, CASE WHEN t.ordering_key IS NULL THEN NULL ELSE ${keySequence} END AS key_sequence`,
    staleHeads: `SELECT ${stale} AS stale`,
    keySequences: [],
    markManyRecordingKeys: "", // built from markMany by outboxStatements
    deadCorrupt:
      `UPDATE ${o} SET state = 'dead', next_attempt_at = NULL, last_error = $3, updated_at = $4::timestamptz WHERE seq = $1::bigint AND state = 'claimed' AND claim_token = $2`,
    // With a token, the token and attempts are the fence (attempts guards against writers that
    // claim without writing a token: older library versions during a rolling upgrade); without
    // one (claims built by hand), attempts and the lease expiry as in version 2. A dispatched head hands over to the next row of its
    // key in the same statement when one is visible; otherwise it stays head (`stale`) and the
    // repository hands over in a transaction (`heldStale`, `keyLocks`, then `release`), where an
    // enqueue still in flight can no longer be missed (see keyLockArgs).
    markMany: `WITH nexts AS (SELECT h.id, ${
      nextOf("h")
    } AS next FROM ${o} AS h WHERE h.id IN (SELECT m.id FROM ${marks} WHERE m.state = 'dispatched') AND h.key_head AND h.ordering_key IS NOT NULL), settled AS (UPDATE ${o} AS t SET state = m.state, updated_at = $2::timestamptz, next_attempt_at = m.next, last_error = CASE WHEN m.state = 'dispatched' THEN NULL ELSE m.error END, outcome = CASE WHEN m.outcome IS NULL THEN t.outcome ELSE m.outcome::jsonb END, key_head = CASE WHEN n.next IS NULL THEN t.key_head ELSE false END FROM ${marks} LEFT JOIN nexts AS n ON n.id = m.id WHERE t.id = m.id AND t.state || '' = 'claimed' AND (CASE WHEN m.token IS NULL THEN t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) ELSE t.claim_token = m.token AND t.attempts = m.attempts END) RETURNING t.id, t.seq, t.ordering_key, t.ordering_key IS NOT NULL AND t.key_head AND t.state = 'dispatched' AS stale, n.next), promoted AS (UPDATE ${o} AS w SET key_head = true WHERE w.id IN (SELECT next FROM settled WHERE next IS NOT NULL) RETURNING 1) SELECT id, seq, stale FROM settled`,
    // markMany's effect on unkeyed rows marked dispatched with a token: no hand-over (unkeyed
    // rows are never held heads), no key fence, so no CTEs. The rows are found through the
    // primary key (`= ANY(ARRAY(...))`, as the claim does) and each is checked against its
    // entry of the object (an InitPlan: parsed once): joined to the marks instead, a generic
    // plan made while the table was small hashed a sequential scan of the whole table.
    // `state || ''`: as in markMany.
    markDispatchedFast:
      `UPDATE ${o} AS t SET state = 'dispatched', updated_at = $2::timestamptz, next_attempt_at = NULL, last_error = NULL WHERE t.id = ANY(ARRAY(SELECT jsonb_object_keys($1::text::jsonb))) AND t.state || '' = 'claimed' AND t.claim_token = (SELECT $1::text::jsonb) -> t.id ->> 1 AND t.attempts = ((SELECT $1::text::jsonb) -> t.id ->> 0)::int AND t.ordering_key IS NULL RETURNING t.id`,
    markDispatchedOneClaim: "",
    markApplied:
      `SELECT t.id FROM ${o} AS t JOIN json_to_recordset($1::text::json) AS m(id text, attempts integer, token text, state text) ON t.id = m.id WHERE t.claim_token = m.token AND t.attempts = m.attempts AND t.state = m.state`,
    heldStale:
      `SELECT id FROM ${o} WHERE ${heldHeadsSql} AND state = 'dispatched' AND ($1::text IS NULL OR id IN (SELECT json_array_elements_text($1::text::json))) ORDER BY seq LIMIT $2::int FOR NO KEY UPDATE SKIP LOCKED`,
    heldBlocked:
      `SELECT id FROM ${o} WHERE ordering_key = $1 AND key_head AND state = 'dead' FOR UPDATE`,
    keyLocks:
      `SELECT id FROM ${o} WHERE id IN (SELECT json_array_elements_text($1::text::json)) AND ordering_key IS NOT NULL AND pg_try_advisory_xact_lock(${
        keyLockArgs("ordering_key")
      }) FOR UPDATE SKIP LOCKED`,
    keyLock: `SELECT 1 FROM (SELECT pg_advisory_xact_lock(${keyLockArgs("$1::text")})) AS l`,
    release: `WITH heads AS (SELECT h.id, ${
      nextOf("h")
    } AS next FROM ${o} AS h WHERE h.id IN (SELECT json_array_elements_text($1::text::json)) AND ${heldHeadsSql}), cleared AS (UPDATE ${o} AS h SET key_head = false FROM heads WHERE h.id = heads.id AND h.key_head AND (heads.next IS NOT NULL OR h.id IN (SELECT json_array_elements_text($2::text::json))) RETURNING heads.next), promoted AS (UPDATE ${o} AS w SET key_head = true WHERE w.id IN (SELECT next FROM cleared WHERE next IS NOT NULL) RETURNING 1) SELECT (SELECT count(*) FROM cleared) AS released, (SELECT count(*) FROM promoted) AS promoted`,
    // Like requeue: the token is cleared, so claims from before the retry stay ended.
    retryKey:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, claim_token = NULL, updated_at = $2::timestamptz WHERE ordering_key = $1 AND key_head AND state = 'dead' RETURNING id`,
    // A requeue ends every earlier claim: it clears the token, so a claimer that writes none (an
    // older library version during a rolling upgrade) cannot recreate "claimed, attempts 1" with
    // the token of the claim before the requeue and have that claim's late mark apply.
    // A requeued message that had left its key (it was skipped) comes back as the key's next
    // message, or as its head when the key has none (locked like an enqueue's).
    // The targets are locked as read (FOR NO KEY UPDATE): a skip of a target that commits while
    // this statement waits is then read as it left the row (no longer its key's head), so the
    // requeue makes it the head again instead of leaving it pending behind no head at all; a
    // target never counts as its key's head in `heads` (the statement's snapshot may predate the
    // skip). A head the skip promoted meanwhile makes the update fail on the unique head index,
    // and the repository runs it again.
    requeue:
      `WITH target AS (SELECT seq, ordering_key, key_head FROM ${o} WHERE state = 'dead' AND id IN (SELECT json_array_elements_text($1::text::json)) FOR NO KEY UPDATE), lk AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(${
        keyLockArgs("d.ordering_key")
      }) FROM (SELECT DISTINCT ordering_key FROM target WHERE NOT key_head AND ordering_key IS NOT NULL) AS d), heads AS (SELECT ordering_key FROM ${o} WHERE (SELECT count(*) FROM lk) >= 0 AND key_head AND seq NOT IN (SELECT seq FROM target) AND ordering_key IN (SELECT ordering_key FROM target WHERE NOT key_head) FOR KEY SHARE), firsts AS (SELECT min(seq) AS seq FROM target WHERE NOT key_head GROUP BY ordering_key) UPDATE ${o} AS t SET state = 'pending', attempts = 0, next_attempt_at = NULL, claim_token = NULL, updated_at = $2::timestamptz, key_head = t.key_head OR (t.ordering_key NOT IN (SELECT ordering_key FROM heads) AND t.seq IN (SELECT seq FROM firsts)) WHERE t.seq IN (SELECT seq FROM target) AND t.state = 'dead' RETURNING t.id`,
    listDead:
      `SELECT ${columns} FROM ${o} AS t WHERE t.state = 'dead' ORDER BY t.seq LIMIT $1::int`,
    blockedKeys: `SELECT h.ordering_key AS key, h.id AS head_id, ${
      iso("h.updated_at")
    } AS since, h.last_error, (SELECT count(*) FROM ${o} WHERE ordering_key = h.ordering_key AND ${waitingSql}) AS waiting FROM ${o} AS h WHERE ${heldHeadsSql} AND state = 'dead' ORDER BY h.updated_at, h.seq LIMIT $1::int`,
    // The active rows through the version 3 partial indexes (see `activeStats`); least() skips
    // a NULL.
    stats: `SELECT p.pending + w.waiting AS pending, r.claimed, r.failed, p.due + r.due AS due, ${
      iso("least(p.oldest_due, r.oldest_due)")
    } AS oldest_due, (SELECT count(*) FROM ${o} WHERE state = 'dispatched') AS dispatched, (SELECT count(*) FROM ${o} WHERE state = 'dead') AS dead, (SELECT count(*) FROM ${o} WHERE ${heldHeadsSql} AND state = 'dead') AS blocked_keys FROM ${
      activeStats(o, "$1::timestamptz")
    }`,
    prune: { dispatched: prune("dispatched"), dead: prune("dead") },
    count: {
      dispatched:
        `SELECT count(*) AS n FROM ${o} WHERE state = 'dispatched' AND updated_at < $1::timestamptz AND ${keep}`,
      dead:
        `SELECT count(*) AS n FROM ${o} WHERE state = 'dead' AND updated_at < $1::timestamptz AND ${keep}`,
    },
    inboxRecord:
      `INSERT INTO ${t.inbox} (consumer, message_id, received_at) VALUES ($1, $2, $3::timestamptz) ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`,
    inboxHas: `SELECT 1 AS found FROM ${t.inbox} WHERE consumer = $1 AND message_id = $2`,
    // As the outbox's prune: up to $2 of the oldest ids (received_idx order) no other
    // transaction holds, locked FOR UPDATE SKIP LOCKED (the cutoff re-checked on the locked
    // row), deleted by reading the received_idx range they span joined to the batch on the
    // locked row's address and key (linear in the batch on every plan; `ctid = ANY(...)` was
    // quadratic). A prune never waits for a row lock: deleting a whole range, two pruners
    // whose plans read it in different orders (index and heap order) could wait for each
    // other. The inbox never updates a row, so the address locked is the one the statement's
    // snapshot sees; a row another writer updated meanwhile stays, for the next batch.
    inboxPrune:
      `WITH batch AS MATERIALIZED (SELECT ctid AS at, consumer, message_id, received_at FROM ${t.inbox} WHERE received_at < $1::timestamptz ORDER BY received_at LIMIT $2::bigint FOR UPDATE SKIP LOCKED), gone AS (DELETE FROM ${t.inbox} AS d USING batch AS b WHERE d.ctid = b.at AND d.consumer = b.consumer AND d.message_id = b.message_id AND d.received_at < $1::timestamptz AND d.received_at >= (SELECT min(received_at) FROM batch) AND d.received_at <= (SELECT max(received_at) FROM batch) RETURNING 1) SELECT count(*) AS n, (SELECT count(*) FROM batch) AS batch FROM gone`,
  };
}

/**
 * The outbox columns a claim leaves out of what it returns: those it sets to its own parameters
 * (the repository knows them; each returned column is a value the driver decodes per row, and
 * on Postgres each timestamp one more `to_char` per row), and `key_head` (a claimed keyed row is
 * its key's head).
 */
const claimOmits: ReadonlySet<string> = new Set([
  "state",
  "updated_at",
  "next_attempt_at",
  "claim_token",
  "key_head",
]);

/**
 * The columns a claim returns (plus `key_sequence`), in both dialects: `seq`, then every other
 * column of the outbox ({@linkcode outboxColumnsV3}) but those in `claimOmits`, so a column added
 * to the schema is returned (and checked in every claimed row) without being listed here.
 */
export const claimColumns: readonly string[] = [
  "seq",
  ...outboxColumnsV3.filter((column) => column !== "seq" && !claimOmits.has(column)),
];

function sqlite(t: ResolvedSqlOutboxTables): OutboxStatements {
  const o = t.outbox;
  // RETURNING may only name the target table's columns, unqualified.
  const columns =
    "seq, id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome, claim_token, ordering_key";
  // SQLite uses a partial index only when the query repeats its WHERE term literally.
  const terminal = (state: "dispatched" | "dead") => `${terminalStatesSql} AND state = '${state}'`;
  const field = (name: string) => `json_extract(value, '$.${name}')`;
  const rf = (name: string) => `json_extract(r.value, '$.${name}')`;
  // INDEXED BY: the head index (every key with a head) would serve this query too, at a cost
  // that grows with the number of keys.
  const stale =
    `(SELECT EXISTS (SELECT 1 FROM ${o} INDEXED BY ${o}_key_held_idx WHERE ${heldHeadsSql} AND state = 'dispatched'))`;
  const keep = "(ordering_key IS NULL OR NOT key_head)";
  // SQLite has one writer, so a statement sees every committed row: an enqueue makes its row
  // the head when the key has none, a hand-over gives the head to the next row or to nobody.
  const heldHeads =
    `SELECT id FROM ${o} WHERE id IN (SELECT value FROM json_each(?1)) AND ${heldHeadsSql}`;
  // The key fence (schema_v4.ts); `o` is qualified in RETURNING's subquery, where a bare
  // column would name the key table's.
  const keys = keySequencesTable(t);
  const keySequence =
    `(SELECT k.stream_seq FROM ${keys} AS k WHERE k.ordering_key = ${o}.ordering_key)`;
  const fencedMarks = `${o} AS t JOIN (SELECT ${field("id")} AS id, ${
    field("attempts")
  } AS attempts, ${field("lease")} AS lease, ${field("token")} AS token, ${
    field("state")
  } AS state, ${
    field("sequence")
  } AS sequence FROM json_each(?1)) AS m ON t.id = m.id WHERE t.ordering_key IS NOT NULL AND t.state = 'claimed' AND (CASE WHEN m.token IS NULL THEN t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) ELSE t.claim_token = m.token AND t.attempts = m.attempts END)`;
  // `r` is the batch row; its first row per key becomes the key's head when it has none. One
  // writer: the batch goes in in its order, keyed or not.
  const insertMany = `INSERT INTO ${o} (${insertColumns}) SELECT ${rf("id")}, ${rf("kind")}, ${
    rf("name")
  }, ${rf("subject")}, ${rf("payload")}, ${rf("headers")}, 'pending', 0, ?2, ?2, ${
    rf("orderingKey")
  }, ${rf("orderingKey")} IS NULL OR (NOT EXISTS (SELECT 1 FROM ${o} AS h WHERE h.ordering_key = ${
    rf("orderingKey")
  } AND h.key_head) AND r.key = (SELECT min(j.key) FROM json_each(?1) AS j WHERE json_extract(j.value, '$.orderingKey') = ${
    rf("orderingKey")
  })) FROM json_each(?1) AS r WHERE NOT EXISTS (SELECT 1 FROM json_each(?1) AS j JOIN ${o} AS x ON x.id = json_extract(j.value, '$.id')) ORDER BY r.key ON CONFLICT (id) DO NOTHING RETURNING ${columns}`;
  return {
    insertOne:
      `INSERT INTO ${o} (${insertColumns}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7, ?8, ?8 IS NULL OR NOT EXISTS (SELECT 1 FROM ${o} WHERE ordering_key = ?8 AND key_head)) ON CONFLICT (id) DO NOTHING RETURNING ${columns}`,
    insertMany,
    insertManyUnkeyed: insertMany,
    get: `SELECT ${columns} FROM ${o} WHERE id = ?1`,
    getMany: `SELECT ${columns} FROM ${o} WHERE id IN (SELECT value FROM json_each(?1))`,
    // As on Postgres: the oldest pending rows (pending_idx) and the earliest due retries and
    // expired leases (retry_idx), plus claimed/failed rows without a due time (due, as in
    // version 2), the oldest of them by seq; the partial indexes' WHERE terms are repeated
    // literally. RETURNING runs its subqueries once per returned row: the key sequence is
    // looked up only for keyed rows (CASE), and whether hand-overs are due is asked once, by
    // `staleHeads` after the claim, instead of in every row.
    claim:
      `UPDATE ${o} SET state = 'claimed', attempts = attempts + 1, updated_at = ?1, next_attempt_at = ?2, claim_token = ?4 WHERE seq IN (SELECT seq FROM (SELECT seq FROM (SELECT seq FROM ${o} WHERE ${pendingSql} ORDER BY seq LIMIT ?3) UNION ALL SELECT seq FROM (SELECT seq FROM ${o} WHERE ${retrySql} AND next_attempt_at <= ?1 ORDER BY next_attempt_at LIMIT ?3) UNION ALL SELECT seq FROM (SELECT seq FROM ${o} WHERE ${retrySql} AND next_attempt_at IS NULL LIMIT ?3)) ORDER BY seq LIMIT ?3) RETURNING ${
        claimColumns.join(", ")
      }, CASE WHEN ordering_key IS NULL THEN NULL ELSE ${keySequence} END AS key_sequence`,
    staleHeads: `SELECT ${stale} AS stale`,
    keySequences: [
      `INSERT INTO ${keys} (ordering_key, stream_seq) SELECT t.ordering_key, m.sequence FROM ${fencedMarks} AND m.state = 'dispatched' AND m.sequence IS NOT NULL ORDER BY t.seq ON CONFLICT (ordering_key) DO UPDATE SET stream_seq = excluded.stream_seq`,
      `DELETE FROM ${keys} WHERE ordering_key IN (SELECT t.ordering_key FROM ${fencedMarks} AND m.state = 'dead')`,
    ],
    markManyRecordingKeys: "",
    deadCorrupt:
      `UPDATE ${o} SET state = 'dead', next_attempt_at = NULL, last_error = ?3, updated_at = ?4 WHERE seq = ?1 AND state = 'claimed' AND claim_token = ?2`,
    markMany:
      `UPDATE ${o} AS t SET state = m.state, updated_at = ?2, next_attempt_at = m.next, last_error = CASE WHEN m.state = 'dispatched' THEN NULL ELSE m.error END, outcome = coalesce(m.outcome, t.outcome) FROM (SELECT ${
        field("id")
      } AS id, ${field("attempts")} AS attempts, ${field("lease")} AS lease, ${
        field("token")
      } AS token, ${field("state")} AS state, ${field("error")} AS error, ${
        field("next")
      } AS next, ${
        field("outcome")
      } AS outcome FROM json_each(?1)) AS m WHERE t.id = m.id AND t.state = 'claimed' AND (CASE WHEN m.token IS NULL THEN t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) ELSE t.claim_token = m.token AND t.attempts = m.attempts END) RETURNING id, seq, ordering_key IS NOT NULL AND key_head AND state = 'dispatched' AS stale`,
    markDispatchedFast:
      `UPDATE ${o} AS t SET state = 'dispatched', updated_at = ?2, next_attempt_at = NULL, last_error = NULL FROM (SELECT key AS id, json_extract(value, '$[0]') AS attempts, json_extract(value, '$[1]') AS token FROM json_each(?1)) AS m WHERE t.id = m.id AND t.state = 'claimed' AND t.claim_token = m.token AND t.attempts = m.attempts AND t.ordering_key IS NULL RETURNING id`,
    markDispatchedOneClaim:
      `UPDATE ${o} AS t SET state = 'dispatched', updated_at = ?2, next_attempt_at = NULL, last_error = NULL FROM (SELECT key AS id, value AS attempts FROM json_each(?1)) AS m WHERE t.id = m.id AND t.state = 'claimed' AND t.claim_token = ?3 AND t.attempts = m.attempts AND t.ordering_key IS NULL RETURNING id`,
    markApplied: `SELECT t.id AS id FROM ${o} AS t JOIN (SELECT ${field("id")} AS id, ${
      field("attempts")
    } AS attempts, ${field("token")} AS token, ${
      field("state")
    } AS state FROM json_each(?1)) AS m ON t.id = m.id WHERE t.claim_token = m.token AND t.attempts = m.attempts AND t.state = m.state`,
    heldStale:
      `SELECT id FROM ${o} WHERE ${heldHeadsSql} AND state = 'dispatched' AND (?1 IS NULL OR id IN (SELECT value FROM json_each(?1))) ORDER BY seq LIMIT ?2`,
    heldBlocked: `SELECT id FROM ${o} WHERE ordering_key = ?1 AND key_head AND state = 'dead'`,
    // One writer: nothing to lock.
    keyLocks: "",
    keyLock: "",
    // One statement flips both rows of every hand-over: the heads lose key_head, their next
    // rows gain it (the set is computed before anything changes).
    release:
      `UPDATE ${o} SET key_head = NOT key_head WHERE id IN (${heldHeads} UNION ALL SELECT (SELECT w.id FROM ${o} AS w WHERE w.ordering_key = h.ordering_key AND w.state = 'pending' AND NOT w.key_head ORDER BY w.seq LIMIT 1) FROM ${o} AS h WHERE h.id IN (${heldHeads})) RETURNING key_head AS promoted`,
    retryKey:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, claim_token = NULL, updated_at = ?2 WHERE ordering_key = ?1 AND key_head AND state = 'dead' RETURNING id`,
    requeue:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, claim_token = NULL, updated_at = ?2, key_head = key_head OR (NOT EXISTS (SELECT 1 FROM ${o} AS h WHERE h.ordering_key = ${o}.ordering_key AND h.key_head) AND seq = (SELECT min(s.seq) FROM ${o} AS s WHERE s.ordering_key = ${o}.ordering_key AND s.state = 'dead' AND NOT s.key_head AND s.id IN (SELECT value FROM json_each(?1)))) WHERE ${
        terminal("dead")
      } AND id IN (SELECT value FROM json_each(?1)) RETURNING id`,
    listDead: `SELECT ${columns} FROM ${o} WHERE ${terminal("dead")} ORDER BY seq LIMIT ?1`,
    blockedKeys:
      `SELECT h.ordering_key AS key, h.id AS head_id, h.updated_at AS since, h.last_error AS last_error, (SELECT count(*) FROM ${o} AS w WHERE w.ordering_key = h.ordering_key AND w.state = 'pending' AND NOT w.key_head) AS waiting FROM ${o} AS h WHERE ${heldHeadsSql} AND state = 'dead' ORDER BY h.updated_at, h.seq LIMIT ?1`,
    // As Postgres's; the scalar min() is NULL when either side is.
    stats:
      `SELECT p.pending + w.waiting AS pending, r.claimed, r.failed, p.due + r.due AS due, coalesce(min(p.oldest_due, r.oldest_due), p.oldest_due, r.oldest_due) AS oldest_due, (SELECT count(*) FROM ${o} WHERE ${
        terminal("dispatched")
      }) AS dispatched, (SELECT count(*) FROM ${o} WHERE ${
        terminal("dead")
      }) AS dead, (SELECT count(*) FROM ${o} INDEXED BY ${o}_key_held_idx WHERE ${heldHeadsSql} AND state = 'dead') AS blocked_keys FROM ${
        activeStats(o, "?1")
      }`,
    prune: {
      dispatched: `DELETE FROM ${o} WHERE seq IN (SELECT seq FROM ${o} WHERE ${
        terminal("dispatched")
      } AND updated_at < ?1 AND ${keep} LIMIT ?2) RETURNING seq`,
      dead: `DELETE FROM ${o} WHERE seq IN (SELECT seq FROM ${o} WHERE ${
        terminal("dead")
      } AND updated_at < ?1 AND ${keep} LIMIT ?2) RETURNING seq`,
    },
    count: {
      dispatched: `SELECT count(*) AS n FROM ${o} WHERE ${
        terminal("dispatched")
      } AND updated_at < ?1 AND ${keep}`,
      dead: `SELECT count(*) AS n FROM ${o} WHERE ${
        terminal("dead")
      } AND updated_at < ?1 AND ${keep}`,
    },
    inboxRecord:
      `INSERT INTO ${t.inbox} (consumer, message_id, received_at) VALUES (?1, ?2, ?3) ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`,
    inboxHas: `SELECT 1 AS found FROM ${t.inbox} WHERE consumer = ?1 AND message_id = ?2`,
    inboxPrune:
      `DELETE FROM ${t.inbox} WHERE rowid IN (SELECT rowid FROM ${t.inbox} WHERE received_at < ?1 LIMIT ?2) RETURNING 1 AS n`,
  };
}

/**
 * The `FROM` of `stats`: the active rows counted through the partial indexes of version 3, each
 * read once and none of the dispatched history. `p` (`pending_idx`): pending rows a claim may
 * take, with those due at `now` and the oldest of them; `w` (`key_next_idx`): pending rows
 * waiting behind their key's head (never due); `r` (`retry_idx`): claimed and failed rows (always
 * heads), with those due and the oldest. SQLite uses a partial index only for a query that
 * repeats its `WHERE` terms, so these are the index definitions' own terms.
 */
function activeStats(o: string, now: string): string {
  const due = `(next_attempt_at IS NULL OR next_attempt_at <= ${now})`;
  return `(SELECT count(*) AS pending, count(*) FILTER (WHERE ${due}) AS due, min(created_at) FILTER (WHERE ${due}) AS oldest_due FROM ${o} WHERE ${pendingSql}) AS p, (SELECT count(*) AS waiting FROM ${o} WHERE ${waitingSql}) AS w, (SELECT count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE key_head AND ${due}) AS due, min(created_at) FILTER (WHERE key_head AND ${due}) AS oldest_due FROM ${o} WHERE ${retrySql}) AS r`;
}

/** A Postgres timestamptz expression as ISO-8601 UTC text (`Date#toISOString()` form). */
function iso(expression: string): string {
  return `to_char((${expression}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
}
