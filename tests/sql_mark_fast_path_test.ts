/**
 * The SQL stores' fast mark (issue #17): a batch in which every mark is `dispatched` with a claim
 * token and nothing else to record (no outcome, no key sequence) is settled by one plain fenced
 * update of the unkeyed rows; what it leaves (superseded or already applied marks, keyed rows)
 * takes the full path. These cases pin that the result is exactly the full path's: per-mark
 * booleans, lost-reply retries, superseded claims (by token, and by attempts for claimers that
 * write no token), hand-over of keyed heads, duplicates, claims of several batches in one call.
 * Real SQLite files and real Postgres (postgres.js and node-postgres).
 */

import assert from "node:assert/strict";
import type { OutboxMark, OutboxMessage, OutboxRecord, SqlOutboxRepository } from "../mod.ts";
import type { ConformanceHarness } from "./conformance/cases.ts";
import { pgHarness, postgresJsHarness, sqliteHarness } from "./sql/harness.ts";

const t0 = new Date("2026-03-01T10:00:00.000Z");
const at = (ms: number) => new Date(t0.getTime() + ms);

function record(id: string, orderingKey?: string): OutboxRecord {
  const base: OutboxRecord = {
    id,
    kind: "event.publish",
    name: "n",
    subject: "fast.a",
    payload: "{}",
    headers: {},
  };
  return orderingKey === undefined ? base : { ...base, orderingKey };
}

const dispatched = (claim: OutboxMessage): OutboxMark => ({ claim, state: "dispatched" });

/** The outbox table's name and a raw statement runner on the repository's executor. */
function raw(outbox: SqlOutboxRepository) {
  const postgres = outbox.dialect === "postgres";
  return {
    table: outbox.tables.outbox,
    query: (text: string, params: unknown[]) =>
      outbox.executor.query(postgres ? text : text.replace(/\$(\d)/g, "?$1"), params),
  };
}

