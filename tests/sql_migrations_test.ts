/**
 * Schema artifacts and migrate(): version 1 identical to the reference's; a database created by
 * the reference's version 1 DDL, holding rows in every state, is upgraded in place with every
 * row preserved and usable; checksums are verified; downgrades never destroy data.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  createPostgresOutboxSchema,
  createSqliteOutboxSchema,
  getSqlOutboxMigrations,
  migrate,
  nodeSqliteExecutor,
  postgresJsExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlInboxRepository,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { migrationChecksum } from "../src/stores/sql/migrations.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";
import {
  referenceCustomChecksums,
  referencePostgresV1,
  referenceSqliteV1,
  referenceV1Up,
} from "./sql/reference_v1.ts";

Deno.test("version 1 artifacts are byte-identical to the reference's", () => {
  for (const reference of [referencePostgresV1, referenceSqliteV1]) {
    const [v1] = getSqlOutboxMigrations({ dialect: reference.dialect });
    assert.deepEqual({ ...v1, up: [...v1.up], down: [...v1.down] }, {
      ...reference,
      up: [...reference.up],
      down: [...reference.down],
    });
    assert.equal(migrationChecksum(reference.up, reference.down), reference.checksum);
    const [custom] = getSqlOutboxMigrations({
      dialect: reference.dialect,
      tables: referenceCustomChecksums.tables,
    });
    assert.equal(custom.checksum, referenceCustomChecksums[reference.dialect]);
  }
});

Deno.test("artifacts are frozen, versioned and checksummed", () => {
  for (const dialect of ["postgres", "sqlite"] as const) {
    const migrations = getSqlOutboxMigrations({ dialect });
    assert.deepEqual(migrations.map((m) => m.version), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(migrations.map((m) => m.id), [
      `trellis_sql_outbox_inbox_${dialect}_v1`,
      `trellis_sql_outbox_inbox_${dialect}_v2`,
      `trellis_sql_outbox_inbox_${dialect}_v3`,
      `trellis_sql_outbox_inbox_${dialect}_v4`,
      `trellis_sql_outbox_inbox_${dialect}_v5`,
      `trellis_sql_outbox_inbox_${dialect}_v6`,
    ]);
    for (const migration of migrations) {
      assert.ok(Object.isFrozen(migration) && Object.isFrozen(migration.up));
      assert.equal(migration.checksum, migrationChecksum(migration.up, migration.down));
    }
    assert.ok(Object.isFrozen(migrations));
  }
});

interface Db {
  dialect: SqlDialect;
  executor: SqlExecutor;
  tables: SqlOutboxTables;
  /** A second, independent connection. */
  other: SqlExecutor;
  close(): Promise<void>;
}

