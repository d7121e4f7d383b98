/**
 * Ordering keys on Postgres: races between operator actions and the dispatcher, found in review
 * (real server, READ COMMITTED). Each test holds one side's transaction open at the moment that
 * matters, so the interleaving is deterministic.
 */

import assert from "node:assert/strict";
import type postgres from "postgres";
import { type OutboxRecord, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { keyedRecord } from "./conformance/records.ts";
import { heldExecutor } from "./sql/held_executor.ts";
import { type Db, open } from "./sql/ordering_db.ts";

const keyed = (key: string, id: string): OutboxRecord => keyedRecord(id, key, { id });

/** Resolves once some session of this database waits for a row lock. */
async function someoneWaitsForALock(sql: postgres.Sql): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const rows =
      await sql`SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || ${"key_head"} || '%'`;
    if (rows.length > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error("no session ever waited for a lock");
}

async function deadHead(db: Db, key: string, id: string): Promise<void> {
  await db.outbox.enqueue(keyed(key, id));
  const [head] = await db.outbox.claimDue(10, new Date());
  assert.equal(head.id, id);
  assert.equal(await db.outbox.markDead(head, { error: "poison", now: new Date() }), true);
  assert.deepEqual((await db.outbox.blockedKeys()).map((b) => b.key), [key]);
}

Deno.test("postgres ordering race: requeue of a dead head racing a skip of its key does not strand it without a head", async () => {
  const db = await open();
  try {
    await deadHead(db, "k", "k1");
    const held = heldExecutor(db.executor);
    const skipper = new SqlOutboxRepository(held.executor, "postgres", db.tables);
    // The skip has left k1 (the key now has no head) but has not committed...
    const skip = skipper.unblockKey("k", { action: "skip" });
    await held.worked;
    // ...when a requeue of k1 starts: it reads k1 as the key's head, then waits for k1's lock.
    const requeue = db.outbox.requeue(["k1"]);
    await someoneWaitsForALock(db.sql);
    held.commit();
    assert.equal(await skip, true);
    assert.equal(await requeue, 1);
    // k1 is pending again; the key has no other message, so k1 must be its head and claimable.
    const claimed = await db.outbox.claimDue(10, new Date());
    assert.deepEqual(claimed.map((m) => m.id), ["k1"], "k1 is pending but no claim can take it");
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering race: requeue of a dead head racing a skip that promoted its successor queues it behind that successor", async () => {
  const db = await open();
  try {
    await deadHead(db, "k", "k1");
    await db.outbox.enqueue(keyed("k", "k2"));
    const held = heldExecutor(db.executor);
    const skipper = new SqlOutboxRepository(held.executor, "postgres", db.tables);
    const skip = skipper.unblockKey("k", { action: "skip" });
    await held.worked;
    const requeue = db.outbox.requeue(["k1"]);
    await someoneWaitsForALock(db.sql);
    held.commit();
    assert.equal(await skip, true);
    assert.equal(await requeue, 1);
    // One head (k2, promoted by the skip); k1 waits behind it.
    assert.deepEqual((await db.outbox.claimDue(10, new Date())).map((m) => m.id), ["k2"]);
    const [k2] = await db.outbox.claimDue(10, new Date(Date.now() + 3_600_000));
    assert.equal(k2.id, "k2");
    assert.equal(await db.outbox.markDispatched(k2, new Date()), true);
    assert.deepEqual(
      (await db.outbox.claimDue(10, new Date(Date.now() + 7_200_000))).map((m) => m.id),
      ["k1"],
    );
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering race: an enqueue in flight across two hand-overs of its key is not orphaned", async () => {
  const db = await open();
  let commit!: () => void;
  const gate = new Promise<void>((resolve) => commit = resolve);
  let tx: Promise<unknown> | undefined;
  try {
    await db.outbox.enqueueMany([keyed("k", "k1"), keyed("k", "k2")]);
    const t0 = new Date();
    const [k1] = await db.outbox.claimDue(10, t0);
    assert.equal(k1.id, "k1");
    // k3 is enqueued in a transaction that saw k1 as the key's head, and stays open...
    let enqueued!: () => void;
    const inside = new Promise<void>((resolve) => enqueued = resolve);
    tx = db.sql.begin(async (sql) => {
      const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", db.tables);
      await outbox.enqueue(keyed("k", "k3"));
      enqueued();
      await gate;
    });
    await inside;
    // ...while k1 is dispatched and, if the key hands over to k2 now, k2 (the key's last
    // visible message) is dispatched too.
    const published = ["k1"];
    assert.equal(await db.outbox.markDispatched(k1, t0), true);
    for (const message of await db.outbox.claimDue(10, t0)) {
      published.push(message.id);
      assert.equal(await db.outbox.markDispatched(message, t0), true);
    }
    commit();
    await tx;
    for (let round = 0; round < 5; round++) {
      for (const message of await db.outbox.claimDue(10, t0)) {
        published.push(message.id);
        assert.equal(await db.outbox.markDispatched(message, t0), true);
      }
    }
    assert.deepEqual(published, ["k1", "k2", "k3"], "k3 was left pending behind no head");
  } finally {
    commit();
    await tx?.catch(() => {});
    await db.close();
  }
});

// Regression: a stale head used to be handed over only when no enqueue held it FOR KEY SHARE, and
// every enqueue of the key locks it, so a key whose enqueue transactions overlapped without a gap
// stopped (6 producers holding 30 ms transactions on one key: ~590 enqueued, 1-2 dispatched in 4 s).
Deno.test("postgres ordering race: a key whose enqueues overlap without a gap still hands over to its committed messages", async () => {
  const db = await open();
  const gates: Array<() => void> = [];
  const txs: Promise<unknown>[] = [];
  /** Enqueues `id` in a transaction that stays open until its gate opens. */
  async function enqueueHeld(id: string): Promise<() => Promise<void>> {
    let commit!: () => void;
    const gate = new Promise<void>((resolve) => commit = resolve);
    gates.push(commit);
    let enqueued!: () => void;
    const inside = new Promise<void>((resolve) => enqueued = resolve);
    const tx = db.sql.begin(async (sql) => {
      const outbox = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", db.tables);
      await outbox.enqueue(keyed("hot", id));
      enqueued();
      await gate;
    });
    txs.push(tx);
    await inside;
    return async () => {
      commit();
      await tx;
    };
  }
  try {
    await db.outbox.enqueue(keyed("hot", "h1"));
    const t0 = new Date();
    const [h1] = await db.outbox.claimDue(10, t0);
    const commitH2 = await enqueueHeld("h2");
    assert.equal(await db.outbox.markDispatched(h1, t0), true);
    // Producers overlap: h3's transaction starts before h2's commits, and so on.
    const commitH3 = await enqueueHeld("h3");
    await commitH2();
    // h2 is committed and h1 is dispatched: h2 is due, though h3 is still in flight.
    const claimed = await db.outbox.claimDue(10, t0);
    assert.deepEqual(
      claimed.map((m) => m.id),
      ["h2"],
      "the key waits for a moment without enqueues",
    );
    await commitH3();
  } finally {
    for (const commit of gates) commit();
    await Promise.allSettled(txs);
    await db.close();
  }
});
