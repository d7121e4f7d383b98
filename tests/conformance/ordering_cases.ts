/**
 * Conformance cases for ordering keys: one head per key, claimed one at a time in enqueue
 * order; a dead head blocks its key until `unblockKey`. Part of `conformanceCases`.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { OutboxMessage, OutboxRecord } from "../../mod.ts";
import type { ConformanceCase, ConformanceFixture, OutboxStore } from "./cases.ts";
import { keyedRecord, uniqueKey } from "./records.ts";

const keyed = (
  orderingKey: string | undefined,
  overrides: Partial<OutboxRecord> = {},
): OutboxRecord => keyedRecord("ord", orderingKey, overrides);

function at(base: Date, ms: number): Date {
  return new Date(base.getTime() + ms);
}

function ids(messages: ReadonlyArray<{ id: string }>): string[] {
  return messages.map((message) => message.id);
}

async function dispatchAll(outbox: OutboxStore, claims: OutboxMessage[], now: Date) {
  for (const claim of claims) assert.equal(await outbox.markDispatched(claim, now), true);
}

function stores(fixture: ConformanceFixture): OutboxStore[] {
  return [fixture.outbox, ...(fixture.peers ?? []).map((peer) => peer.outbox)];
}

/** The ordering-key cases. */
export const orderingCases: readonly ConformanceCase[] = [
  {
    requires: "orderingKeys",
    name: "ordering keys are validated, stored, and part of a message's identity",
    async run({ outbox }) {
      const r = keyed("order-42");
      const stored = await outbox.enqueue(r);
      assert.equal(stored.orderingKey, "order-42");
      assert.equal((await outbox.get(r.id))?.orderingKey, "order-42");
      const plain = keyed(undefined);
      await outbox.enqueue(plain);
      assert.equal("orderingKey" in ((await outbox.get(plain.id)) ?? {}), false);
      assert.equal((await outbox.enqueue(r)).id, r.id, "an identical re-enqueue is accepted");
      await assert.rejects(outbox.enqueue({ ...r, orderingKey: "order-43" }), {
        name: "OutboxDuplicateIdentityError",
      });
      await assert.rejects(outbox.enqueue({ ...plain, orderingKey: "k" }), {
        name: "OutboxDuplicateIdentityError",
      });
      for (const bad of ["", " lead", "trail ", "a\nb", "x".repeat(257), "nul\u0000", 7, null]) {
        const candidate = { ...keyed(undefined), orderingKey: bad } as unknown as OutboxRecord;
        await assert.rejects(
          outbox.enqueue(candidate),
          (error: Error & { field?: string }) =>
            error.name === "OutboxValidationError" && error.field === "orderingKey",
          `ordering key ${JSON.stringify(bad)} is rejected`,
        );
        await assert.rejects(outbox.enqueueMany([keyed("fine"), candidate]), {
          name: "OutboxValidationError",
        });
        assert.equal(await outbox.get(candidate.id), undefined);
      }
      const longest = keyed("k".repeat(256));
      assert.equal((await outbox.enqueue(longest)).orderingKey, "k".repeat(256));
      const unicode = keyed("ключ/🔑:*>");
      assert.equal((await outbox.enqueue(unicode)).orderingKey, "ключ/🔑:*>");
    },
  },
  {
    requires: "orderingKeys",
    name: "a key's messages are claimed one at a time in enqueue order; other keys flow",
    async run({ outbox }) {
      const k1 = uniqueKey("k1");
      const k2 = uniqueKey("k2");
      const a1 = keyed(k1);
      const b1 = keyed(k2);
      const u1 = keyed(undefined);
      await outbox.enqueue(a1);
      await outbox.enqueueMany([b1, u1]);
      const [a2, b2, u2, a3] = [keyed(k1), keyed(k2), keyed(undefined), keyed(k1)];
      await outbox.enqueueMany([a2, b2, u2]);
      await outbox.enqueue(a3);
      const t0 = new Date();
      const first = await outbox.claimDue(10, t0);
      assert.deepEqual(ids(first), [a1.id, b1.id, u1.id, u2.id]);
      assert.deepEqual(await outbox.claimDue(10, at(t0, 1)), [], "later messages wait");
      await dispatchAll(outbox, [first[0]], at(t0, 2));
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 3))), [a2.id]);
      await dispatchAll(outbox, [first[1]], at(t0, 4));
      const next = await outbox.claimDue(10, at(t0, 5));
      assert.deepEqual(ids(next), [b2.id]);
      const stats = await outbox.stats(at(t0, 5));
      assert.equal(stats.pending, 1, "a3 is pending behind a2");
      assert.equal(stats.due, 0, "a message waiting behind its key's head is not due");
    },
  },
  {
    requires: "orderingKeys",
    name: "one enqueueMany keeps each key's order, whatever the order of its keys and ids",
    async run({ outbox }) {
      // Key names and ids sort in other orders than the batch's (a store may take its locks in
      // key or id order); kz already has a head, ka and km get theirs from the batch.
      const tag = uniqueKey("b");
      const [kz, ka, km] = [`z-${tag}`, `a-${tag}`, `m-${tag}`];
      const z0 = keyed(kz, { id: `${tag}-z0` });
      await outbox.enqueue(z0);
      const z9 = keyed(kz, { id: `${tag}-z9` });
      const a5 = keyed(ka, { id: `${tag}-a5` });
      const u3 = keyed(undefined, { id: `${tag}-u3` });
      const z1 = keyed(kz, { id: `${tag}-z1` });
      const m7 = keyed(km, { id: `${tag}-m7` });
      const a2 = keyed(ka, { id: `${tag}-a2` });
      const u0 = keyed(undefined, { id: `${tag}-u0` });
      const stored = await outbox.enqueueMany([z9, a5, u3, z1, m7, a2, u0]);
      assert.deepEqual(ids(stored), ids([z9, a5, u3, z1, m7, a2, u0]));
      const t0 = new Date();
      // Messages of different keys in one batch have no order between them (Postgres stores
      // them in key order, see docs/ordering.md): compare sets, and each key's own order.
      const first = await outbox.claimDue(10, t0);
      assert.deepEqual(ids(first).toSorted(), ids([z0, a5, u3, m7, u0]).toSorted(), "heads");
      await dispatchAll(outbox, first, at(t0, 1));
      const second = await outbox.claimDue(10, at(t0, 2));
      assert.deepEqual(ids(second).toSorted(), ids([z9, a2]).toSorted());
      await dispatchAll(outbox, second, at(t0, 3));
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 4))), ids([z1]));
    },
  },
  {
    requires: "orderingKeys",
    name: "a failed head holds its key until it is dispatched",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const [a, b] = [keyed(k), keyed(k)];
      await outbox.enqueueMany([a, b]);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(10, t0);
      assert.equal(claim.id, a.id);
      assert.equal(
        await outbox.markFailed(claim, {
          error: "nope",
          now: at(t0, 1),
          nextAttemptAt: at(t0, 5_000),
        }),
        true,
      );
      assert.deepEqual(await outbox.claimDue(10, at(t0, 1_000)), []);
      const [again] = await outbox.claimDue(10, at(t0, 5_000));
      assert.equal(again.id, a.id);
      assert.equal(again.attempts, 2);
      assert.equal(await outbox.markDispatched(again, at(t0, 5_001)), true);
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 5_002))), [b.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "an expired lease re-claims the head, never the next message of its key",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const [a, b] = [keyed(k), keyed(k)];
      await outbox.enqueueMany([a, b]);
      const t0 = new Date();
      const [stale] = await outbox.claimDue(10, t0, { leaseMs: 1_000 });
      const [fresh] = await outbox.claimDue(10, at(t0, 2_000), { leaseMs: 1_000 });
      assert.equal(fresh.id, a.id);
      assert.equal(await outbox.markDispatched(stale, at(t0, 2_001)), false);
      assert.deepEqual(await outbox.claimDue(10, at(t0, 2_002)), []);
      assert.equal(await outbox.markDispatched(fresh, at(t0, 2_003)), true);
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 2_005))), [b.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "a dead head blocks its key, is listed by blockedKeys, and the other keys flow",
    async run({ outbox }) {
      const k1 = uniqueKey("blocked");
      const k2 = uniqueKey("flowing");
      const [a1, b1, a2, b2, a3] = [keyed(k1), keyed(k2), keyed(k1), keyed(k2), keyed(k1)];
      await outbox.enqueueMany([a1, b1, a2, b2, a3]);
      assert.deepEqual(await outbox.blockedKeys(), []);
      const t0 = new Date();
      const [claimA, claimB] = await outbox.claimDue(10, t0);
      assert.equal(await outbox.markDead(claimA, { error: "poison", now: at(t0, 1) }), true);
      await dispatchAll(outbox, [claimB], at(t0, 1));
      const flowing = await outbox.claimDue(10, at(t0, 2));
      assert.deepEqual(ids(flowing), [b2.id]);
      await dispatchAll(outbox, flowing, at(t0, 3));
      assert.deepEqual(await outbox.claimDue(10, at(t0, 10_000_000)), []);
      const blocked = await outbox.blockedKeys();
      assert.deepEqual(blocked, [{
        key: k1,
        headId: a1.id,
        since: at(t0, 1).toISOString(),
        lastError: "poison",
        waiting: 2,
      }]);
      assert.deepEqual(await outbox.blockedKeys({ limit: 0 }), []);
      assert.equal((await outbox.stats()).blockedKeys, 1);
      assert.deepEqual(ids(await outbox.listDead()), [a1.id]);
      assert.equal((await outbox.get(a2.id))?.state, "pending");
      assert.equal(await outbox.unblockKey(k2, { action: "retry" }), false, "k2 is not blocked");
      assert.equal(await outbox.unblockKey("no-such-key", { action: "skip" }), false);
      await assert.rejects(
        outbox.unblockKey(k1, { action: "drop" } as unknown as { action: "skip" }),
        { name: "OutboxValidationError" },
      );
      await assert.rejects(outbox.unblockKey("", { action: "skip" }), {
        name: "OutboxValidationError",
      });
      assert.equal((await outbox.blockedKeys()).length, 1, "bad calls change nothing");
    },
  },
  {
    requires: "orderingKeys",
    name: "unblockKey retry requeues the dead head and the key resumes in order",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const [a, b] = [keyed(k), keyed(k)];
      await outbox.enqueueMany([a, b]);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(10, t0);
      assert.equal(await outbox.markDead(claim, { error: "poison", now: at(t0, 1) }), true);
      assert.equal(await outbox.unblockKey(k, { action: "retry", now: at(t0, 2) }), true);
      assert.equal(await outbox.unblockKey(k, { action: "retry", now: at(t0, 2) }), false);
      assert.deepEqual(await outbox.blockedKeys(), []);
      const requeued = await outbox.get(a.id);
      assert.equal(requeued?.state, "pending");
      assert.equal(requeued?.attempts, 0);
      const [again] = await outbox.claimDue(10, at(t0, 3));
      assert.equal(again.id, a.id);
      assert.deepEqual(await outbox.claimDue(10, at(t0, 4)), []);
      await dispatchAll(outbox, [again], at(t0, 5));
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 6))), [b.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "unblockKey skip leaves the head dead and releases the next; requeue brings it back next",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const [a, b, c] = [keyed(k), keyed(k), keyed(k)];
      await outbox.enqueueMany([a, b, c]);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(10, t0);
      assert.equal(await outbox.markDead(claim, { error: "poison", now: at(t0, 1) }), true);
      assert.equal(await outbox.unblockKey(k, { action: "skip", now: at(t0, 2) }), true);
      assert.equal(await outbox.unblockKey(k, { action: "skip", now: at(t0, 2) }), false);
      assert.deepEqual(await outbox.blockedKeys(), []);
      assert.equal((await outbox.get(a.id))?.state, "dead");
      assert.deepEqual(ids(await outbox.listDead()), [a.id]);
      const [claimB] = await outbox.claimDue(10, at(t0, 3));
      assert.equal(claimB.id, b.id);
      // The skipped message, requeued, is the key's next message (after the current head).
      assert.equal(await outbox.requeue([a.id], at(t0, 4)), 1);
      assert.deepEqual(await outbox.claimDue(10, at(t0, 5)), [], "b is still in flight");
      await dispatchAll(outbox, [claimB], at(t0, 6));
      const [claimA] = await outbox.claimDue(10, at(t0, 7));
      assert.equal(claimA.id, a.id);
      await dispatchAll(outbox, [claimA], at(t0, 8));
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 9))), [c.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "skipped messages requeued together come back in enqueue order, whatever the ids' order",
    async run({ outbox }) {
      // Behind a head in flight.
      const k = uniqueKey("k");
      const [a, b, c, d] = [keyed(k), keyed(k), keyed(k), keyed(k)];
      await outbox.enqueueMany([a, b, c, d]);
      const t0 = new Date();
      for (const [step, poison] of [a, b].entries()) {
        const [claim] = await outbox.claimDue(10, at(t0, step * 10));
        assert.equal(claim.id, poison.id);
        assert.equal(
          await outbox.markDead(claim, { error: "x", now: at(t0, step * 10 + 1) }),
          true,
        );
        assert.equal(
          await outbox.unblockKey(k, { action: "skip", now: at(t0, step * 10 + 2) }),
          true,
        );
      }
      const [claimC] = await outbox.claimDue(10, at(t0, 30));
      assert.equal(claimC.id, c.id);
      assert.equal(await outbox.requeue([a.id, b.id], at(t0, 31)), 2);
      await dispatchAll(outbox, [claimC], at(t0, 32));
      const order: string[] = [];
      for (let step = 0; step < 3; step++) {
        const claims = await outbox.claimDue(10, at(t0, 40 + step * 10));
        assert.equal(claims.length, 1, "one message of the key at a time");
        order.push(claims[0].id);
        await dispatchAll(outbox, claims, at(t0, 41 + step * 10));
      }
      assert.deepEqual(order, [a.id, b.id, d.id]);

      // Into a key without a head: the oldest becomes the head.
      const j = uniqueKey("j");
      const [e, f] = [keyed(j), keyed(j)];
      for (const [step, poison] of [e, f].entries()) {
        await outbox.enqueue(poison);
        const [claim] = await outbox.claimDue(10, at(t0, 100 + step * 10));
        assert.equal(claim.id, poison.id);
        assert.equal(
          await outbox.markDead(claim, { error: "x", now: at(t0, 101 + step * 10) }),
          true,
        );
        assert.equal(
          await outbox.unblockKey(j, { action: "skip", now: at(t0, 102 + step * 10) }),
          true,
        );
      }
      assert.equal(await outbox.requeue([f.id, e.id], at(t0, 130)), 2);
      const [first] = await outbox.claimDue(10, at(t0, 131));
      assert.equal(first?.id, e.id, "the older skipped message is the key's head");
      await dispatchAll(outbox, [first], at(t0, 132));
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 133))), [f.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "a key drained to the end takes its next message at once; skipping the last head too",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const a = keyed(k);
      await outbox.enqueue(a);
      const t0 = new Date();
      const [claimA] = await outbox.claimDue(10, t0);
      await dispatchAll(outbox, [claimA], at(t0, 1));
      const b = keyed(k);
      await outbox.enqueue(b);
      const [claimB] = await outbox.claimDue(10, at(t0, 2));
      assert.equal(claimB?.id, b.id);
      assert.equal(await outbox.markDead(claimB, { error: "x", now: at(t0, 3) }), true);
      assert.equal(await outbox.unblockKey(k, { action: "skip", now: at(t0, 4) }), true);
      const c = keyed(k);
      await outbox.enqueue(c);
      assert.deepEqual(ids(await outbox.claimDue(10, at(t0, 5))), [c.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "prune keeps the dead head of a blocked key until it is unblocked",
    async run({ outbox }) {
      const k = uniqueKey("k");
      const [a, b] = [keyed(k), keyed(k)];
      const u = keyed(undefined);
      await outbox.enqueueMany([a, b, u]);
      const t0 = new Date(Date.now() - 60_000);
      const [claimA, claimU] = await outbox.claimDue(10, t0);
      assert.equal(await outbox.markDead(claimA, { error: "x", now: at(t0, 1) }), true);
      assert.equal(await outbox.markDead(claimU, { error: "x", now: at(t0, 1) }), true);
      const pruned = await outbox.prune({ deadBefore: new Date() });
      assert.deepEqual(pruned, { dispatched: 0, dead: 1 }, "only the unkeyed dead message");
      assert.equal((await outbox.get(a.id))?.state, "dead");
      assert.equal((await outbox.blockedKeys())[0]?.headId, a.id);
      assert.equal(await outbox.unblockKey(k, { action: "skip" }), true);
      await outbox.prune({ deadBefore: new Date(Date.now() + 1_000) });
      assert.equal(await outbox.get(a.id), undefined, "a skipped head is an ordinary dead message");
      assert.deepEqual(ids(await outbox.claimDue(10, new Date())), [b.id]);
    },
  },
  {
    requires: "orderingKeys",
    name: "concurrent claimers never hold two messages of one key, and each key keeps its order",
    async run(fixture) {
      const claimers = stores(fixture);
      const keys = Array.from({ length: 8 }, (_, i) => uniqueKey(`key${i}`));
      const expected = new Map<string, string[]>(keys.map((key) => [key, []]));
      const records: OutboxRecord[] = [];
      for (let round = 0; round < 6; round++) {
        for (const key of keys) {
          const r = keyed(key);
          records.push(r);
          expected.get(key)!.push(r.id);
        }
        records.push(keyed(undefined));
      }
      await fixture.outbox.enqueueMany(records.slice(0, 20));
      for (const r of records.slice(20)) await fixture.outbox.enqueue(r);
      const inFlight = new Map<string, string>();
      const published = new Map<string, string[]>(keys.map((key) => [key, []]));
      let unkeyed = 0;
      const now = new Date();
      await Promise.all(Array.from({ length: 6 }, async (_, worker) => {
        const store = claimers[worker % claimers.length];
        let idle = 0;
        while (idle < 3) {
          const batch = await store.claimDue(3, now);
          if (batch.length === 0) {
            idle += 1;
            await new Promise((resolve) => setTimeout(resolve, 5));
            continue;
          }
          idle = 0;
          for (const message of batch) {
            const key = message.orderingKey;
            if (key === undefined) {
              unkeyed += 1;
              continue;
            }
            assert.equal(inFlight.get(key), undefined, `two messages of ${key} in flight`);
            inFlight.set(key, message.id);
            published.get(key)!.push(message.id);
          }
          await new Promise((resolve) => setTimeout(resolve, 1));
          for (const message of batch) {
            if (message.orderingKey !== undefined) inFlight.delete(message.orderingKey);
            assert.equal(await store.markDispatched(message, now), true);
          }
        }
      }));
      assert.equal(unkeyed, 6);
      assert.deepEqual(published, expected);
    },
  },
];
