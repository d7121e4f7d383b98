/**
 * A private outbox on the test Postgres for the ordering-key race tests: unique tables, migrated,
 * a postgres.js pool of 8 (the races hold several transactions open at once), dropped on close.
 */

import postgres from "postgres";
import {
  migrate,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../../mod.ts";
import { postgresUrl } from "../kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./harness.ts";

/** One private outbox: its pool, executor, tables and repository. */
export interface Db {
  sql: postgres.Sql;
  executor: SqlExecutor;
  tables: SqlOutboxTables;
  outbox: SqlOutboxRepository;
  close(): Promise<void>;
}

/** Opens a migrated private outbox. */
export async function open(): Promise<Db> {
  const sql = postgres(await postgresUrl(), { max: 8, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  const tables = uniqueTables();
  await migrate(executor, { dialect: "postgres", tables });
  return {
    sql,
    executor,
    tables,
    outbox: new SqlOutboxRepository(executor, "postgres", tables),
    async close() {
      try {
        await dropPostgresTables(executor, tables);
      } finally {
        await sql.end();
      }
    },
  };
}
