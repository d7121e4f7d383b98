/**
 * One call that wires an executor to the SQL outbox, inbox, schema and migrations.
 *
 * @module
 */

import type { SqlExecutor } from "./executors.ts";
import { SqlInboxRepository } from "./inbox.ts";
import {
  getSqlOutboxMigrations,
  migrate,
  type MigrateResult,
  type SqlOutboxMigration,
} from "./migrations.ts";
import { SqlOutboxRepository, type SqlOutboxRepositoryOptions } from "./outbox.ts";
import { createPostgresOutboxSchema, createSqliteOutboxSchema } from "./schema.ts";
import {
  checkDialect,
  resolveSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxTables,
} from "./tables.ts";

/**
 * What {@linkcode createSqlOutboxAdapter} returns.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { createSqlOutboxAdapter, nodeSqliteExecutor, type SqlOutboxAdapter } from "@outbox/nats";
 * const adapter: SqlOutboxAdapter = createSqlOutboxAdapter(
 *   nodeSqliteExecutor(new DatabaseSync(":memory:")),
 *   "sqlite",
 * );
 * ```
 */
export interface SqlOutboxAdapter {
  /** The outbox over the executor. */
  outbox: SqlOutboxRepository;
  /** The inbox over the executor. */
  inbox: SqlInboxRepository;
  /** The current schema for a fresh database (idempotent `CREATE ... IF NOT EXISTS`). */
  ddl: string[];
  /** The versioned artifacts, for your own migration tooling. */
  migrations: readonly SqlOutboxMigration[];
  /** Runs {@linkcode migrate} on the executor with these tables. */
  migrate(): Promise<MigrateResult>;
}

/**
 * Creates the SQL outbox and inbox over `executor`, plus the schema and its migrations (the
 * reference's `{ outbox, inbox, ddl }`, with `migrations` and `migrate()` added). Table names
 * are validated first: a bad name throws `OutboxValidationError` and nothing runs.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { createSqlOutboxAdapter, nodeSqliteExecutor } from "@outbox/nats";
 *
 * const { outbox, inbox, migrate } = createSqlOutboxAdapter(
 *   nodeSqliteExecutor(new DatabaseSync(":memory:")),
 *   "sqlite",
 *   { outbox: "orders_outbox", inbox: "orders_inbox" },
 * );
 * await migrate();
 * await outbox.enqueue({
 *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
 * });
 * console.log(await inbox.record("m-1")); // true
 * ```
 */
export function createSqlOutboxAdapter(
  executor: SqlExecutor,
  dialect: SqlDialect,
  tables?: SqlOutboxTables | Partial<SqlOutboxTables>,
  options: SqlOutboxRepositoryOptions = {},
): SqlOutboxAdapter {
  const checked = checkDialect(dialect);
  const resolved = resolveSqlOutboxTables(tables);
  return {
    outbox: new SqlOutboxRepository(executor, checked, resolved, options),
    inbox: new SqlInboxRepository(executor, checked, resolved),
    ddl: checked === "postgres"
      ? createPostgresOutboxSchema(resolved)
      : createSqliteOutboxSchema(resolved),
    migrations: getSqlOutboxMigrations({ dialect: checked, tables: resolved }),
    migrate: () => migrate(executor, { dialect: checked, tables: resolved }),
  };
}
