/**
 * The fence and every timestamp the library reads back must not depend on the session's
 * DateStyle or TimeZone (issue #14 item 3). Each driver connects with a European or US
 * DateStyle and a non-UTC zone set as connection options (nothing changes on the shared
 * server), and the claim time is after the 12th of a month, where a day-month mix-up is an
 * invalid date rather than a wrong one.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import {
  migrate,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";

const sessions = [
  { dateStyle: "SQL, DMY", timeZone: "Europe/Berlin" },
  { dateStyle: "German", timeZone: "Asia/Kolkata" },
  { dateStyle: "Postgres, MDY", timeZone: "America/New_York" },
];

interface Driver {
  name: string;
  open(
    url: string,
    dateStyle: string,
    timeZone: string,
  ): { executor: SqlExecutor; end(): Promise<void> };
}

const drivers: Driver[] = [
  {
    name: "postgres.js",
    open(url, dateStyle, timeZone) {
      const sql = postgres(url, {
        max: 2,
        onnotice: () => {},
        connection: { DateStyle: dateStyle, TimeZone: timeZone },
      });
      return { executor: postgresJsExecutor(sql), end: () => sql.end() };
    },
  },
  {
    name: "node-postgres",
    open(url, dateStyle, timeZone) {
      const pool = new pg.Pool({
        connectionString: url,
        max: 2,
        options: `-c DateStyle=${dateStyle.replace(" ", "")} -c TimeZone=${timeZone}`,
      });
      return { executor: pgExecutor(pool), end: () => pool.end() };
    },
  },
];

for (const driver of drivers) {
  for (const { dateStyle, timeZone } of sessions) {
    Deno.test(`${driver.name}, DateStyle '${dateStyle}', TimeZone ${timeZone}: claims settle and timestamps read back exactly`, async () => {
      const url = await postgresUrl();
      const { executor, end } = driver.open(url, dateStyle, timeZone);
      const tables = uniqueTables();
      try {
        const [session] = await executor.query(
          "SELECT current_setting('DateStyle') AS ds, current_setting('TimeZone') AS tz",
          [],
        );
        assert.ok(String(session.ds).startsWith(dateStyle.split(",")[0]), String(session.ds));
        assert.equal(session.tz, timeZone);
        await migrate(executor, { dialect: "postgres", tables });
        const outbox = new SqlOutboxRepository(executor, "postgres", tables);
        const enqueued = await outbox.enqueueMany(
          ["a", "b", "c"].map((id) => ({
            id,
            kind: "event.publish" as const,
            name: "n",
            subject: "s.a",
            payload: "{}",
            headers: {},
          })),
        );
        // The 25th: day and month cannot be swapped into a valid date.
        const now = new Date("2026-03-25T22:40:05.123Z");
        const claimed = await outbox.claimDue(3, now, { leaseMs: 30_000 });
        assert.deepEqual(claimed.map((m) => m.id), ["a", "b", "c"]);
        for (const message of claimed) {
          assert.equal(message.updatedAt, now.toISOString());
          assert.equal(message.nextAttemptAt, "2026-03-25T22:40:35.123Z");
          assert.equal(message.createdAt, enqueued.find((m) => m.id === message.id)?.createdAt);
        }
        const [a, b, c] = claimed;
        const later = new Date("2026-03-25T22:40:06.000Z");
        const retryAt = new Date("2026-04-13T01:02:03.004Z");
        assert.deepEqual(
          await outbox.markMany([
            { claim: a, state: "dispatched" },
            { claim: b, state: "failed", error: "busy", nextAttemptAt: retryAt },
            { claim: c, state: "dead", error: "no" },
          ], later),
          [true, true, true],
        );
        const failed = await outbox.get("b");
        assert.equal(failed?.state, "failed");
        assert.equal(failed?.nextAttemptAt, retryAt.toISOString());
        assert.equal(failed?.updatedAt, later.toISOString());
        assert.equal((await outbox.get("a"))?.state, "dispatched");
        const stats = await outbox.stats(new Date("2026-05-14T00:00:00.000Z"));
        assert.equal(stats.due, 1);
        assert.equal(stats.oldestDueCreatedAt, enqueued[1].createdAt);
        // A claim made with the legacy (timestamp) fence still settles: the lease is compared
        // in SQL, never decoded by the driver.
        const [again] = await outbox.claimDue(1, new Date("2026-05-14T00:00:00.000Z"));
        assert.equal(again.id, "b");
        assert.equal(
          await outbox.markDispatched(
            { id: again.id, attempts: again.attempts, nextAttemptAt: again.nextAttemptAt },
            new Date("2026-05-14T00:00:01.000Z"),
          ),
          true,
        );
      } finally {
        await dropPostgresTables(executor, tables).catch(() => {});
        await end();
      }
    });
  }
}
