/**
 * SQLite for benchmarks: a database file in a fresh temp dir (removed at exit), opened the way
 * the README recommends (WAL, busy timeout), and fast history seeding.
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import { cleanUpAtExit } from "./cleanup.ts";
import { payloadBytes, subjectCount } from "./records.ts";

/** Opens a new database file in a temp dir that is removed when the process ends. */
export async function openBenchSqlite(
  label: string,
): Promise<{ db: DatabaseSync; path: string; dir: string }> {
  const dir = await Deno.makeTempDir({ prefix: `outbox_bench_${label}_` });
  cleanUpAtExit({ kind: "dir", path: dir });
  const path = `${dir}/outbox.db`;
  return { db: openSqliteFile(path), path, dir };
}

/** Opens `path` with the README's settings: `journal_mode = WAL`, `busy_timeout = 5000`. */
export function openSqliteFile(path: string): DatabaseSync {
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA busy_timeout = 5000");
  return db;
}

/**
 * Inserts `count` dispatched rows into a schema-version-2 outbox table with ONE statement (a
 * recursive CTE) in one transaction. Rows are older than anything enqueued afterwards.
 */
export function seedSqliteHistory(db: DatabaseSync, table: string, count: number): void {
  const fixed = `{"type":"order.created","orderId":,"customerId":"c-","note":""}`.length;
  const pad = "x".repeat(payloadBytes - fixed - 10);
  const time = (offsetMs: string) =>
    `strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days', '+' || ((${offsetMs}) / 1000.0) || ' seconds')`;
  db.exec("BEGIN IMMEDIATE");
  try {
    db.prepare(
      `WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
       INSERT INTO ${table} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
       SELECT 'hist-' || n, 'event.publish', 'order.created', 'bench.s' || (n % ${subjectCount}),
              '{"type":"order.created","orderId":' || n || ',"customerId":"c-' || (n % 977) || '","note":"' || ?2 || '"}',
              '{}', 'dispatched', 1, ${time("n")}, ${time("n + 20")}
       FROM g`,
    ).run(count, pad);
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
}

/**
 * Inserts `count` failed rows waiting for their retry time (due in a day) in one statement: the
 * backlog a service builds up while one stream refuses writes.
 */
export function seedSqliteRetryBacklog(db: DatabaseSync, table: string, count: number): void {
  db.exec("BEGIN IMMEDIATE");
  try {
    db.prepare(
      `WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
       INSERT INTO ${table} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error)
       SELECT 'wait-' || n, 'event.publish', 'order.created', 'bench.s' || (n % ${subjectCount}),
              '{"orderId":' || n || '}', '{}', 'failed', 3,
              strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 hours'), strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 minutes'),
              strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+1 days', '+' || (n / 1000.0) || ' seconds'), 'retryable: busy'
       FROM g`,
    ).run(count);
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
}
