/**
 * Postgres for benchmarks: a fresh database per run on the kit's server (so a million-row table
 * never lands in someone else's database), stale-run sweeping, and fast history seeding.
 *
 * @module
 */

import postgres from "postgres";
import { postgresUrl, uniqueName, withDatabase } from "../../tests/kit/mod.ts";
import { payloadBytes, subjectCount } from "./records.ts";

/** Prefix of every database a benchmark creates. */
export const benchDatabasePrefix = "outbox_bench_";

/** A database created for one benchmark run. */
export interface BenchDatabase {
  /** The server the database lives on. */
  serverUrl: string;
  /** The database name. */
  name: string;
  /** URL of the database. */
  url: string;
  /** Drops the database (connections are terminated). */
  drop(): Promise<void>;
}

/**
 * Creates `outbox_bench_<unique>` on `server` (default: the kit's Postgres server). Databases of earlier runs that
 * nobody is connected to any more (a run killed before its clean-up) are dropped first: a
 * `DROP DATABASE` without `FORCE` refuses a database in use, so a concurrent run is safe.
 */
export async function createBenchDatabase(
  label: string,
  server?: string,
): Promise<BenchDatabase> {
  const serverUrl = server ?? await postgresUrl();
  const name = uniqueName(`${benchDatabasePrefix}${label}`).slice(0, 63);
  const admin = postgres(serverUrl, { max: 1, onnotice: () => {} });
  try {
    await sweepStaleDatabases(admin);
    await admin.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  return {
    serverUrl,
    name,
    url: withDatabase(serverUrl, name),
    async drop() {
      const sql = postgres(serverUrl, { max: 1, onnotice: () => {} });
      try {
        await sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await sql.end();
      }
    },
  };
}

async function sweepStaleDatabases(admin: postgres.Sql): Promise<void> {
  const rows = await admin.unsafe(
    `SELECT datname FROM pg_database WHERE datname LIKE '${benchDatabasePrefix}%'
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = pg_database.datname)`,
  );
  for (const row of rows) {
    await admin.unsafe(`DROP DATABASE IF EXISTS ${row.datname}`).catch(() => {});
  }
}

/**
 * Inserts `count` dispatched rows into a schema-version-2 outbox table in ONE statement
 * (`generate_series`): what a service that keeps its dispatched history looks like after a while.
 * Rows are older than anything enqueued afterwards (lower `seq`, earlier `created_at`).
 */
export async function seedPostgresHistory(
  sql: postgres.Sql,
  table: string,
  count: number,
  prefix = "bench",
): Promise<void> {
  await sql.unsafe(
    `INSERT INTO ${table} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at)
     SELECT 'hist-' || g, 'event.publish', 'order.created', '${prefix}.s' || (g % ${subjectCount}),
            ${historyPayloadSql("g")}, '{}'::jsonb, 'dispatched', 1,
            now() - interval '2 days' + g * interval '1 ms', now() - interval '2 days' + g * interval '1 ms' + interval '20 ms'
     FROM generate_series(1, ${count}) AS g`,
  );
}

/**
 * Inserts `count` failed rows waiting for their retry time (due in a day) in ONE statement: the
 * backlog a service builds up while one stream refuses writes. Older than anything enqueued
 * afterwards.
 */
export async function seedPostgresRetryBacklog(
  sql: postgres.Sql,
  table: string,
  count: number,
): Promise<void> {
  await sql.unsafe(
    `INSERT INTO ${table} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error)
     SELECT 'wait-' || g, 'event.publish', 'order.created', 'bench.s' || (g % ${subjectCount}),
            ${historyPayloadSql("g")}, '{}'::jsonb, 'failed', 3,
            now() - interval '1 hour', now() - interval '1 minute', now() + interval '1 day' + g * interval '1 ms', 'retryable: busy'
     FROM generate_series(1, ${count}) AS g`,
  );
}

/** A JSON payload of about {@linkcode payloadBytes} bytes for row `g` (SQL expression). */
export function historyPayloadSql(g: string): string {
  const fixed = `{"type":"order.created","orderId":,"customerId":"c-","note":""}`.length;
  return `'{"type":"order.created","orderId":' || ${g} || ',"customerId":"c-' || (${g} % 977) || '","note":"' || repeat('x', ${
    payloadBytes - fixed - 10
  }) || '"}'`;
}
