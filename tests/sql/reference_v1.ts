/**
 * The reference's version 1 artifacts, as its `getSqlOutboxMigrations()` returned them for the
 * default table names (obtained once by running the reference; embedded, nothing is imported from
 * it), plus its checksums for one pair of custom names.
 *
 * @module
 */

export const referencePostgresV1 = {
  id: "trellis_sql_outbox_inbox_postgres_v1",
  version: 1,
  dialect: "postgres",
  up: [
    "CREATE TABLE IF NOT EXISTS trellis_outbox (id text PRIMARY KEY, kind text NOT NULL, name text NOT NULL, subject text NOT NULL, payload text NOT NULL, headers jsonb NOT NULL, state text NOT NULL, attempts integer NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, next_attempt_at timestamptz, last_error text, outcome jsonb)",
    "CREATE INDEX IF NOT EXISTS trellis_outbox_due_idx ON trellis_outbox (state, next_attempt_at)",
    "CREATE TABLE IF NOT EXISTS trellis_inbox (message_id text PRIMARY KEY, received_at timestamptz NOT NULL)",
  ],
  down: [
    "DROP INDEX IF EXISTS trellis_outbox_due_idx",
    "DROP TABLE IF EXISTS trellis_inbox",
    "DROP TABLE IF EXISTS trellis_outbox",
  ],
  checksum: "fnv1a64:475148d1080cf8cf",
} as const;

export const referenceSqliteV1 = {
  id: "trellis_sql_outbox_inbox_sqlite_v1",
  version: 1,
  dialect: "sqlite",
  up: [
    "CREATE TABLE IF NOT EXISTS trellis_outbox (id TEXT PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL, subject TEXT NOT NULL, payload TEXT NOT NULL, headers TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, next_attempt_at TEXT, last_error TEXT, outcome TEXT)",
    "CREATE INDEX IF NOT EXISTS trellis_outbox_due_idx ON trellis_outbox (state, next_attempt_at)",
    "CREATE TABLE IF NOT EXISTS trellis_inbox (message_id TEXT PRIMARY KEY, received_at TEXT NOT NULL)",
  ],
  down: [
    "DROP INDEX IF EXISTS trellis_outbox_due_idx",
    "DROP TABLE IF EXISTS trellis_inbox",
    "DROP TABLE IF EXISTS trellis_outbox",
  ],
  checksum: "fnv1a64:8178e5295d0acfeb",
} as const;

/** The reference's checksums for tables { outbox: "Orders_Outbox", inbox: "orders_inbox_2" }. */
export const referenceCustomChecksums = {
  tables: { outbox: "Orders_Outbox", inbox: "orders_inbox_2" },
  postgres: "fnv1a64:f4f508de45baefb5",
  sqlite: "fnv1a64:05712c21f8fa437d",
} as const;

/** The reference's version 1 `up` for other table names (textual substitution of the above). */
export function referenceV1Up(
  dialect: "postgres" | "sqlite",
  tables: { outbox: string; inbox: string },
): string[] {
  const artifact = dialect === "postgres" ? referencePostgresV1 : referenceSqliteV1;
  return artifact.up.map((statement) =>
    statement.replaceAll("trellis_outbox", tables.outbox).replaceAll("trellis_inbox", tables.inbox)
  );
}
