/**
 * Fresh Postgres databases for tests.
 *
 * @module
 */

import postgres from "postgres";
import { uniqueName } from "./names.ts";
import { postgresUrl } from "./services.ts";

/** A database that exists for one test (or file); dropped on dispose. */
export interface TestDatabase extends AsyncDisposable {
  name: string;
  url: string;
}

/** Replaces the database name in a Postgres URL. */
export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${encodeURIComponent(database)}`;
  return parsed.toString();
}

/** Creates a database with a unique name on the test server (or `serverUrl`). */
export async function createTestDatabase(serverUrl?: string): Promise<TestDatabase> {
  const server = serverUrl ?? await postgresUrl();
  const name = uniqueName("outbox_test");
  const admin = postgres(server, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  return {
    name,
    url: withDatabase(server, name),
    async [Symbol.asyncDispose]() {
      const sql = postgres(server, { max: 1, onnotice: () => {} });
      try {
        await sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await sql.end();
      }
    },
  };
}
