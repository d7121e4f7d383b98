/**
 * node:sqlite and better-sqlite3 (where its binary loads) on Node: a transaction opened on the
 * connection outside the library (`db.isTransaction` / `db.inTransaction`) is waited for, never
 * joined: a relay's claim does not see its rows, and an inbox transaction runs after it instead
 * of as a savepoint inside it.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import {
  migrate,
  SqlForeignTransactionError,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "@outbox/nats";
import { sqliteDrivers } from "./sqlite_drivers.ts";

for (const driver of sqliteDrivers) {
  test(`${driver.name}: a foreign transaction is waited for, never joined`, {
    skip: driver.skip,
  }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "outbox-sqlite-shared-"));
    const db = driver.open(join(dir, "app.db"));
    try {
      const executor = db.executor;
      await migrate(executor, { dialect: "sqlite" });
      db.exec("BEGIN IMMEDIATE");
      await new SqlOutboxRepository(db.executorWith({ openTransaction: "join" }), "sqlite")
        .enqueue({
          id: "raw-uncommitted",
          kind: "event.publish",
          name: "order.created",
          subject: "orders.created",
          payload: "{}",
          headers: {},
        });
      const relay = new SqlOutboxRepository(executor, "sqlite");
      const claimed = relay.claimDue(10, new Date());
      const inbox = executor.transaction!(async (tx) => {
        await new SqlInboxRepository(tx, "sqlite").record("evt-1");
      });
      await new Promise((resolve) => setTimeout(resolve, 30));
      db.exec("ROLLBACK");
      assert.deepEqual(await claimed, []);
      await inbox;
      assert.equal(await new SqlInboxRepository(executor, "sqlite").has("evt-1"), true);
      db.exec("BEGIN");
      await assert.rejects(
        db.executorWith({ openTransactionTimeoutMs: 20 }).query("SELECT 1", []),
        SqlForeignTransactionError,
      );
      db.exec("ROLLBACK");
    } finally {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