const cases: Array<{ name: string; run(outbox: SqlOutboxRepository): Promise<void> }> = [
  {
    name: "marks of two claims in one batch all apply",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b", "c", "d"].map((id) => record(id)));
      const first = await outbox.claimDue(2, t0);
      const second = await outbox.claimDue(2, t0);
      assert.notEqual(first[0].claimToken, second[0].claimToken);
      const batch = [second[1], first[0], second[0], first[1]];
      assert.deepEqual(await outbox.markMany(batch.map(dispatched), at(5)), [
        true,
        true,
        true,
        true,
      ]);
      for (const claim of batch) {
        const stored = await outbox.get(claim.id);
        assert.equal(stored?.state, "dispatched");
        assert.equal(stored?.updatedAt, at(5).toISOString());
      }
      assert.equal((await outbox.stats(at(5))).dispatched, 4);
    },
  },
  {
    name: "a retried batch (reply lost) reports the marks its claim applied as applied",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b", "c"].map((id) => record(id)));
      const claimed = await outbox.claimDue(3, t0);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(1)), [true, true, true]);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(2)), [true, true, true]);
      // The retry changed nothing.
      assert.equal((await outbox.get("a"))?.updatedAt, at(1).toISOString());
    },
  },
  {
    name: "a superseded claim's marks do not apply; the new claim's do, in the same batch",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b"].map((id) => record(id)));
      const old = await outbox.claimDue(2, t0, { leaseMs: 1_000 });
      const [again] = await outbox.claimDue(1, at(2_000)); // lease of "a" expired: claimed again
      assert.equal(again.id, "a");
      assert.deepEqual(
        await outbox.markMany(
          [dispatched(old[0]), dispatched(old[1]), dispatched(again)],
          at(3_000),
        ),
        // "a" twice in one batch: the old claim's mark first (superseded), then the new one's.
        [false, true, true],
      );
      const a = await outbox.get("a");
      assert.equal(a?.state, "dispatched");
      assert.equal(a?.attempts, 2);
    },
  },
  {
    name: "a superseded claim alone: false, and the row stays with its new claim",
    async run(outbox) {
      await outbox.enqueue(record("a"));
      const [old] = await outbox.claimDue(1, t0, { leaseMs: 1_000 });
      const [again] = await outbox.claimDue(1, at(2_000));
      assert.deepEqual(await outbox.markMany([dispatched(old)], at(3_000)), [false]);
      const a = await outbox.get("a");
      assert.equal(a?.state, "claimed");
      assert.equal(a?.claimToken, again.claimToken);
    },
  },
  {
    name: "a claim from before a requeue does not apply to the claim after it (same attempts)",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b"].map((id) => record(id)));
      const before = await outbox.claimDue(2, t0);
      assert.deepEqual(
        await outbox.markMany(before.map((claim) => ({ claim, state: "dead", error: "x" })), t0),
        [true, true],
      );
      assert.equal(await outbox.requeue(["a", "b"], at(1)), 2);
      const after = await outbox.claimDue(2, at(2));
      assert.deepEqual(after.map((m) => m.attempts), before.map((m) => m.attempts));
      assert.deepEqual(await outbox.markMany(before.map(dispatched), at(3)), [false, false]);
      assert.equal((await outbox.get("a"))?.claimToken, after[0].claimToken);
      assert.equal((await outbox.get("a"))?.state, "claimed");
      assert.deepEqual(await outbox.markMany(after.map(dispatched), at(4)), [true, true]);
    },
  },
  {
    name: "a claimer that writes no token (older version) supersedes by attempts",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b"].map((id) => record(id)));
      const claimed = await outbox.claimDue(2, t0, { leaseMs: 1_000 });
      // What an older library's claim of the expired lease leaves: attempts + 1, token kept.
      const { table, query } = raw(outbox);
      await query(`UPDATE ${table} SET attempts = attempts + 1 WHERE id = $1`, ["a"]);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(2_000)), [false, true]);
      const a = await outbox.get("a");
      assert.equal(a?.state, "claimed");
      assert.equal(a?.attempts, 2);
    },
  },
  {
    name: "one claim's rows with different attempts, one superseded by a tokenless claimer",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b", "c"].map((id) => record(id)));
      const [a1] = await outbox.claimDue(1, t0);
      await outbox.markMany([{ claim: a1, state: "failed", error: "x", nextAttemptAt: t0 }], t0);
      const claimed = await outbox.claimDue(3, at(1), { leaseMs: 1_000 });
      assert.deepEqual(claimed.map((m) => [m.id, m.attempts]), [["a", 2], ["b", 1], ["c", 1]]);
      assert.equal(new Set(claimed.map((m) => m.claimToken)).size, 1);
      const { table, query } = raw(outbox);
      await query(`UPDATE ${table} SET attempts = attempts + 1 WHERE id = $1`, ["c"]);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(2)), [true, true, false]);
      assert.equal((await outbox.get("a"))?.state, "dispatched");
      assert.equal((await outbox.get("c"))?.state, "claimed");
    },
  },
  {
    name: "a previous failure's error and retry time are cleared by the dispatch",
    async run(outbox) {
      await outbox.enqueue(record("a"));
      const [first] = await outbox.claimDue(1, t0);
      assert.deepEqual(
        await outbox.markMany([{
          claim: first,
          state: "failed",
          error: "busy",
          nextAttemptAt: at(10),
        }], at(1)),
        [true],
      );
      const [second] = await outbox.claimDue(1, at(20));
      assert.equal(second.lastError, "busy");
      assert.deepEqual(await outbox.markMany([dispatched(second)], at(30)), [true]);
      const a = await outbox.get("a");
      assert.equal(a?.state, "dispatched");
      assert.equal(a?.lastError, undefined);
      assert.equal(a?.nextAttemptAt, undefined);
      assert.equal(a?.attempts, 2);
    },
  },
  {
    name: "keyed heads marked without a sequence hand over to their next message at once",
    async run(outbox) {
      await outbox.enqueueMany([
        record("k1-1", "k1"),
        record("k1-2", "k1"),
        record("u1"),
        record("k2-1", "k2"),
      ]);
      const claimed = await outbox.claimDue(10, t0);
      // No order between keys, or keyed and unkeyed messages, in one batch (docs/ordering.md).
      assert.deepEqual(claimed.map((m) => m.id).toSorted(), ["k1-1", "k2-1", "u1"]);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(1)), [true, true, true]);
      // Handed over in markMany itself, not left for the next claim.
      const { table, query } = raw(outbox);
      const heads = await query(
        `SELECT id FROM ${table} WHERE key_head AND ordering_key IS NOT NULL ORDER BY id`,
        [],
      );
      assert.deepEqual(heads.map((row) => row.id), ["k1-2"]);
      const next = await outbox.claimDue(10, at(2));
      assert.deepEqual(next.map((m) => m.id), ["k1-2"]);
      assert.deepEqual(await outbox.markMany(next.map(dispatched), at(3)), [true]);
    },
  },
  {
    name:
      "one claim's batch partly applied by the fast mark: a retried mark, a new one, a keyed one",
    async run(outbox) {
      await outbox.enqueueMany([record("a"), record("b"), record("k-1", "k"), record("k-2", "k")]);
      const claimed = await outbox.claimDue(10, t0);
      const byId = new Map(claimed.map((claim) => [claim.id, claim]));
      assert.deepEqual([...byId.keys()].toSorted(), ["a", "b", "k-1"]);
      assert.deepEqual(await outbox.markMany([dispatched(byId.get("a")!)], at(1)), [true]);
      // "a" was applied before (a retry), "b" is applied by the fast mark, "k-1" (keyed) by the
      // full path, which hands its key over.
      const batch = ["k-1", "a", "b"].map((id) => dispatched(byId.get(id)!));
      assert.deepEqual(await outbox.markMany(batch, at(2)), [true, true, true]);
      assert.equal((await outbox.get("a"))?.updatedAt, at(1).toISOString());
      assert.equal((await outbox.get("b"))?.updatedAt, at(2).toISOString());
      assert.equal((await outbox.get("k-1"))?.state, "dispatched");
      assert.deepEqual((await outbox.claimDue(10, at(3))).map((m) => m.id), ["k-2"]);
    },
  },
  {
    name:
      "one claim's unkeyed batch partly applied by the one-claim fast mark: a retried mark, a new one",
    async run(outbox) {
      await outbox.enqueueMany([record("a"), record("b"), record("c")]);
      const claimed = await outbox.claimDue(10, t0);
      assert.deepEqual(await outbox.markMany([dispatched(claimed[0])], at(1)), [true]);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(2)), [true, true, true]);
      assert.equal((await outbox.get("a"))?.updatedAt, at(1).toISOString());
      assert.equal((await outbox.get("b"))?.updatedAt, at(2).toISOString());
      assert.equal((await outbox.get("c"))?.updatedAt, at(2).toISOString());
    },
  },
  {
    name: "the same mark twice in one batch: both true, applied once",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b"].map((id) => record(id)));
      const [a, b] = await outbox.claimDue(2, t0);
      assert.deepEqual(
        await outbox.markMany([dispatched(a), dispatched(b), dispatched(a)], at(1)),
        [true, true, true],
      );
      assert.equal((await outbox.stats(at(1))).dispatched, 2);
    },
  },
  {
    name: "ids that are object keys of JavaScript (__proto__, constructor) are marked",
    async run(outbox) {
      await outbox.enqueueMany(["__proto__", "constructor", "toString"].map((id) => record(id)));
      const claimed = await outbox.claimDue(3, t0);
      assert.deepEqual(await outbox.markMany(claimed.map(dispatched), at(1)), [true, true, true]);
      for (const id of ["__proto__", "constructor", "toString"]) {
        assert.equal((await outbox.get(id))?.state, "dispatched");
      }
    },
  },
  {
    name: "marks with a wrong token or an unknown id are false, the others apply",
    async run(outbox) {
      await outbox.enqueueMany(["a", "b"].map((id) => record(id)));
      const [a, b] = await outbox.claimDue(2, t0);
      assert.deepEqual(
        await outbox.markMany([
          dispatched({ ...a, claimToken: "not-the-token" }),
          dispatched({ ...b, id: "nobody" }),
          dispatched(b),
        ], at(1)),
        [false, false, true],
      );
      assert.equal((await outbox.get("a"))?.state, "claimed");
    },
  },
];

for (const harness of [sqliteHarness, postgresJsHarness, pgHarness] as ConformanceHarness[]) {
  for (const testCase of cases) {
    Deno.test(`${harness.name} fast mark: ${testCase.name}`, async () => {
      const fixture = await harness.open();
      try {
        await testCase.run(fixture.outbox as SqlOutboxRepository);
      } finally {
        await fixture.close();
      }
    });
  }
}
