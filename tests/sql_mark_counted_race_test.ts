/**
 * SQLite's one-claim fast mark returns a row per changed row, not the ids; when fewer rows come
 * back than marks (here: a keyed message in the batch, which the fast mark leaves to the full
 * path), markMany asks `markApplied` which marks applied. A row the fast mark just dispatched and
 * that a concurrent prune (retention 0) deletes before that question is then reported as not
 * applied, though the mark applied: the dispatcher counts it `superseded` and skips
 * `onDispatched`. Real SQLite file; the prune runs on a second connection between the two
 * statements.
 */

import assert from "node:assert/strict";
import {
  migrate,
  nodeSqliteExecutor,
  type OutboxRecord,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { openSqlite } from "./sql/harness.ts";

const t0 = new Date("2026-03-01T10:00:00.000Z");

function record(id: string, orderingKey?: string): OutboxRecord {
  const base: OutboxRecord = {
    id,
    kind: "event.publish",
    name: "n",
    subject: "race.a",
    payload: "{}",
    headers: {},
  };
  return orderingKey === undefined ? base : { ...base, orderingKey };
}

Deno.test("sqlite: a dispatched mark pruned right after it applied is still reported applied", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_counted_race_" });
  const db = openSqlite(`${dir}/outbox.db`);
  const peerDb = openSqlite(`${dir}/outbox.db`);
  try {
    const base = nodeSqliteExecutor(db);
    await migrate(base, { dialect: "sqlite" });
    const peer = new SqlOutboxRepository(nodeSqliteExecutor(peerDb), "sqlite");
    let pruneNext = false;
    // The relay's executor; after the first mark statement that changed rows, a concurrent
    // prune (retention 0) runs before the next statement.
    const executor: SqlExecutor = {
      ...base,
      async query(text, params) {
        const rows = await base.query(text, params);
        if (pruneNext && /^UPDATE/.test(text) && rows.length > 0) {
          pruneNext = false;
          await peer.prune({ dispatchedBefore: new Date(t0.getTime() + 10_000) });
        }
        return rows;
      },
    };
    const outbox = new SqlOutboxRepository(executor, "sqlite");
    await outbox.enqueueMany([record("a"), record("k-1", "k")]);
    const claimed = await outbox.claimDue(10, t0);
    assert.deepEqual(claimed.map((m) => m.id), ["a", "k-1"]);
    pruneNext = true;
    const results = await outbox.markMany(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(t0.getTime() + 1),
    );
    assert.equal(await outbox.get("a"), undefined); // the prune did run after "a" applied
    assert.deepEqual(results, [true, true]);
  } finally {
    peerDb.close();
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
