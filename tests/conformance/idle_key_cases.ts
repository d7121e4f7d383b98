/**
 * Conformance cases for idle-key retirement: `prune` with `dispatchedBefore` forgets the
 * per-key state (the key fence's sequence) of an ordering key with no unsettled message and no
 * message dispatched since the cutoff, so that state does not grow with every key ever used. A
 * retired key's next message is its first again (no `keySequence`) and flows in order; a key
 * that is not idle keeps its state. Part of `conformanceCases`.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { OutboxMessage, OutboxRecord } from "../../mod.ts";
import type { ConformanceCase, OutboxStore } from "./cases.ts";
import { keyedRecord, uniqueKey } from "./records.ts";

const keyed = (orderingKey: string | undefined): OutboxRecord => keyedRecord("idle", orderingKey);

function at(base: Date, ms: number): Date {
  return new Date(base.getTime() + ms);
}

/** Claims and checks that exactly `expected` (ids, any order) came back. */
async function claimExactly(
  outbox: OutboxStore,
  expected: string[],
  now: Date,
): Promise<Map<string, OutboxMessage>> {
  const claimed = await outbox.claimDue(10, now);
  assert.deepEqual(claimed.map((message) => message.id).sort(), [...expected].sort());
  return new Map(claimed.map((message) => [message.id, message]));
}

/** Enqueues `record`, claims it alone and marks it dispatched with `sequence` at `now`. */
async function dispatchOne(
  outbox: OutboxStore,
  record: OutboxRecord,
  now: Date,
  sequence: number,
): Promise<void> {
  await outbox.enqueue(record);
  const claim = (await claimExactly(outbox, [record.id], now)).get(record.id)!;
  assert.equal(await outbox.markDispatched(claim, now, undefined, { sequence }), true);
}

/** The idle-key cases. */
export const idleKeyCases: readonly ConformanceCase[] = [
  {
    requires: "idleKeys",
    name:
      "prune retires an idle dispatched key; its next message is its first again and flows in order",
    async run({ outbox }) {
      const now = new Date();
      const old = at(now, -120_000);
      const cutoff = at(now, -60_000);
      const idle = uniqueKey("idle");
      const recent = uniqueKey("recent");
      const a1 = keyed(idle);
      const b1 = keyed(recent);
      await dispatchOne(outbox, a1, old, 7);
      await dispatchOne(outbox, b1, at(now, -1_000), 50);
      const pruned = await outbox.prune({ dispatchedBefore: cutoff, deadBefore: cutoff });
      assert.deepEqual(pruned, { dispatched: 1, dead: 0 }, "a1's row is pruned, b1's kept");
      assert.equal(await outbox.get(a1.id), undefined);
      const [a2, a3, b2] = [keyed(idle), keyed(idle), keyed(recent)];
      await outbox.enqueueMany([a2, a3, b2]);
      const first = await claimExactly(outbox, [a2.id, b2.id], now);
      assert.equal(first.get(a2.id)!.keySequence, undefined, "the retired key starts over");
      assert.equal(first.get(b2.id)!.keySequence, 50, "dispatched after the cutoff: kept");
      assert.deepEqual(await outbox.claimDue(10, at(now, 1)), [], "a3 waits behind a2");
      assert.equal(
        await outbox.markDispatched(first.get(a2.id)!, at(now, 2), undefined, { sequence: 8 }),
        true,
      );
      const next = await claimExactly(outbox, [a3.id], at(now, 3));
      assert.equal(next.get(a3.id)!.keySequence, 8, "the key is fenced again from a2 on");
      // Pruning again with the same cutoff changes nothing for keys in use.
      assert.deepEqual(await outbox.prune({ dispatchedBefore: cutoff }), {
        dispatched: 0,
        dead: 0,
      });
    },
  },
  {
    requires: "idleKeys",
    name:
      "prune keeps the state of a key that is not idle: a dead head, a pending or failed head, waiting messages",
    async run({ outbox }) {
      const now = new Date();
      const old = at(now, -120_000);
      const cutoff = at(now, -60_000);
      // A pending head (never claimed) with a message waiting behind it.
      const pendingKey = uniqueKey("pending");
      const [c0, c1, c2] = [keyed(pendingKey), keyed(pendingKey), keyed(pendingKey)];
      await dispatchOne(outbox, c0, old, 5);
      // A failed head, retried after the prune.
      const failedKey = uniqueKey("failed");
      const [f0, f1] = [keyed(failedKey), keyed(failedKey)];
      await dispatchOne(outbox, f0, old, 3);
      await outbox.enqueue(f1);
      const f1Claim = (await claimExactly(outbox, [f1.id], old)).get(f1.id)!;
      assert.equal(
        await outbox.markFailed(f1Claim, { error: "x", now: old, nextAttemptAt: at(now, 10) }),
        true,
      );
      // A dead head blocking its key, with a message waiting.
      const deadKey = uniqueKey("dead");
      const [d1, d2] = [keyed(deadKey), keyed(deadKey)];
      await outbox.enqueue(d1);
      const d1Claim = (await claimExactly(outbox, [d1.id], old)).get(d1.id)!;
      assert.equal(await outbox.markDead(d1Claim, { error: "poison", now: old }), true);
      await outbox.enqueueMany([c1, c2, d2]);

      const pruned = await outbox.prune({ dispatchedBefore: cutoff, deadBefore: cutoff });
      assert.deepEqual(pruned, { dispatched: 2, dead: 0 }, "c0 and f0; the dead head stays");
      assert.equal((await outbox.get(d1.id))?.state, "dead");
      assert.deepEqual((await outbox.blockedKeys()).map((key) => [key.key, key.waiting]), [
        [deadKey, 1],
      ]);

      const heads = await claimExactly(outbox, [c1.id], now);
      assert.equal(heads.get(c1.id)!.keySequence, 5, "a key with a pending head keeps it");
      const retried = await claimExactly(outbox, [f1.id], at(now, 10));
      assert.equal(retried.get(f1.id)!.keySequence, 3, "a key with a failed head keeps it");
      assert.equal(await outbox.markDispatched(heads.get(c1.id)!, at(now, 11)), true);
      assert.equal(
        (await claimExactly(outbox, [c2.id], at(now, 12))).get(c2.id)!.keySequence,
        5,
        "the waiting message is next",
      );
      assert.equal(await outbox.unblockKey(deadKey, { action: "retry", now: at(now, 13) }), true);
      const again = await claimExactly(outbox, [d1.id], at(now, 14));
      assert.equal(await outbox.markDispatched(again.get(d1.id)!, at(now, 15)), true);
      await claimExactly(outbox, [d2.id], at(now, 16));
    },
  },
];
