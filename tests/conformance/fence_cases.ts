/**
 * Conformance cases for the broker-side key fence's store half (#18): a keyed message's claim
 * carries its key's last stream sequence (`keySequence`), recorded by the `sequence` of the
 * dispatched mark that settled the key's previous message. Part of `conformanceCases`.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { OutboxMessage, OutboxRecord } from "../../mod.ts";
import type { ConformanceCase, OutboxStore } from "./cases.ts";
import { keyedRecord, uniqueKey } from "./records.ts";

const keyed = (orderingKey: string | undefined): OutboxRecord => keyedRecord("fence", orderingKey);

function at(base: Date, ms: number): Date {
  return new Date(base.getTime() + ms);
}

/** Claims exactly one message and checks it is `id`. */
async function claimOne(outbox: OutboxStore, id: string, now: Date): Promise<OutboxMessage> {
  const claimed = await outbox.claimDue(10, now);
  assert.deepEqual(claimed.map((message) => message.id), [id]);
  return claimed[0];
}

/** The key-fence cases. */
export const fenceCases: readonly ConformanceCase[] = [
  {
    requires: "keyFence",
    name: "key fence: a keyed claim carries the sequence its key's previous message was stored at",
    async run({ outbox }) {
      const key = uniqueKey("seq");
      const [a, b, c] = [keyed(key), keyed(key), keyed(key)];
      const plain = keyed(undefined);
      for (const record of [a, b, c, plain]) await outbox.enqueue(record);
      const t0 = new Date();
      const first = await outbox.claimDue(10, t0);
      assert.deepEqual(first.map((message) => message.id).sort(), [a.id, plain.id].sort());
      for (const message of first) {
        assert.equal("keySequence" in message, false, "first of its key / unkeyed: no sequence");
      }
      const claimA = first.find((message) => message.id === a.id)!;
      const claimPlain = first.find((message) => message.id === plain.id)!;
      assert.deepEqual(
        await outbox.markMany!([
          { claim: claimA, state: "dispatched", sequence: 41 },
          { claim: claimPlain, state: "dispatched", sequence: 42 },
        ], t0),
        [true, true],
      );
      const claimB = await claimOne(outbox, b.id, at(t0, 1));
      assert.equal(claimB.keySequence, 41);
      assert.equal(
        await outbox.markDispatched(claimB, at(t0, 1), undefined, { sequence: 77 }),
        true,
      );
      const claimC = await claimOne(outbox, c.id, at(t0, 2));
      assert.equal(claimC.keySequence, 77, "markDispatched's sequence counts the same");
      assert.equal("keySequence" in ((await outbox.get(plain.id)) ?? {}), false);
    },
  },
  {
    requires: "keyFence",
    name:
      "key fence: the key sequence outlives its message's row (prune) and is read per key, not from history",
    async run({ outbox }) {
      const key = uniqueKey("long");
      const old = keyed(key);
      const job = keyed(key);
      await outbox.enqueue(old);
      await outbox.enqueue(job);
      const t0 = new Date();
      const claim = await claimOne(outbox, old.id, t0);
      assert.equal(await outbox.markDispatched(claim, t0, undefined, { sequence: 9 }), true);
      // The key stays in use after the prune's cutoff (a job: no sequence, the key keeps 9), so
      // prune does not retire it (idle_key_cases.ts), but the row of the message is pruned.
      const jobClaim = await claimOne(outbox, job.id, at(t0, 1));
      assert.equal(jobClaim.keySequence, 9);
      assert.equal(await outbox.markDispatched(jobClaim, at(t0, 70_000)), true);
      assert.equal((await outbox.prune({ dispatchedBefore: at(t0, 60_000) })).dispatched, 1);
      assert.equal(await outbox.get(old.id), undefined);
      for (let i = 0; i < 3; i++) {
        const other = keyed(uniqueKey("other"));
        await outbox.enqueue(other);
        const otherClaim = await claimOne(outbox, other.id, at(t0, 10 + i));
        await outbox.markDispatched(otherClaim, at(t0, 10 + i), undefined, { sequence: 100 + i });
      }
      const next = keyed(key);
      await outbox.enqueue(next);
      const nextClaim = await claimOne(outbox, next.id, at(t0, 100));
      assert.equal(nextClaim.keySequence, 9);
    },
  },
  {
    requires: "keyFence",
    name:
      "key fence: a dispatched mark without sequence keeps it, failed keeps it, dead forgets it",
    async run({ outbox }) {
      const key = uniqueKey("rules");
      const records = [keyed(key), keyed(key), keyed(key), keyed(key)];
      for (const record of records) await outbox.enqueue(record);
      const t0 = new Date();
      const c0 = await claimOne(outbox, records[0].id, t0);
      await outbox.markMany!([{ claim: c0, state: "dispatched", sequence: 5 }], t0);
      // A job (no sequence): the stream did not move.
      const c1 = await claimOne(outbox, records[1].id, at(t0, 1));
      assert.equal(c1.keySequence, 5);
      await outbox.markMany!([{ claim: c1, state: "dispatched", outcome: { ok: true } }], t0);
      const c2 = await claimOne(outbox, records[2].id, at(t0, 2));
      assert.equal(c2.keySequence, 5, "dispatched without sequence keeps it");
      assert.equal(
        await outbox.markFailed(c2, { error: "timeout", nextAttemptAt: at(t0, 3), now: at(t0, 2) }),
        true,
      );
      const c2again = await claimOne(outbox, records[2].id, at(t0, 4));
      assert.equal(c2again.keySequence, 5, "failed keeps it");
      assert.equal(
        await outbox.markDead(c2again, { error: "key_fence: conflict", now: at(t0, 4) }),
        true,
      );
      assert.equal(await outbox.unblockKey(key, { action: "retry", now: at(t0, 5) }), true);
      const retried = await claimOne(outbox, records[2].id, at(t0, 6));
      assert.equal("keySequence" in retried, false, "dead forgot it: the retry is unfenced");
      await outbox.markMany!([{ claim: retried, state: "dispatched", sequence: 12 }], at(t0, 6));
      const c3 = await claimOne(outbox, records[3].id, at(t0, 7));
      assert.equal(c3.keySequence, 12, "relearned from the retried message's PubAck");
    },
  },
  {
    requires: "keyFence",
    name: "key fence: a skip after a dead head releases the next message without a sequence",
    async run({ outbox }) {
      const key = uniqueKey("skip");
      const records = [keyed(key), keyed(key), keyed(key)];
      for (const record of records) await outbox.enqueue(record);
      const t0 = new Date();
      const c0 = await claimOne(outbox, records[0].id, t0);
      await outbox.markDispatched(c0, t0, undefined, { sequence: 3 });
      const c1 = await claimOne(outbox, records[1].id, at(t0, 1));
      assert.equal(c1.keySequence, 3);
      await outbox.markMany!([{ claim: c1, state: "dead", error: "key_fence" }], at(t0, 1));
      assert.equal(await outbox.unblockKey(key, { action: "skip", now: at(t0, 2) }), true);
      const c2 = await claimOne(outbox, records[2].id, at(t0, 3));
      assert.equal("keySequence" in c2, false);
    },
  },
  {
    requires: "keyFence",
    name: "key fence: a replayed or superseded dispatched mark does not change the key sequence",
    async run({ outbox }) {
      const key = uniqueKey("fenced");
      const records = [keyed(key), keyed(key), keyed(key)];
      for (const record of records) await outbox.enqueue(record);
      const t0 = new Date();
      // A zombie: claimed, lease expired, claimed again by another claim.
      const stale = await claimOne(outbox, records[0].id, t0);
      const fresh = await claimOne(outbox, records[0].id, at(t0, 60_000));
      assert.deepEqual(
        await outbox.markMany!(
          [{ claim: fresh, state: "dispatched", sequence: 20 }],
          at(t0, 60_001),
        ),
        [true],
      );
      // The same claim's replay (a lost reply) with another sequence, and the zombie's mark.
      assert.deepEqual(
        await outbox.markMany!([
          { claim: fresh, state: "dispatched", sequence: 999 },
          { claim: stale, state: "dispatched", sequence: 998 },
        ], at(t0, 60_002)),
        [true, false],
      );
      assert.equal(
        await outbox.markDispatched(stale, at(t0, 60_002), undefined, { sequence: 997 }),
        false,
      );
      const c1 = await claimOne(outbox, records[1].id, at(t0, 60_003));
      assert.equal(c1.keySequence, 20);
      // A superseded dead mark does not forget it either.
      const c1b = await claimOne(outbox, records[1].id, at(t0, 200_000));
      assert.equal(await outbox.markDead(c1, { error: "late", now: at(t0, 200_001) }), false);
      assert.equal(c1b.keySequence, 20);
      await outbox.markDispatched(c1b, at(t0, 200_002), undefined, { sequence: 21 });
      const c2 = await claimOne(outbox, records[2].id, at(t0, 200_003));
      assert.equal(c2.keySequence, 21);
    },
  },
  {
    requires: "keyFence",
    name: "key fence: an invalid sequence is refused before any mark applies",
    async run({ outbox }) {
      const key = uniqueKey("bad");
      const [a, b] = [keyed(key), keyed(undefined)];
      await outbox.enqueue(a);
      await outbox.enqueue(b);
      const t0 = new Date();
      const claimed = await outbox.claimDue(10, t0);
      const claimA = claimed.find((message) => message.id === a.id)!;
      const claimB = claimed.find((message) => message.id === b.id)!;
      for (const bad of [0, -1, 1.5, Number.NaN, Number.MAX_SAFE_INTEGER + 1, "7", null]) {
        await assert.rejects(
          outbox.markMany!([
            { claim: claimB, state: "dispatched" },
            { claim: claimA, state: "dispatched", sequence: bad as number },
          ], t0),
          (error: Error & { field?: string }) =>
            error.name === "OutboxValidationError" && error.field === "sequence",
          `sequence ${String(bad)} is refused`,
        );
        await assert.rejects(
          outbox.markDispatched(claimA, t0, undefined, { sequence: bad as number }),
          { name: "OutboxValidationError" },
        );
      }
      assert.equal((await outbox.get(a.id))?.state, "claimed", "nothing applied");
      assert.equal((await outbox.get(b.id))?.state, "claimed", "nothing applied");
      // A sequence on an unkeyed message is accepted and ignored.
      assert.deepEqual(
        await outbox.markMany!([
          { claim: claimB, state: "dispatched", sequence: 8 },
          { claim: claimA, state: "dispatched", sequence: Number.MAX_SAFE_INTEGER },
        ], t0),
        [true, true],
      );
      const next = keyed(key);
      await outbox.enqueue(next);
      assert.equal(
        (await claimOne(outbox, next.id, at(t0, 1))).keySequence,
        Number.MAX_SAFE_INTEGER,
      );
    },
  },
];
