/**
 * SQLite's one-claim fast mark once returned a row per changed row, not the ids; when fewer rows
 * came back than marks (a keyed message in the batch, which the fast mark leaves to the full path,
 * or a mark superseded by another relay's claim), markMany asked `markApplied` which marks
 * applied. A row the fast mark had just dispatched and that a concurrent prune (retention 0)
 * deleted before that question was then reported as not applied, though the mark applied: the
 * dispatcher counted it `superseded` and skipped `onDispatched`. The fast mark now returns the ids
 * it changed. Real SQLite file; the prune runs on a second connection right after the fast mark.
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

/**
 * A relay repository on a fresh SQLite file, a peer repository on a second connection to it, and
 * `pruneNext()`: after the relay's next UPDATE that changed rows, the peer prunes (retention 0)
 * before the relay's next statement.
 */
async function withRacingPrune(
  run: (
    relay: { outbox: SqlOutboxRepository; peer: SqlOutboxRepository; pruneNext(): void },
  ) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "outbox_counted_race_" });
  const db = openSqlite(`${dir}/outbox.db`);
  const peerDb = openSqlite(`${dir}/outbox.db`);
  try {
    const base = nodeSqliteExecutor(db);
    await migrate(base, { dialect: "sqlite" });
    const peer = new SqlOutboxRepository(nodeSqliteExecutor(peerDb), "sqlite");
    let pruneNext = false;
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
    await run({ outbox, peer, pruneNext: () => pruneNext = true });
  } finally {
    peerDb.close();
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("sqlite: a dispatched mark pruned right after it applied is still reported applied", async () => {
  await withRacingPrune(async ({ outbox, pruneNext }) => {
    await outbox.enqueueMany([record("a"), record("k-1", "k")]);
    const claimed = await outbox.claimDue(10, t0);
    assert.deepEqual(claimed.map((m) => m.id), ["a", "k-1"]);
    pruneNext();
    const results = await outbox.markMany(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(t0.getTime() + 1),
    );
    assert.equal(await outbox.get("a"), undefined); // the prune did run after "a" applied
    assert.deepEqual(results, [true, true]);
  });
});

Deno.test("sqlite: a dispatched mark pruned right after it applied is reported applied next to a superseded mark of the same claim", async () => {
  await withRacingPrune(async ({ outbox, peer, pruneNext }) => {
    await outbox.enqueueMany([record("b"), record("a")]);
    const claimed = await outbox.claimDue(10, t0, { leaseMs: 1_000 });
    assert.deepEqual(claimed.map((m) => m.id), ["b", "a"]);
    // The lease ran out and another relay took "b" (the oldest): this claim's mark of "b" is
    // superseded, its mark of "a" (one claim token for both) still applies.
    const taken = await peer.claimDue(1, new Date(t0.getTime() + 2_000));
    assert.deepEqual(taken.map((m) => m.id), ["b"]);
    pruneNext();
    const results = await outbox.markMany(
      claimed.map((claim) => ({ claim, state: "dispatched" as const })),
      new Date(t0.getTime() + 1),
    );
    assert.equal(await outbox.get("a"), undefined); // the prune did run after "a" applied
    assert.deepEqual(results, [false, true]);
    assert.equal((await outbox.get("b"))?.state, "claimed"); // the peer's claim is untouched
  });
});
