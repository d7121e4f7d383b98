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

import { activeStatesSql, terminalStatesSql } from "./schema.ts";
import { pendingSql, retrySql } from "./schema_v3.ts";
import type { ResolvedSqlOutboxTables, SqlDialect } from "./tables.ts";

/** Every statement a repository runs. Parameter order is documented per field. */
export interface OutboxStatements {
  /** $1 id, $2 kind, $3 name, $4 subject, $5 payload, $6 headers JSON, $7 now [, $8 channel] */
  insertOne: string;
  /** $1 JSON array of records (headers as JSON text), $2 now [, $3 channel] */
  insertMany: string;
  /** $1 id */
  get: string;
  /** $1 JSON array of ids */
  getMany: string;
  /** $1 now, $2 lease expiry, $3 limit, $4 claim token */
  claim: string;
  /** $1 seq, $2 claim token written by the claim, $3 error, $4 now */
  deadCorrupt: string;
  /**
   * $1 JSON array of marks {id, attempts, lease, token, state, error, next, outcome}, $2 now;
   * returns the ids it changed
   */
  markMany: string;
  /**
   * $1 JSON array of {id, attempts, token, state}: the ids already in `state` with claim token
   * `token` and the same attempts
   * (marks applied before by the same claim)
   */
  markApplied: string;
  /** $1 JSON array of ids, $2 now */
  requeue: string;
  /** $1 limit */
  listDead: string;
  /** $1 now */
  stats: string;
  /** $1 cutoff, $2 batch size; resolves with the deleted count (`n`) or one row per deletion */
  prune: Readonly<Record<"dispatched" | "dead", string>>;
  /** $1 cutoff */
  count: Readonly<Record<"dispatched" | "dead", string>>;
  /** $1 consumer, $2 message id, $3 now */
  inboxRecord: string;
  /** $1 consumer, $2 message id */
  inboxHas: string;
  /** $1 cutoff, $2 batch size */
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
    statements = Object.freeze(
      dialect === "postgres" ? postgres(tables, notify) : sqlite(tables),
    );
    cache.set(key, statements);
  }
  return statements;
}

