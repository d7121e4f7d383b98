/**
 * The installed package's SQL stores pass the conformance suite on Node 20: SQLite through
 * better-sqlite3 (a WAL file in a temp dir, a second connection as the peer), Postgres through
 * node-postgres and postgres.js (fresh unique tables per fixture).
 */

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
// @ts-types="@types/better-sqlite3"
import Database from "better-sqlite3";
import pg from "pg";
import postgres from "postgres";
import {
  betterSqlite3Executor,
  migrate,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "@outbox/nats";
import type { ConformanceFixture } from "../conformance/cases.ts";
import { testConformance } from "./conformance.ts";
import { postgresUrl as testPostgresUrl } from "./servers.ts";

function openSqlite(path: string): Database.Database {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 10000");
  return db;
}

testConformance({
  name: "node better-sqlite3",
  canCorrupt: true,
  async open(): Promise<ConformanceFixture> {
    const dir = mkdtempSync(join(tmpdir(), "outbox-bs3-"));
    const db = openSqlite(join(dir, "outbox.db"));
    const peer = openSqlite(join(dir, "outbox.db"));
    const executor = betterSqlite3Executor(db);
    const peerExecutor = betterSqlite3Executor(peer);
    await migrate(executor, { dialect: "sqlite" });
    return {
      outbox: new SqlOutboxRepository(executor, "sqlite"),
      inbox: new SqlInboxRepository(executor, "sqlite"),
      peers: [{
        outbox: new SqlOutboxRepository(peerExecutor, "sqlite"),
        inbox: new SqlInboxRepository(peerExecutor, "sqlite"),
      }],
      async corrupt(id) {
        await executor.query(
          "UPDATE trellis_outbox SET headers = '{not json', kind = 'event.bogus' WHERE id = ?1",
          [id],
        );
      },
      close() {
        peer.close();
        db.close();
        rmSync(dir, { recursive: true, force: true });
        return Promise.resolve();
      },
    };
  },
});

const postgresUrl = testPostgresUrl();

async function postgresFixture(
  executor: SqlExecutor,
  peer: SqlExecutor,
  end: () => Promise<void>,
): Promise<ConformanceFixture> {
  const base = `ob_node_${randomUUID().replaceAll("-", "").slice(0, 16)}`;
  const tables = { outbox: `${base}_o`, inbox: `${base}_i` };
  await migrate(executor, { dialect: "postgres", tables });
  return {
    outbox: new SqlOutboxRepository(executor, "postgres", tables),
    inbox: new SqlInboxRepository(executor, "postgres", tables),
    peers: [{
      outbox: new SqlOutboxRepository(peer, "postgres", tables),
      inbox: new SqlInboxRepository(peer, "postgres", tables),
    }],
    async corrupt(id) {
      await executor.query(
        `UPDATE ${tables.outbox} SET headers = '"not an object"'::jsonb, kind = 'event.bogus' WHERE id = $1`,
        [id],
      );
    },
    async close() {
      try {
        await executor.query(
          `DROP TABLE IF EXISTS ${tables.outbox}, ${tables.inbox}, ${tables.outbox}_migrations`,
          [],
        );
      } finally {
        await end();
      }
    },
  };
}

testConformance({
  name: "node postgres (node-postgres)",
  canCorrupt: true,
  open() {
    const pool = new pg.Pool({ connectionString: postgresUrl, max: 4 });
    const other = new pg.Pool({ connectionString: postgresUrl, max: 4 });
    return postgresFixture(pgExecutor(pool), pgExecutor(other), async () => {
      await Promise.all([pool.end(), other.end()]);
    });
  },
});

testConformance({
  name: "node postgres (postgres.js)",
  canCorrupt: true,
  open() {
    const sql = postgres(postgresUrl, { max: 4, onnotice: () => {} });
    const other = postgres(postgresUrl, { max: 4, onnotice: () => {} });
    return postgresFixture(postgresJsExecutor(sql), postgresJsExecutor(other), async () => {
      await Promise.all([sql.end(), other.end()]);
    });
  },
});
