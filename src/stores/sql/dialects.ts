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
  /** $1 now, $2 lease expiry, $3 limit */
  claim: string;
  /** $1 seq, $2 lease expiry set by the claim, $3 error, $4 now */
  deadCorrupt: string;
  /** $1 JSON array of marks {id, attempts, lease, state, error, next, outcome}, $2 now */
  markMany: string;
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
  const columns =
    "t.seq, t.id, t.kind, t.name, t.subject, t.payload, t.headers::text AS headers, t.state, t.attempts, t.created_at, t.updated_at, t.next_attempt_at, t.last_error, t.outcome::text AS outcome";
  const withNotify = (insert: string, channel: string) =>
    notify
      ? `WITH ins AS (${insert}) SELECT ins.* FROM ins, (SELECT pg_notify(${channel}, '${o}')) AS wake`
      : insert;
  const due =
    `${activeStatesSql} AND (next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz)`;
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
    // a sequential scan of the whole table.
    claim:
      `UPDATE ${o} AS t SET state = 'claimed', attempts = t.attempts + 1, updated_at = $1::timestamptz, next_attempt_at = $2::timestamptz WHERE t.id = ANY(ARRAY(SELECT id FROM ${o} WHERE ${due} ORDER BY seq LIMIT $3::int FOR UPDATE SKIP LOCKED)) RETURNING ${columns}`,
    deadCorrupt:
      `UPDATE ${o} SET state = 'dead', next_attempt_at = NULL, last_error = $3, updated_at = $4::timestamptz WHERE seq = $1::bigint AND state = 'claimed' AND next_attempt_at = $2::timestamptz`,
    markMany:
      `UPDATE ${o} AS t SET state = m.state, updated_at = $2::timestamptz, next_attempt_at = m.next, last_error = CASE WHEN m.state = 'dispatched' THEN NULL ELSE m.error END, outcome = CASE WHEN m.outcome IS NULL THEN t.outcome ELSE m.outcome::jsonb END FROM json_to_recordset($1::text::json) AS m(id text, attempts integer, lease timestamptz, state text, error text, next timestamptz, outcome text) WHERE t.id = m.id AND t.state || '' = 'claimed' AND t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) RETURNING t.id`,
    requeue:
      `UPDATE ${o} SET state = 'pending', attempts = 0, next_attempt_at = NULL, updated_at = $2::timestamptz WHERE state = 'dead' AND id IN (SELECT json_array_elements_text($1::text::json)) RETURNING id`,
    listDead:
      `SELECT ${columns} FROM ${o} AS t WHERE t.state = 'dead' ORDER BY t.seq LIMIT $1::int`,
    stats:
      `SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz) AS due, min(created_at) FILTER (WHERE next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz) AS oldest_due, (SELECT count(*) FROM ${o} WHERE state = 'dispatched') AS dispatched, (SELECT count(*) FROM ${o} WHERE state = 'dead') AS dead FROM ${o} WHERE ${activeStatesSql}`,
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
    "seq, id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome";
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
    claim:
      `UPDATE ${o} SET state = 'claimed', attempts = attempts + 1, updated_at = ?1, next_attempt_at = ?2 WHERE seq IN (SELECT seq FROM ${o} WHERE ${activeStatesSql} AND (next_attempt_at IS NULL OR next_attempt_at <= ?1) ORDER BY seq LIMIT ?3) RETURNING ${columns}`,
    deadCorrupt:
      `UPDATE ${o} SET state = 'dead', next_attempt_at = NULL, last_error = ?3, updated_at = ?4 WHERE seq = ?1 AND state = 'claimed' AND next_attempt_at = ?2`,
    markMany:
      `UPDATE ${o} AS t SET state = m.state, updated_at = ?2, next_attempt_at = m.next, last_error = CASE WHEN m.state = 'dispatched' THEN NULL ELSE m.error END, outcome = coalesce(m.outcome, t.outcome) FROM (SELECT ${
        field("id")
      } AS id, ${field("attempts")} AS attempts, ${field("lease")} AS lease, ${
        field("state")
      } AS state, ${field("error")} AS error, ${field("next")} AS next, ${
        field("outcome")
      } AS outcome FROM json_each(?1)) AS m WHERE t.id = m.id AND t.state = 'claimed' AND t.attempts = m.attempts AND (m.lease IS NULL OR t.next_attempt_at = m.lease) RETURNING id`,
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