async function openDb(dialect: SqlDialect): Promise<Db> {
  const tables = uniqueTables();
  if (dialect === "sqlite") {
    const dir = await Deno.makeTempDir({ prefix: "outbox_migrate_" });
    const db = openSqlite(`${dir}/app.db`);
    const other = openSqlite(`${dir}/app.db`);
    return {
      dialect,
      executor: nodeSqliteExecutor(db),
      other: nodeSqliteExecutor(other),
      tables,
      async close() {
        other.close();
        db.close();
        await Deno.remove(dir, { recursive: true });
      },
    };
  }
  const url = await postgresUrl();
  const sql = postgres(url, { max: 2, onnotice: () => {} });
  const other = postgres(url, { max: 2, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  return {
    dialect,
    executor,
    other: postgresJsExecutor(other),
    tables,
    async close() {
      try {
        await dropPostgresTables(executor, tables);
      } finally {
        await Promise.all([sql.end(), other.end()]);
      }
    },
  };
}

const dialects: SqlDialect[] = ["sqlite", "postgres"];

function iso(date: Date): string {
  return date.toISOString();
}

/** 1 when the index `name` exists, 0 when not. */
async function indexCount(
  executor: SqlExecutor,
  dialect: SqlDialect,
  name: string,
): Promise<number> {
  return (await executor.query(
    dialect === "postgres"
      ? `SELECT 1 FROM pg_indexes WHERE indexname = '${name}'`
      : `SELECT 1 FROM sqlite_master WHERE name = '${name}'`,
    [],
  )).length;
}

for (const dialect of dialects) {
  Deno.test(`${dialect}: a reference v1 database with rows in every state is upgraded in place`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      for (const statement of referenceV1Up(dialect, tables)) await executor.query(statement, []);
      const t0 = new Date(Date.now() - 3_600_000);
      const at = (ms: number) => iso(new Date(t0.getTime() + ms));
      const now = new Date(t0.getTime() + 10_000);
      const leaseOfC1 = at(1_800_000);
      // Rows as the reference wrote them (ISO text timestamps, JSON text headers and outcome; on
      // Postgres through postgres.js, which stores that text as a jsonb string scalar),
      // inserted out of creation order so the backfill must sort.
      const rows: Array<
        [string, string, string, number, string, string | null, string | null, string | null]
      > = [
        // id, kind, state, attempts, created_at, next_attempt_at, last_error, outcome
        ["f2", "event.publish", "failed", 1, at(1_000), at(20_000), "later", null],
        ["p2", "event.publish", "pending", 0, at(0), null, null, null],
        ["p1", "event.publish", "pending", 0, at(0), null, null, null],
        ["c1", "event.publish", "claimed", 1, at(-1_000), leaseOfC1, null, null],
        [
          "d1",
          "job.submit",
          "dispatched",
          1,
          at(-2_000),
          null,
          null,
          '{"kind":"accepted","jobId":"j1"}',
        ],
        ["f1", "event.publish", "failed", 1, at(-3_000), at(5_000), "boom", null],
        ["c2", "event.publish", "claimed", 2, at(-4_000), at(-1_000), null, null],
      ];
      const p = (n: number) => dialect === "postgres" ? `$${n}` : `?${n}`;
      for (const [id, kind, state, attempts, created, next, error, outcome] of rows) {
        await executor.query(
          `INSERT INTO ${tables.outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome) VALUES (${
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13].map(p).join(", ")
          })`,
          [
            id,
            kind,
            `name-${id}`,
            `subj.${id}`,
            `{"id":"${id}"}`,
            `{"X-Id":"${id}"}`,
            state,
            attempts,
            created,
            created,
            next,
            error,
            outcome,
          ],
        );
      }
      for (const id of ["m1", "m2"]) {
        await executor.query(
          `INSERT INTO ${tables.inbox} (message_id, received_at) VALUES (${p(1)}, ${p(2)})`,
          [id, at(0)],
        );
      }

      const result = await migrate(executor, { dialect, tables });
      assert.deepEqual(result, {
        from: 1,
        to: 6,
        applied: [
          `trellis_sql_outbox_inbox_${dialect}_v2`,
          `trellis_sql_outbox_inbox_${dialect}_v3`,
          `trellis_sql_outbox_inbox_${dialect}_v4`,
          `trellis_sql_outbox_inbox_${dialect}_v5`,
          `trellis_sql_outbox_inbox_${dialect}_v6`,
        ],
        reverted: [],
        adopted: true,
      });
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const inbox = new SqlInboxRepository(executor, dialect, tables);

      // Every row is still there, unchanged.
      for (const [id, kind, state, attempts, created, next, error, outcome] of rows) {
        const message = await outbox.get(id);
        assert.ok(message, id);
        assert.equal(message.kind, kind);
        assert.equal(message.state, state);
        assert.equal(message.attempts, attempts);
        assert.equal(message.createdAt, created);
        assert.equal(message.nextAttemptAt, next ?? undefined);
        assert.equal(message.lastError, error ?? undefined);
        assert.deepEqual(message.outcome, outcome === null ? undefined : JSON.parse(outcome));
        assert.deepEqual(message.headers, { "X-Id": id });
        assert.equal(message.payload, `{"id":"${id}"}`);
      }
      assert.equal((await outbox.stats(now)).pending, 2);

      // Claims: due rows in creation order (ties by id); live leases and future retries wait.
      const claimed = await outbox.claimDue(10, now);
      assert.deepEqual(claimed.map((m) => [m.id, m.attempts]), [["c2", 3], ["f1", 2], ["p1", 1], [
        "p2",
        1,
      ]]);
      // A claim a reference dispatcher held before the upgrade still settles (and only once).
      const c1Claim = { id: "c1", attempts: 1, nextAttemptAt: leaseOfC1 };
      assert.equal(await outbox.markDispatched(c1Claim, now), true);
      assert.equal(await outbox.markDispatched(c1Claim, now), false);
      assert.deepEqual(
        await outbox.markMany(
          claimed.map((claim) => ({ claim, state: "dispatched" as const })),
          now,
        ),
        [true, true, true, true],
      );
      // New messages queue behind the old ones.
      await outbox.enqueue({
        id: "n1",
        kind: "event.publish",
        name: "n",
        subject: "subj.n1",
        payload: "{}",
        headers: {},
      });
      const later = await outbox.claimDue(10, new Date(t0.getTime() + 7_200_000));
      assert.deepEqual(later.map((m) => m.id), ["f2", "n1"]);

      // Retention works on the migrated rows.
      assert.deepEqual(
        await outbox.prune({ dispatchedBefore: new Date(t0.getTime() + 7_200_000), batchSize: 2 }),
        { dispatched: 6, dead: 0 },
      );

      // Inbox ids recorded by the reference are duplicates in the default scope.
      assert.equal(await inbox.record("m1"), false);
      assert.equal(await inbox.record("m2", { consumer: "" }), false);
      assert.equal(await inbox.record("m1", { consumer: "billing" }), true);
      assert.equal(await inbox.record("m3"), true);

      // Idempotent.
      assert.deepEqual(await migrate(executor, { dialect, tables }), {
        from: 6,
        to: 6,
        applied: [],
        reverted: [],
        adopted: false,
      });
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: migrate on an empty database applies v1 to v6 and records them`, async () => {
    const db = await openDb(dialect);
    try {
      const result = await migrate(db.executor, { dialect, tables: db.tables });
      assert.deepEqual(result.applied, [
        `trellis_sql_outbox_inbox_${dialect}_v1`,
        `trellis_sql_outbox_inbox_${dialect}_v2`,
        `trellis_sql_outbox_inbox_${dialect}_v3`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v6`,
      ]);
      assert.equal(result.adopted, false);
      const rows = await db.executor.query(
        `SELECT version, id, checksum FROM ${db.tables.outbox}_migrations ORDER BY version`,
        [],
      );
      const artifacts = getSqlOutboxMigrations({ dialect, tables: db.tables });
      assert.deepEqual(
        rows.map((row) => [Number(row.version), row.id, row.checksum]),
        artifacts.map((a) => [a.version, a.id, a.checksum]),
      );
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: a changed artifact is refused and nothing runs`, async () => {
    const db = await openDb(dialect);
    try {
      await migrate(db.executor, { dialect, tables: db.tables });
      await db.executor.query(
        `UPDATE ${db.tables.outbox}_migrations SET checksum = 'fnv1a64:0000000000000000' WHERE version = 2`,
        [],
      );
      await assert.rejects(migrate(db.executor, { dialect, tables: db.tables, to: 1 }), {
        name: "OutboxMigrationError",
        code: "changed",
      });
      const columns = await columnNames(db, db.tables.outbox);
      assert.ok(columns.includes("seq"), "the refused downgrade changed nothing");
      await db.executor.query(
        `UPDATE ${db.tables.outbox}_migrations SET version = 7 WHERE version = 2`,
        [],
      );
      await assert.rejects(migrate(db.executor, { dialect, tables: db.tables }), {
        name: "OutboxMigrationError",
        code: "newer",
      });
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: tables of an unknown shape are refused`, async () => {
    const db = await openDb(dialect);
    try {
      await db.executor.query(
        `CREATE TABLE ${db.tables.outbox} (id text PRIMARY KEY, body text)`,
        [],
      );
      await assert.rejects(migrate(db.executor, { dialect, tables: db.tables }), {
        name: "OutboxMigrationError",
        code: "unrecognised",
      });
      assert.deepEqual(await columnNames(db, db.tables.outbox), ["id", "body"]);
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: the fresh schema DDL equals v1 to v6 migrated and is adopted as v6`, async () => {
    const migrated = await openDb(dialect);
    const fresh = await openDb(dialect);
    try {
      await migrate(migrated.executor, { dialect, tables: migrated.tables });
      const ddl = dialect === "postgres"
        ? createPostgresOutboxSchema(fresh.tables)
        : createSqliteOutboxSchema(fresh.tables);
      for (let i = 0; i < 2; i++) {
        for (const statement of ddl) await fresh.executor.query(statement, []); // idempotent
      }
      assert.deepEqual(await catalog(fresh), await catalog(migrated));
      const result = await migrate(fresh.executor, { dialect, tables: fresh.tables });
      assert.deepEqual(result, { from: 6, to: 6, applied: [], reverted: [], adopted: true });
    } finally {
      await migrated.close();
      await fresh.close();
    }
  });

  Deno.test(`${dialect}: v2 down keeps every row (dead -> failed) and refuses to drop consumer scopes`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      await migrate(executor, { dialect, tables });
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const inbox = new SqlInboxRepository(executor, dialect, tables);
      const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
      await outbox.enqueueMany([
        { ...base, id: "a", headers: {} },
        { ...base, id: "b", headers: {} },
        { ...base, id: "c", headers: {} },
      ]);
      const now = new Date();
      const [a, b] = await outbox.claimDue(2, now);
      await outbox.markDead(a, { error: "no stream", now });
      await outbox.markDispatched(b, now);
      await inbox.record("m1");
      await inbox.record("m2", { consumer: "billing" });

      await assert.rejects(migrate(executor, { dialect, tables, to: 1 }));
      assert.ok((await columnNames(db, tables.inbox)).includes("consumer"), "rolled back");
      assert.equal(await inbox.record("m2", { consumer: "billing" }), false, "scoped id kept");

      await executor.query(`DELETE FROM ${tables.inbox} WHERE consumer = 'billing'`, []);
      const result = await migrate(executor, { dialect, tables, to: 1 });
      assert.deepEqual(result.reverted, [
        `trellis_sql_outbox_inbox_${dialect}_v6`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
        `trellis_sql_outbox_inbox_${dialect}_v3`,
        `trellis_sql_outbox_inbox_${dialect}_v2`,
      ]);
      assert.deepEqual(
        new Set(await columnNames(db, tables.outbox)),
        new Set(
          referenceSqliteV1.up[0].match(/\((.*)\)/)![1].split(", ").map((c) => c.split(" ")[0]),
        ),
      );
      const p = dialect === "postgres" ? "$1" : "?1";
      const rows = await executor.query(
        `SELECT id, state, attempts, last_error, next_attempt_at, updated_at FROM ${tables.outbox} ORDER BY id`,
        [],
      );
      assert.deepEqual(rows.map((r) => [r.id, r.state, r.last_error]), [
        ["a", "failed", "no stream"],
        ["b", "dispatched", null],
        ["c", "pending", null],
      ]);
      assert.deepEqual(rows[0].next_attempt_at, rows[0].updated_at, "former dead row is due");
      const inboxRows = await executor.query(
        `SELECT message_id FROM ${tables.inbox} WHERE message_id = ${p}`,
        ["m1"],
      );
      assert.equal(inboxRows.length, 1);
      // And up again.
      assert.deepEqual((await migrate(executor, { dialect, tables })).applied, [
        `trellis_sql_outbox_inbox_${dialect}_v2`,
        `trellis_sql_outbox_inbox_${dialect}_v3`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v6`,
      ]);
      assert.equal((await outbox.get("c"))?.state, "pending");
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: a version 2 database with claims in flight is upgraded to v3 in place and back`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      await migrate(executor, { dialect, tables, to: 2 });
      // A version 2 repository's rows: the claim is made with version 2 SQL (no claim_token).
      const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
      const p = (n: number) => dialect === "postgres" ? `$${n}` : `?${n}`;
      const cast = dialect === "postgres" ? "::timestamptz" : "";
      const now = new Date();
      const lease = new Date(now.getTime() + 30_000).toISOString();
      for (const id of ["a", "b", "c"]) {
        await executor.query(
          `INSERT INTO ${tables.outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at) VALUES (${
            p(1)
          }, 'event.publish', 'n', 's.a', '{}', '{}', 'pending', 0, ${p(2)}${cast}, ${
            p(2)
          }${cast})`,
          [id, now.toISOString()],
        );
      }
      await executor.query(
        `UPDATE ${tables.outbox} SET state = 'claimed', attempts = 1, next_attempt_at = ${
          p(1)
        }${cast} WHERE id = 'a'`,
        [lease],
      );
      const result = await migrate(executor, { dialect, tables });
      assert.deepEqual(result.applied, [
        `trellis_sql_outbox_inbox_${dialect}_v3`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v6`,
      ]);
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const held = await outbox.get("a");
      assert.equal(held?.state, "claimed");
      assert.equal(held?.claimToken, undefined, "claimed before v3: no token");
      // The version 2 claim still settles with its version 2 fence.
      assert.equal(
        await outbox.markDispatched({ id: "a", attempts: 1, nextAttemptAt: lease }, now),
        true,
      );
      const [b] = await outbox.claimDue(1, now);
      assert.equal(b.id, "b");
      assert.equal(typeof b.claimToken, "string");
      // Down to v2 keeps every row; the claim then settles with the v2 fence.
      assert.deepEqual((await migrate(executor, { dialect, tables, to: 2 })).reverted, [
        `trellis_sql_outbox_inbox_${dialect}_v6`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
        `trellis_sql_outbox_inbox_${dialect}_v3`,
      ]);
      assert.ok(!(await columnNames(db, tables.outbox)).includes("claim_token"));
      const rows = await executor.query(
        `SELECT id, state, attempts FROM ${tables.outbox} ORDER BY id`,
        [],
      );
      assert.deepEqual(rows.map((r) => [r.id, r.state, Number(r.attempts)]), [
        ["a", "dispatched", 1],
        ["b", "claimed", 1],
        ["c", "pending", 0],
      ]);
      await migrate(executor, { dialect, tables });
      assert.equal(await outbox.markDispatched({ ...b, claimToken: undefined }, now), true);
      void base;
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: a version 3 database is upgraded to v4 in place (the key fence's table) and back`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      // A version 3 database made by the version 3 DDL (no migration record): adopted at 3.
      await migrate(executor, { dialect, tables, to: 3 });
      await executor.query(`DROP TABLE ${tables.outbox}_migrations`, []);
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
      await outbox.enqueue({ ...base, id: "k1", headers: {}, orderingKey: "k" });
      await outbox.enqueue({ ...base, id: "k2", headers: {}, orderingKey: "k" });
      await outbox.enqueue({ ...base, id: "k3", headers: {}, orderingKey: "k" });
      const result = await migrate(executor, { dialect, tables });
      assert.deepEqual(result, {
        from: 3,
        to: 6,
        applied: [
          `trellis_sql_outbox_inbox_${dialect}_v4`,
          `trellis_sql_outbox_inbox_${dialect}_v5`,
          `trellis_sql_outbox_inbox_${dialect}_v6`,
        ],
        reverted: [],
        adopted: true,
      });
      const now = new Date();
      const [k1] = await outbox.claimDue(5, now);
      assert.equal(k1.id, "k1");
      assert.equal(k1.keySequence, undefined);
      assert.equal(await outbox.markDispatched(k1, now, undefined, { sequence: 7 }), true);
      const [k2] = await outbox.claimDue(5, now);
      assert.equal(k2.keySequence, 7);
      // Down to v3 drops the key sequences and keeps every message; back up, the key is unfenced.
      assert.deepEqual((await migrate(executor, { dialect, tables, to: 3 })).reverted, [
        `trellis_sql_outbox_inbox_${dialect}_v6`,
        `trellis_sql_outbox_inbox_${dialect}_v5`,
        `trellis_sql_outbox_inbox_${dialect}_v4`,
      ]);
      assert.equal((await columnNames(db, `${tables.outbox}_keys`)).length, 0);
      assert.equal((await outbox.get("k2"))?.state, "claimed");
      await migrate(executor, { dialect, tables });
      assert.equal(await outbox.markDispatched(k2, now, undefined, { sequence: 8 }), true);
      const [k3] = await outbox.claimDue(5, now);
      assert.equal(k3.keySequence, 8);
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: a version 4 database is upgraded to v5 in place (the idle-key index) and back`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      // Made by the version 4 DDL (no migration record): adopted at 4.
      await migrate(executor, { dialect, tables, to: 4 });
      await executor.query(`DROP TABLE ${tables.outbox}_migrations`, []);
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
      await outbox.enqueue({ ...base, id: "k1", headers: {}, orderingKey: "k" });
      const old = new Date(Date.now() - 120_000);
      const [k1] = await outbox.claimDue(5, old);
      assert.equal(await outbox.markDispatched(k1, old, undefined, { sequence: 7 }), true);
      const index = () => indexCount(executor, dialect, `${tables.outbox}_key_settled_idx`);
      assert.equal(await index(), 0);
      assert.deepEqual(await migrate(executor, { dialect, tables, to: 5 }), {
        from: 4,
        to: 5,
        applied: [`trellis_sql_outbox_inbox_${dialect}_v5`],
        reverted: [],
        adopted: true,
      });
      assert.equal(await index(), 1);
      assert.equal((await outbox.get("k1"))?.state, "dispatched");
      assert.deepEqual((await migrate(executor, { dialect, tables, to: 4 })).reverted, [
        `trellis_sql_outbox_inbox_${dialect}_v5`,
      ]);
      assert.equal(await index(), 0);
      // Version 4's tables still work with this library (the index only makes prune's idle-key
      // probe cheap): the key is retired all the same.
      const pruned = await outbox.prune({ dispatchedBefore: new Date(Date.now() - 60_000) });
      assert.equal(pruned.dispatched, 1);
      await outbox.enqueue({ ...base, id: "k2", headers: {}, orderingKey: "k" });
      const [k2] = await outbox.claimDue(5, new Date());
      assert.equal(k2.keySequence, undefined);
    } finally {
      await db.close();
    }
  });

  Deno.test(`${dialect}: a version 5 database is upgraded to v6 in place (the claim index dropped) and back`, async () => {
    const db = await openDb(dialect);
    const v5 = await openDb(dialect);
    try {
      const { executor, tables } = db;
      await migrate(v5.executor, { dialect, tables: v5.tables, to: 5 });
      // Made by the version 5 DDL (no migration record): adopted at 5.
      await migrate(executor, { dialect, tables, to: 5 });
      await executor.query(`DROP TABLE ${tables.outbox}_migrations`, []);
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
      for (const id of ["a", "b", "c"]) await outbox.enqueue({ ...base, id, headers: {} });
      await outbox.enqueue({ ...base, id: "k1", headers: {}, orderingKey: "k" });
      await outbox.enqueue({ ...base, id: "k2", headers: {}, orderingKey: "k" });
      const now = new Date();
      const [a] = await outbox.claimDue(1, now);
      assert.equal(await outbox.markDispatched(a, now), true);
      const [b] = await outbox.claimDue(1, now);
      const index = () => indexCount(executor, dialect, `${tables.outbox}_claim_idx`);
      assert.equal(await index(), 1);
      const before = await outbox.stats(now);
      assert.deepEqual(await migrate(executor, { dialect, tables }), {
        from: 5,
        to: 6,
        applied: [`trellis_sql_outbox_inbox_${dialect}_v6`],
        reverted: [],
        adopted: true,
      });
      assert.equal(await index(), 0);
      // Every row kept: the same counts, and the claim made at version 5 settles.
      assert.deepEqual(await outbox.stats(now), before);
      assert.deepEqual(before, {
        pending: 3,
        claimed: 1,
        failed: 0,
        dispatched: 1,
        dead: 0,
        due: 2,
        oldestDueCreatedAt: before.oldestDueCreatedAt,
        oldestDueAgeMs: before.oldestDueAgeMs,
        blockedKeys: 0,
      });
      assert.equal(await outbox.markDispatched(b, now), true);
      assert.deepEqual((await outbox.claimDue(5, now)).map((m) => m.id), ["c", "k1"]);

      // Down to 5 creates the index again as version 2 made it: the catalog of a database
      // migrated straight to 5.
      assert.deepEqual((await migrate(executor, { dialect, tables, to: 5 })).reverted, [
        `trellis_sql_outbox_inbox_${dialect}_v6`,
      ]);
      assert.equal(await index(), 1);
      assert.deepEqual(await catalog(db), await catalog(v5));
      assert.equal((await outbox.stats(now)).claimed, 2);
    } finally {
      await db.close();
      await v5.close();
    }
  });
}

Deno.test("postgres: concurrent migrate calls serialise on the advisory lock", async () => {
  const db = await openDb("postgres");
  try {
    const results = await Promise.all([
      migrate(db.executor, { dialect: "postgres", tables: db.tables }),
      migrate(db.other, { dialect: "postgres", tables: db.tables }),
    ]);
    assert.deepEqual(results.map((r) => r.applied.length).sort(), [0, 6]);
    assert.deepEqual(results.map((r) => r.to), [6, 6]);
  } finally {
    await db.close();
  }
});

async function columnNames(db: Db, table: string): Promise<string[]> {
  const rows = db.dialect === "postgres"
    ? await db.executor.query(
      "SELECT attname AS name FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
      [table],
    )
    : await db.executor.query("SELECT name FROM pragma_table_info(?1) ORDER BY cid", [table]);
  return rows.map((row) => String(row.name));
}

/** Columns and indexes of a table set, with the table names replaced by placeholders. */
async function catalog(db: Db): Promise<unknown> {
  const normalise = (text: unknown) =>
    String(text).replaceAll(db.tables.outbox, "<outbox>").replaceAll(db.tables.inbox, "<inbox>");
  const out: Record<string, unknown> = {};
  for (
    const [label, table] of [
      ["outbox", db.tables.outbox],
      ["inbox", db.tables.inbox],
      ["keys", `${db.tables.outbox}_keys`],
    ]
  ) {
    if (db.dialect === "postgres") {
      out[`${label} columns`] = (await db.executor.query(
        "SELECT column_name, data_type, is_nullable, column_default, is_identity, identity_generation FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        [table],
      )).map((row) => JSON.stringify(row));
      out[`${label} indexes`] = (await db.executor.query(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 ORDER BY indexname",
        [table],
      )).map((row) => normalise(`${row.indexname}: ${row.indexdef}`));
      out[`${label} constraints`] = (await db.executor.query(
        "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = to_regclass($1) ORDER BY conname",
        [table],
      )).map((row) => normalise(`${row.conname}: ${row.def}`));
    } else {
      out[`${label} columns`] = (await db.executor.query(
        'SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?1) ORDER BY cid',
        [table],
      )).map((row) => JSON.stringify(row));
      out[`${label} indexes`] = (await db.executor.query(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql IS NOT NULL ORDER BY name",
        [table],
      )).map((row) => normalise(row.sql));
      out[`${label} unique`] = (await db.executor.query(
        'SELECT "unique", origin, partial FROM pragma_index_list(?1) ORDER BY origin, "unique"',
        [table],
      )).map((row) => JSON.stringify(row));
    }
  }
  return out;
}
