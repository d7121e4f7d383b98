/**
 * Private migrated tables on the test Postgres for one test, with the single-connection
 * postgres.js clients the test works through: `await using pg = await openPostgresTables()`.
 * Disposal ends every client the test opened (ending one early, to flush its backend's
 * statistics, is fine), then drops the tables and ends `admin`.
 *
 * @module
 */

import postgres from "postgres";
import { migrate, postgresJsExecutor, type SqlOutboxTables } from "../../mod.ts";
import { postgresUrl } from "../kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./harness.ts";

/** One test's unique tables (migrated by `admin`) and its clients. */
export interface PostgresTables extends AsyncDisposable {
  /** The client that migrated the tables; it drops them on disposal. */
  admin: postgres.Sql;
  tables: SqlOutboxTables;
  /** A further client of one connection, ended on disposal. */
  connect(): postgres.Sql;
}

/** Opens one connection to the test server (notices ignored). */
function connection(url: string): postgres.Sql {
  return postgres(url, { max: 1, onnotice: () => {} });
}

/** Migrates fresh unique tables on the test server (see the module's comment). */
export async function openPostgresTables(): Promise<PostgresTables> {
  const url = await postgresUrl();
  const admin = connection(url);
  const tables = uniqueTables();
  const clients: postgres.Sql[] = [];
  const dispose = async (): Promise<void> => {
    try {
      await Promise.all(clients.map((client) => client.end()));
      await dropPostgresTables(postgresJsExecutor(admin), tables);
    } finally {
      await admin.end();
    }
  };
  try {
    await migrate(postgresJsExecutor(admin), { dialect: "postgres", tables });
  } catch (error) {
    await dispose();
    throw error;
  }
  return {
    admin,
    tables,
    connect() {
      const client = connection(url);
      clients.push(client);
      return client;
    },
    [Symbol.asyncDispose]: dispose,
  };
}
