/**
 * What a claim returns is the stored row as the claim left it (issue #17). A claim (SQLite and
 * Postgres) returns only the columns it did not write itself (`state`, `updated_at`,
 * `next_attempt_at` and `claim_token` are its own parameters, filled in by the repository);
 * SQLite's asks whether hand-overs are due in a statement of its own: each claimed message must
 * still equal `get()` of its id
 * (first claims, retries that keep their last error, keyed messages with their key sequence),
 * and a dispatched head left to hand over is still handed over by the next claim. Real SQLite
 * files and real Postgres (postgres.js and node-postgres).
 */

import assert from "node:assert/strict";
import type { OutboxMessage, OutboxRecord, SqlOutboxRepository } from "../mod.ts";
import type { ConformanceHarness } from "./conformance/cases.ts";
import { pgHarness, postgresJsHarness, sqliteHarness } from "./sql/harness.ts";

const t0 = new Date("2026-03-01T10:00:00.000Z");
const at = (ms: number) => new Date(t0.getTime() + ms);

function record(id: string, extra: Partial<OutboxRecord> = {}): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "n",
    subject: "rows.a",
    payload: `{"id":"${id}"}`,
    headers: {},
    ...extra,
  };
}

/** Each claimed message equals what `get()` reads (the key sequence aside: claims only). */
async function assertStored(outbox: SqlOutboxRepository, claimed: OutboxMessage[]) {
  for (const message of claimed) {
    const { keySequence: _, ...rest } = message;
    assert.deepEqual(rest, await outbox.get(message.id), message.id);
  }
}

const cases: Array<{ name: string; run(outbox: SqlOutboxRepository): Promise<void> }> = [
  {
    name: "claimed messages are the stored rows, first claims and retries",
    async run(outbox) {
      await outbox.enqueueMany([
        record("a"),
        record("b", { headers: { "x-trace": "1", other: "two" } }),
        record("c", { orderingKey: "k" }),
      ]);
      // Keyed and unkeyed messages of one batch have no order between them (Postgres stores a
      // batch's keyed rows first, in key order: docs/ordering.md): sorted by id here.
      const first = (await outbox.claimDue(10, at(10), { leaseMs: 5_000 }))
        .toSorted((x, y) => x.id.localeCompare(y.id));
      assert.deepEqual(first.map((message) => message.id), ["a", "b", "c"]);
      for (const message of first) {
        assert.equal(message.state, "claimed");
        assert.equal(message.attempts, 1);
        assert.equal(message.updatedAt, at(10).toISOString());
        assert.equal(message.nextAttemptAt, at(5_010).toISOString());
        assert.equal(message.claimToken, first[0].claimToken);
      }
      assert.deepEqual(first[1].headers, { "x-trace": "1", other: "two" });
      await assertStored(outbox, first);
      const [a, b, c] = first;
      assert.deepEqual(
        await outbox.markMany([
          { claim: a, state: "failed", error: "boom", nextAttemptAt: at(20) },
          { claim: b, state: "dispatched" },
          { claim: c, state: "dispatched", sequence: 7 },
        ], at(15)),
        [true, true, true],
      );
      await outbox.enqueue(record("d", { orderingKey: "k" }));
      const second = await outbox.claimDue(10, at(30), { leaseMs: 1_000 });
      assert.deepEqual(second.map((message) => message.id), ["a", "d"]);
      assert.equal(second[0].attempts, 2);
      assert.equal(second[0].lastError, "boom");
      assert.equal(second[1].keySequence, 7);
      assert.equal(second[1].orderingKey, "k");
      assert.notEqual(second[0].claimToken, a.claimToken);
      await assertStored(outbox, second);
      // A lease that expired is claimed again with the new claim's values.
      const third = await outbox.claimDue(10, at(2_000), { leaseMs: 3_000 });
      assert.deepEqual(third.map((message) => message.id), ["a", "d"]);
      assert.equal(third[0].attempts, 3);
      assert.equal(third[0].nextAttemptAt, at(5_000).toISOString());
      await assertStored(outbox, third);
    },
  },
  {
    name: "a dispatched head left to hand over is handed over by the next claim",
    async run(outbox) {
      await outbox.enqueueMany([record("h", { orderingKey: "k" })]);
      const [head] = await outbox.claimDue(10, at(1));
      await outbox.enqueue(record("n", { orderingKey: "k" }));
      // A mark whose hand-over did not happen (a process that died in between): the head stays
      // the key's head while dispatched.
      const table = outbox.tables.outbox;
      const postgres = outbox.dialect === "postgres";
      await outbox.executor.query(
        `UPDATE ${table} SET state = 'dispatched', next_attempt_at = NULL WHERE id = ${
          postgres ? "$1" : "?1"
        }`,
        [head.id],
      );
      // The claim finds other rows too: the hand-over must not depend on it finding none.
      await outbox.enqueue(record("u"));
      const claimed = await outbox.claimDue(10, at(2));
      assert.deepEqual(claimed.map((message) => message.id), ["n", "u"]);
      await assertStored(outbox, claimed);
    },
  },
];

for (const harness of [sqliteHarness, postgresJsHarness, pgHarness] as ConformanceHarness[]) {
  for (const testCase of cases) {
    Deno.test(`${harness.name} claimed rows: ${testCase.name}`, async () => {
      const fixture = await harness.open();
      try {
        await testCase.run(fixture.outbox as SqlOutboxRepository);
      } finally {
        await fixture.close();
      }
    });
  }
}