const insertColumns =
  "id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at";

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
    } AS next_attempt_at, t.last_error, t.outcome::text AS outcome, t.claim_token`;
  const withNotify = (insert: string, channel: string) =>
    notify
      ? `WITH ins AS (${insert}) SELECT ins.* FROM ins, (SELECT pg_notify(${channel}, '${o}')) AS wake`
      : insert;
  // markMany: the fence is written `state || '' = 'claimed'` on purpose. A plain `state =
  // 'claimed'` lets the planner prove the partial claim index usable and, misled by its estimate
  // of claimed rows, scan every active row for a hash join; the batch must instead probe the
  // primary key once per mark (checked with EXPLAIN in tests/sql_claim_plan_test.ts).
  const prune = (state: "dispatched" | "dead") =>
    `WITH gone AS (DELETE FROM ${o} WHERE state = '${state}' AND updated_at < $1::timestamptz AND id IN (SELECT id FROM ${o} WHERE state = '${state}' AND updated_at < $1::timestamptz LIMIT $2::int) RETURNING 1) SELECT count(*) AS n FROM gone`;
  return {
    insertOne: withNotify(
      `INSERT INTO ${o} AS t (${insertColumns}) VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, 'pending', 0, $7::timestamptz, $7::timestamptz) ON CONFLICT (id) DO NOTHING RETURNING ${columns}`,
      "$8",
    ),
    insertMany: notify
      ? `WITH input AS (SELECT r.v, r.ord FROM json_array_elements($1::text::json) WITH ORDINALITY AS r(v, ord)), ins AS (INSERT INTO ${o} AS t (${insertColumns}) SELECT v->>'id', v->>'kind', v->>'name', v->>'subject', v->>'payload', (v->>'headers')::jsonb, 'pending', 0, $2::timestamptz, $2::timestamptz FROM input WHERE NOT EXISTS (SELECT 1 FROM ${o} AS x JOIN input AS i ON x.id = i.v->>'id') ORDER BY ord ON CONFLICT (id) DO NOTHING RETURNING ${columns}) SELECT ins.* FROM ins, (SELECT pg_notify($3, '${o}')) AS wake`
      : `WITH input AS (SELECT r.v, r.ord FROM json_array_elements($1::text::json) WITH ORDINALITY AS r(v, ord)) INSERT INTO ${o} AS t (${insertColumns}) SELECT v->>'id', v->>'kind', v->>'name', v->>'subject', v->>'payload', (v->>'headers')::jsonb, 'pending', 0, $2::timestamptz, $2::timestamptz FROM input WHERE NOT EXISTS (SELECT 1 FROM ${o} AS x JOIN input AS i ON x.id = i.v->>'id') ORDER BY ord ON CONFLICT (id) DO NOTHING RETURNING ${columns}`,
    get: `SELECT ${columns} FROM ${o} AS t WHERE t.id = $1`,
    getMany:
      `SELECT ${columns} FROM ${o} AS t WHERE t.id IN (SELECT json_array_elements_text($1::text::json))`,
    // The claimed ids are collected first (an InitPlan) and the rows fetched through the primary
    // key: joined to the table instead, large batches on mid-sized tables got a hash join over
    // a sequential scan of the whole table. The candidates are the oldest pending rows
    // (pending_idx, in seq order) and the earliest due retries and expired leases (retry_idx, in
    // due-time order), each locked as found; the claim takes the oldest of them by seq. Neither
    // scan reads rows that are not due, so a backlog of failed rows waiting for their retry
    // time costs a claim nothing.
    claim:
      `UPDATE ${o} AS t SET state = 'claimed', attempts = t.attempts + 1, updated_at = $1::timestamptz, next_attempt_at = $2::timestamptz, claim_token = $4 WHERE t.id = ANY(ARRAY(WITH p AS (SELECT id, seq FROM ${o} WHERE ${pendingSql} ORDER BY seq LIMIT $3::int FOR UPDATE SKIP LOCKED), r AS (SELECT id, seq FROM ${o} WHERE ${retrySql} AND next_attempt_at <= $1::timestamptz ORDER BY next_attempt_at LIMIT $3::int FOR UPDATE SKIP LOCKED) SELECT c.id FROM (SELECT id, seq FROM p UNION ALL SELECT id, seq FROM r) AS c ORDER BY c.seq LIMIT $3::int)) RETURNING ${columns}`,
    deadCorrupt:
      `UPDATE ${o} SET state = 'dead', next_attempt_at = NULL, last_error = $3, updated_at = $4::timestamptz WHERE seq = $1::bigint AND state = 'claimed' AND claim_token = $2`,
    // With a token, the token and attempts are the fence (attempts guards against writers that
    // claim without writing a token: older library versions during a rolling upgrade); without
    // one (claims built by hand), attempts and the lease expiry as in version 2.
    markMany:
      `UPDATE ${o} AS t SET state = m.state, updated_at = $2::timestamptz, next_attempt_at = m.next, last_error = CASE WHEN m.state = 'dispatched' THEN NULL ELSE m.error END, outcome = CASE WHEN m.outcome IS NULL THEN t.outcome ELSE m.outcome::jsonb END FROM json_to_recordset($1::text::json) AS m(id text, attempts integer, lease timestamptz, token text, state text, error text, next timestamptz, outcome text) WHERE t.id = m.id AND t.state || '' = 'claimed' AND (CASE WHEN m.token IS NULL THEN t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) ELSE t.claim_token = m.token AND t.attempts = m.attempts END) RETURNING t.id`,
    markApplied:
      `SELECT t.id FROM ${o} AS t JOIN json_to_recordset($1::text::json) AS m(id text, attempts integer, token text, state text) ON t.id = m.id WHERE t.claim_token = m.token AND t.attempts = m.attempts AND t.state = m.state`,
    requeue:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, updated_at = $2::timestamptz WHERE state = 'dead' AND id IN (SELECT json_array_elements_text($1::text::json)) RETURNING id`,
    listDead:
      `SELECT ${columns} FROM ${o} AS t WHERE t.state = 'dead' ORDER BY t.seq LIMIT $1::int`,
    stats:
      `SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz) AS due, ${
        iso(
          "min(created_at) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz)",
        )
      } AS oldest_due, (SELECT count(*) FROM ${o} WHERE state = 'dispatched') AS dispatched, (SELECT count(*) FROM ${o} WHERE state = 'dead') AS dead FROM ${o} WHERE ${activeStatesSql}`,
    prune: { dispatched: prune("dispatched"), dead: prune("dead") },
    count: {
      dispatched:
        `SELECT count(*) AS n FROM ${o} WHERE state = 'dispatched' AND updated_at < $1::timestamptz`,
      dead: `SELECT count(*) AS n FROM ${o} WHERE state = 'dead' AND updated_at < $1::timestamptz`,
    },
    inboxRecord:
      `INSERT INTO ${t.inbox} (consumer, message_id, received_at) VALUES ($1, $2, $3::timestamptz) ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`,
    inboxHas: `SELECT 1 AS found FROM ${t.inbox} WHERE consumer = $1 AND message_id = $2`,
    inboxPrune:
      `WITH gone AS (DELETE FROM ${t.inbox} WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM ${t.inbox} WHERE received_at < $1::timestamptz LIMIT $2::int) RETURNING 1) SELECT count(*) AS n FROM gone`,
  };
}

function sqlite(t: ResolvedSqlOutboxTables): OutboxStatements {
  const o = t.outbox;
  // RETURNING may only name the target table's columns, unqualified.
  const columns =
    "seq, id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome, claim_token";
  // SQLite uses a partial index only when the query repeats its WHERE term literally.
  const terminal = (state: "dispatched" | "dead") => `${terminalStatesSql} AND state = '${state}'`;
  const field = (name: string) => `json_extract(value, '$.${name}')`;
  return {
    insertOne:
      `INSERT INTO ${o} (${insertColumns}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7) ON CONFLICT (id) DO NOTHING RETURNING ${columns}`,
    insertMany: `INSERT INTO ${o} (${insertColumns}) SELECT ${field("id")}, ${field("kind")}, ${
      field("name")
    }, ${field("subject")}, ${field("payload")}, ${
      field("headers")
    }, 'pending', 0, ?2, ?2 FROM json_each(?1) WHERE NOT EXISTS (SELECT 1 FROM json_each(?1) AS j JOIN ${o} AS x ON x.id = json_extract(j.value, '$.id')) ORDER BY key ON CONFLICT (id) DO NOTHING RETURNING ${columns}`,
    get: `SELECT ${columns} FROM ${o} WHERE id = ?1`,
    getMany: `SELECT ${columns} FROM ${o} WHERE id IN (SELECT value FROM json_each(?1))`,
    // As on Postgres: the oldest pending rows (pending_idx) and the earliest due retries and
    // expired leases (retry_idx), the oldest of them by seq; the partial indexes' WHERE terms
    // are repeated literally.
    claim:
      `UPDATE ${o} SET state = 'claimed', attempts = attempts + 1, updated_at = ?1, next_attempt_at = ?2, claim_token = ?4 WHERE seq IN (SELECT seq FROM (SELECT seq FROM (SELECT seq FROM ${o} WHERE ${pendingSql} ORDER BY seq LIMIT ?3) UNION ALL SELECT seq FROM (SELECT seq FROM ${o} WHERE ${retrySql} AND next_attempt_at <= ?1 ORDER BY next_attempt_at LIMIT ?3)) ORDER BY seq LIMIT ?3) RETURNING ${columns}`,
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
      } AS outcome FROM json_each(?1)) AS m WHERE t.id = m.id AND t.state = 'claimed' AND (CASE WHEN m.token IS NULL THEN t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) ELSE t.claim_token = m.token AND t.attempts = m.attempts END) RETURNING id`,
    markApplied: `SELECT t.id AS id FROM ${o} AS t JOIN (SELECT ${field("id")} AS id, ${
      field("attempts")
    } AS attempts, ${field("token")} AS token, ${
      field("state")
    } AS state FROM json_each(?1)) AS m ON t.id = m.id WHERE t.claim_token = m.token AND t.attempts = m.attempts AND t.state = m.state`,
    requeue:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, updated_at = ?2 WHERE ${
        terminal("dead")
      } AND id IN (SELECT value FROM json_each(?1)) RETURNING id`,
    listDead: `SELECT ${columns} FROM ${o} WHERE ${terminal("dead")} ORDER BY seq LIMIT ?1`,
    stats:
      `SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= ?1) AS due, min(created_at) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= ?1) AS oldest_due, (SELECT count(*) FROM ${o} WHERE ${
        terminal("dispatched")
      }) AS dispatched, (SELECT count(*) FROM ${o} WHERE ${
        terminal("dead")
      }) AS dead FROM ${o} WHERE ${activeStatesSql}`,
    prune: {
      dispatched: `DELETE FROM ${o} WHERE seq IN (SELECT seq FROM ${o} WHERE ${
        terminal("dispatched")
      } AND updated_at < ?1 LIMIT ?2) RETURNING seq`,
      dead: `DELETE FROM ${o} WHERE seq IN (SELECT seq FROM ${o} WHERE ${
        terminal("dead")
      } AND updated_at < ?1 LIMIT ?2) RETURNING seq`,
    },
    count: {
      dispatched: `SELECT count(*) AS n FROM ${o} WHERE ${
        terminal("dispatched")
      } AND updated_at < ?1`,
      dead: `SELECT count(*) AS n FROM ${o} WHERE ${terminal("dead")} AND updated_at < ?1`,
    },
    inboxRecord:
      `INSERT INTO ${t.inbox} (consumer, message_id, received_at) VALUES (?1, ?2, ?3) ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id`,
    inboxHas: `SELECT 1 AS found FROM ${t.inbox} WHERE consumer = ?1 AND message_id = ?2`,
    inboxPrune:
      `DELETE FROM ${t.inbox} WHERE rowid IN (SELECT rowid FROM ${t.inbox} WHERE received_at < ?1 LIMIT ?2) RETURNING 1 AS n`,
  };
}

/** A Postgres timestamptz expression as ISO-8601 UTC text (`Date#toISOString()` form). */
function iso(expression: string): string {
  return `to_char((${expression}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
}
