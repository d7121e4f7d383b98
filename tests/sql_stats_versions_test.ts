/**
 * `stats` across the schema versions a rolling upgrade mixes: this library's statement on version
 * 5 tables (not migrated yet: the claim index still there) and on version 6 tables (dropped),
 * and the previous release's statement (a relay not upgraded yet) on both, count the same rows:
 * pending heads, rows waiting behind their key's head, claimed and failed rows due or not, the
 * oldest due from either side, dispatched, dead, and a key blocked by a dead head.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  migrate,
  nodeSqliteExecutor,
  type OutboxStats,
  postgresJsExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";
import { previousStatsSql } from "./sql/previous_stats.ts";

const t0 = Date.parse("2026-06-01T12:00:00.000Z");
const at = (seconds: number) => new Date(t0 + seconds * 1_000).toISOString();

// id, state, created (s from t0), next_attempt_at (s), ordering key, key head
const rows: Array<[string, string, number, number | null, string | null, boolean]> = [
  ["u1", "pending", -100, null, null, true],
  ["ka1", "pending", -50, null, "a", true],
  ["ka2", "pending", -40, null, "a", false],
  ["ka3", "pending", -30, null, "a", false],
  ["c1", "claimed", -200, 30, null, true], // lease live
  ["c2", "claimed", -300, -1, null, true], // lease expired: due
  ["f1", "failed", -400, 60, null, true], // retry later
  ["f2", "failed", -150, -5, null, true], // retry due
  ["d1", "dispatched", -900, null, null, true],
  ["d2", "dispatched", -800, null, null, true],
  ["kc1", "dispatched", -700, null, "c", true], // a head whose hand-over is still to do
  ["kc2", "pending", -20, null, "c", false],
  ["x1", "dead", -600, null, null, true],
  ["kb1", "dead", -500, null, "b", true], // blocks key b
  ["kb2", "pending", -10, null, "b", false],
];

const counts = { pending: 6, claimed: 2, failed: 2, dispatched: 3, dead: 2, blockedKeys: 1 };

function expected(now: number, due: number, oldest: number): OutboxStats {
  return {
    ...counts,
    due,
    oldestDueCreatedAt: at(oldest),
    oldestDueAgeMs: (now - oldest) * 1_000,
  };
}

// At t0 the oldest due is an expired lease (the retry side); 10 s earlier neither c2 nor f2 is
// due, and it is a pending head.
const cases: Array<[number, OutboxStats]> = [
  [0, expected(0, 4, -300)],
  [-10, expected(-10, 2, -100)],
];

interface Db {
  executor: SqlExecutor;
  tables: SqlOutboxTables;
  close(): Promise<void>;
}

async function openDb(dialect: SqlDialect): Promise<Db> {
  const tables = uniqueTables();
  if (dialect === "sqlite") {
    const dir = await Deno.makeTempDir({ prefix: "outbox_stats_" });
    const db = openSqlite(`${dir}/app.db`);
    return {
      executor: nodeSqliteExecutor(db),
      tables,
      async close() {
        db.close();
        await Deno.remove(dir, { recursive: true });
      },
    };
  }
  const sql = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const executor = postgresJsExecutor(sql);
  return {
    executor,
    tables,
    async close() {
      try {
        await dropPostgresTables(executor, tables);
      } finally {
        await sql.end();
      }
    },
  };
}

/** The previous release's `stats`, decoded as it decoded it (OutboxStats). */
async function previousStats(
  db: Db,
  dialect: SqlDialect,
  now: Date,
): Promise<OutboxStats> {
  const [row] = await db.executor.query(previousStatsSql(dialect, db.tables.outbox), [
    now.toISOString(),
  ]);
  const stats: OutboxStats = {
    pending: Number(row.pending),
    claimed: Number(row.claimed),
    failed: Number(row.failed),
    dispatched: Number(row.dispatched),
    dead: Number(row.dead),
    due: Number(row.due),
    blockedKeys: Number(row.blocked_keys),
  };
  if (row.oldest_due !== null) {
    stats.oldestDueCreatedAt = String(row.oldest_due);
    stats.oldestDueAgeMs = now.getTime() - Date.parse(String(row.oldest_due));
  }
  return stats;
}

for (const dialect of ["sqlite", "postgres"] as const) {
  Deno.test(`${dialect}: stats counts the same on version 5 and 6 tables, and so does the previous release's`, async () => {
    const db = await openDb(dialect);
    try {
      const { executor, tables } = db;
      await migrate(executor, { dialect, tables, to: 5 });
      const p = (n: number) => dialect === "postgres" ? `$${n}::timestamptz` : `?${n}`;
      for (const [id, state, created, next, key, head] of rows) {
        await executor.query(
          `INSERT INTO ${tables.outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, ordering_key, key_head) VALUES ('${id}', 'event.publish', 'n', 's', '{}', '{}', '${state}', 1, ${
            p(1)
          }, ${p(1)}, ${p(2)}, ${key === null ? "NULL" : `'${key}'`}, ${head ? "TRUE" : "FALSE"})`,
          [at(created), next === null ? null : at(next)],
        );
      }
      const outbox = new SqlOutboxRepository(executor, dialect, tables);
      const check = async (version: number) => {
        for (const [seconds, stats] of cases) {
          const now = new Date(t0 + seconds * 1_000);
          assert.deepEqual(await outbox.stats(now), stats, `version ${version}, now ${seconds}s`);
          assert.deepEqual(
            await previousStats(db, dialect, now),
            stats,
            `the previous release's stats, version ${version}, now ${seconds}s`,
          );
        }
      };
      await check(5);
      assert.equal((await migrate(executor, { dialect, tables })).to, 6);
      await check(6);
      await migrate(executor, { dialect, tables, to: 5 });
      await check(5);
    } finally {
      await db.close();
    }
  });
}
