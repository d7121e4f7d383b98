/**
 * The installed package's SQL stores pass the conformance suite on Node: SQLite through
 * node:sqlite and better-sqlite3 where its binary loads (a WAL file in a temp dir, a second
 * connection as the peer), Postgres through
 * node-postgres and postgres.js (fresh unique tables per fixture).
 */

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import pg from "pg";
import postgres from "postgres";
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  migrate,
  OutboxSchemaError,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlInboxRepository,
  sqliteWorkerExecutor,
  SqlOutboxRepository,
} from "@outbox/nats";
import type { ConformanceFixture } from "../conformance/cases.ts";
import { testConformance } from "./conformance.ts";
import { sqliteDrivers } from "./sqlite_drivers.ts";
import { postgresUrl as testPostgresUrl } from "./servers.ts";

for (const driver of sqliteDrivers) {
  testConformance({
    name: `node ${driver.name}`,
    canCorrupt: true,
    async open(): Promise<ConformanceFixture> {
      const dir = mkdtempSync(join(tmpdir(), "outbox-sqlite-"));
      const db = driver.open(join(dir, "outbox.db"));
      const peer = driver.open(join(dir, "outbox.db"));
      await migrate(db.executor, { dialect: "sqlite" });
      return {
        outbox: new SqlOutboxRepository(db.executor, "sqlite"),
        inbox: new SqlInboxRepository(db.executor, "sqlite"),
        peers: [{
          outbox: new SqlOutboxRepository(peer.executor, "sqlite"),
          inbox: new SqlInboxRepository(peer.executor, "sqlite"),
        }],
        async corrupt(id) {
          await db.executor.query(
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
  }, driver.skip);

  if (driver.name === "node:sqlite") {
    // The relay's executor on a worker thread: its script ships in the package and resolves
    // next to the compiled module. The peer is the application's own connection.
    testConformance({
      name: "node sqliteWorkerExecutor",
      canCorrupt: true,
      async open(): Promise<ConformanceFixture> {
        const dir = mkdtempSync(join(tmpdir(), "outbox-sqlite-worker-"));
        const path = join(dir, "outbox.db");
        const peer = driver.open(path);
        const executor = await sqliteWorkerExecutor(path, { busyTimeoutMs: 10_000 });
        await migrate(executor, { dialect: "sqlite" });
        return {
          outbox: new SqlOutboxRepository(executor, "sqlite"),
          inbox: new SqlInboxRepository(executor, "sqlite"),
          peers: [{
            outbox: new SqlOutboxRepository(peer.executor, "sqlite"),
            inbox: new SqlInboxRepository(peer.executor, "sqlite"),
          }],
          async corrupt(id) {
            await executor.query(
              "UPDATE trellis_outbox SET headers = '{not json', kind = 'event.bogus' WHERE id = ?1",
              [id],
            );
          },
          async close() {
            await executor.close();
            peer.close();
            rmSync(dir, { recursive: true, force: true });
          },
        };
      },
    });
  }

  test(`node ${driver.name}: an unmigrated or version 1 database gives OutboxSchemaError`, {
    skip: driver.skip,
  }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "outbox-schema-"));
    const db = driver.open(join(dir, "app.db"));
    try {
      const record = {
        id: "m-1",
        kind: "event.publish",
        name: "demo",
        subject: "demo.a",
        payload: "{}",
        headers: {},
      } as const;
      const schemaError = (found: number, table = "trellis_outbox") => (error: unknown) => {
        assert.ok(error instanceof OutboxSchemaError, String(error));
        assert.equal(error.table, table);
        assert.equal(error.foundVersion, found);
        assert.match(error.message, /Run migrate\(\) or `outbox-nats migrate`/);
        return true;
      };
      const outbox = new SqlOutboxRepository(db.executor, "sqlite");
      const inbox = new SqlInboxRepository(db.executor, "sqlite");
      await assert.rejects(outbox.enqueue(record), schemaError(0));
      await assert.rejects(outbox.claimDue(10, new Date()), schemaError(0));
      await assert.rejects(outbox.stats(), schemaError(0));
      await assert.rejects(inbox.record("m-1"), schemaError(0, "trellis_inbox"));
      await migrate(db.executor, { dialect: "sqlite", to: 1 });
      await assert.rejects(outbox.enqueue(record), schemaError(1));
      await assert.rejects(outbox.claimDue(10, new Date()), schemaError(1));
      await assert.rejects(inbox.record("m-1"), schemaError(1, "trellis_inbox"));
    } finally {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

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
          `DROP TABLE IF EXISTS ${tables.outbox}, ${tables.inbox}, ${tables.outbox}_migrations, ${tables.outbox}_keys`,
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
