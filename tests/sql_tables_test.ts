/**
 * Table names are interpolated into SQL, so only plain identifiers are accepted, and a bad name
 * is rejected before any statement runs.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import {
  createPostgresOutboxSchema,
  createSqliteOutboxSchema,
  createSqlOutboxAdapter,
  getSqlOutboxMigrations,
  listenForOutboxWakeups,
  migrate,
  nodeSqliteExecutor,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
} from "../mod.ts";

const hostile = [
  "trellis_outbox; DROP TABLE users; --",
  "outbox --",
  "outbox)",
  'out"box',
  "out'box",
  "public.outbox",
  "1outbox",
  "",
  " outbox",
  "outbox\n",
  "outbøx",
  "x".repeat(49),
];

/** A real SQLite executor that counts the statements it runs. */
function countingExecutor(): { executor: SqlExecutor; count(): number; close(): void } {
  const db = new DatabaseSync(":memory:");
  const inner = nodeSqliteExecutor(db);
  let count = 0;
  return {
    executor: {
      query(sql, params) {
        count += 1;
        return inner.query(sql, params);
      },
      transaction(fn) {
        count += 1;
        return inner.transaction!(fn);
      },
    },
    count: () => count,
    close: () => db.close(),
  };
}

Deno.test("unsafe table names are rejected with OutboxValidationError before any statement", async () => {
  const { executor, count, close } = countingExecutor();
  try {
    for (const name of hostile) {
      for (const tables of [{ outbox: name, inbox: "inbox" }, { outbox: "outbox", inbox: name }]) {
        const field = tables.outbox === name ? "tables.outbox" : "tables.inbox";
        const expected = (error: Error & { field?: string }) => {
          assert.equal(error.name, "OutboxValidationError", `${JSON.stringify(name)}: ${error}`);
          assert.equal(error.field, field);
          return true;
        };
        assert.throws(() => new SqlOutboxRepository(executor, "sqlite", tables), expected);
        assert.throws(() => new SqlInboxRepository(executor, "sqlite", tables), expected);
        assert.throws(() => createSqlOutboxAdapter(executor, "sqlite", tables), expected);
        assert.throws(() => getSqlOutboxMigrations({ dialect: "postgres", tables }), expected);
        assert.throws(() => createSqliteOutboxSchema(tables), expected);
        assert.throws(() => createPostgresOutboxSchema(tables), expected);
        await assert.rejects(migrate(executor, { dialect: "sqlite", tables }), expected);
      }
      await assert.rejects(
        migrate(executor, { dialect: "sqlite", tables: { migrations: name } }),
        { name: "OutboxValidationError", field: "tables.migrations" },
      );
    }
    await assert.rejects(
      listenForOutboxWakeups({ listen: () => Promise.reject(new Error("must not listen")) }, {
        onWake: () => {},
        tables: { outbox: "a;b" },
      }),
      { name: "OutboxValidationError" },
    );
    assert.throws(
      () => new SqlOutboxRepository(executor, "mysql" as "sqlite"),
      { name: "OutboxValidationError", field: "dialect" },
    );
    assert.throws(
      () => new SqlOutboxRepository(executor, "sqlite", { outbox: "same", inbox: "SAME" }),
      { name: "OutboxValidationError", field: "tables" },
    );
    assert.throws(
      () => new SqlOutboxRepository(executor, "sqlite", {}, { notify: true }),
      { name: "OutboxValidationError", field: "notify" },
    );
    assert.equal(count(), 0, "no statement ran");
  } finally {
    close();
  }
});

Deno.test("valid identifiers of any case are accepted and used as given", () => {
  const { executor, close } = countingExecutor();
  try {
    const outbox = new SqlOutboxRepository(executor, "postgres", {
      outbox: "Orders_Outbox",
      inbox: "_in2",
    });
    assert.deepEqual({ ...outbox.tables }, {
      outbox: "Orders_Outbox",
      inbox: "_in2",
      migrations: "Orders_Outbox_migrations",
    });
    assert.ok(Object.isFrozen(outbox.tables));
  } finally {
    close();
  }
});
