/**
 * Ordering keys on Postgres under concurrent transactions (READ COMMITTED), with real
 * connections: an enqueue still in flight when its key's head is settled is never orphaned; two
 * transactions that both find a key without a head do not both make one; a batch keeps its
 * order when its first row loses that race; a hand-over interrupted after the mark is finished
 * by the next claim; many producers and claimers keep every key in order and lose nothing.
 */

import assert from "node:assert/strict";
// @ts-types="@types/pg"
import pg from "pg";
import {
  type OutboxMessage,
  type OutboxRecord,
  pgExecutor,
  postgresJsExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { type Db, open } from "./sql/ordering_db.ts";

let n = 0;
function keyed(key: string, id?: string): OutboxRecord {
  n += 1;
  return {
    id: id ?? `m-${n}`,
    kind: "event.publish",
    name: "n",
    subject: "s.a",
    payload: JSON.stringify({ n }),
    headers: {},
    orderingKey: key,
  };
}

/** Runs `work` in a transaction that stays open until `release()`. */
function openTransaction(db: Db, work: (outbox: SqlOutboxRepository) => Promise<unknown>) {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => release = resolve);
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => entered = resolve);
  const done = db.sql.begin(async (tx) => {
    const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", db.tables);
    const result = work(outbox);
    // `work` may block on a lock: report "inside" once it ran or after a short while.
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([result, new Promise((resolve) => timer = setTimeout(resolve, 300))]);
    clearTimeout(timer);
    entered();
    await result;
    await gate;
  });
  return { inside, release, done };
}

async function dispatchOne(
  outbox: SqlOutboxRepository,
  now = new Date(),
): Promise<OutboxMessage[]> {
  const claimed = await outbox.claimDue(10, now);
  for (const message of claimed) assert.equal(await outbox.markDispatched(message, now), true);
  return claimed;
}

Deno.test("postgres ordering: an enqueue in flight while its key's head is dispatched is not orphaned", async () => {
  const db = await open();
  try {
    await db.outbox.enqueue(keyed("k", "a1"));
    const [head] = await db.outbox.claimDue(10, new Date());
    assert.equal(head.id, "a1");
    // a2 is enqueued (seeing a1 as the head) but not committed while a1 is settled.
    const tx = openTransaction(db, (outbox) => outbox.enqueue(keyed("k", "a2")));
    await tx.inside;
    assert.equal(await db.outbox.markDispatched(head, new Date()), true);
    assert.deepEqual(await db.outbox.claimDue(10, new Date()), [], "a2 is not committed yet");
    tx.release();
    await tx.done;
    // The key still has its head (a1, whose hand-over waited for a2): the claim hands over.
    const next = await db.outbox.claimDue(10, new Date());
    assert.deepEqual(next.map((m) => m.id), ["a2"]);
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering: two transactions enqueueing the first message of a key make one head", async () => {
  const db = await open();
  try {
    const first = openTransaction(db, (outbox) => outbox.enqueue(keyed("k", "b1")));
    await first.inside;
    // The second waits for the first on the unique head index, then queues behind b1.
    const second = openTransaction(db, (outbox) => outbox.enqueue(keyed("k", "b2")));
    await second.inside;
    first.release();
    await first.done;
    second.release();
    await second.done;
    assert.deepEqual((await dispatchOne(db.outbox)).map((m) => m.id), ["b1"]);
    assert.deepEqual((await dispatchOne(db.outbox)).map((m) => m.id), ["b2"]);
    assert.deepEqual(await dispatchOne(db.outbox), []);
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering: a batch whose first row loses the head race keeps its order", async () => {
  const db = await open();
  try {
    const first = openTransaction(db, (outbox) => outbox.enqueue(keyed("k", "c0")));
    await first.inside;
    const batch = openTransaction(
      db,
      (outbox) => outbox.enqueueMany([keyed("k", "c1"), keyed("other", "o1"), keyed("k", "c2")]),
    );
    await batch.inside;
    first.release();
    await first.done;
    batch.release();
    await batch.done;
    const order: string[] = [];
    for (let i = 0; i < 5; i++) {
      order.push(...(await dispatchOne(db.outbox)).map((m) => m.id).filter((id) => id !== "o1"));
    }
    assert.deepEqual(order, ["c0", "c1", "c2"]);
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering: a hand-over left undone after the mark is finished by the next claim", async () => {
  const db = await open();
  try {
    await db.outbox.enqueue(keyed("k", "d1"));
    const [head] = await db.outbox.claimDue(10, new Date());
    await db.outbox.enqueue(keyed("k", "d2"));
    // A repository whose executor cannot open the hand-over's transaction marks d1 and stops
    // there, as a process that dies between the two would.
    const noTransaction: SqlExecutor = { query: (text, params) => db.executor.query(text, params) };
    const crippled = new SqlOutboxRepository(noTransaction, "postgres", db.tables);
    // d2 committed before the mark: the mark hands over in its own statement.
    assert.equal(await crippled.markDispatched(head, new Date()), true);
    const [d2] = await db.outbox.claimDue(10, new Date());
    assert.equal(d2.id, "d2");
    // Now with nothing behind the head: the mark leaves the head for the hand-over to clear.
    assert.equal(await crippled.markDispatched(d2, new Date()), true);
    assert.equal(
      (await db.sql.unsafe(
        `SELECT count(*)::int AS n FROM ${db.tables.outbox} WHERE key_head AND state = 'dispatched'`,
      ))[0].n,
      1,
      "d2 is still the head",
    );
    await db.outbox.enqueue(keyed("k", "d3"));
    assert.deepEqual((await db.outbox.claimDue(10, new Date())).map((m) => m.id), ["d3"]);
  } finally {
    await db.close();
  }
});

Deno.test("postgres ordering: producers in transactions and claimers on two drivers keep every key in order", async () => {
  const db = await open();
  const pool = new pg.Pool({ connectionString: await postgresUrl(), max: 4 });
  try {
    const claimers = [
      db.outbox,
      new SqlOutboxRepository(pgExecutor(pool), "postgres", db.tables),
    ];
    const keys = ["k0", "k1", "k2", "k3", "k4"];
    const perProducer = 30;
    const producers = 4;
    // Each producer commits its messages one transaction at a time, so for one producer and one
    // key, commit order is enqueue order; a transaction holds its rows a little while.
    const committed = new Map<string, string[]>();
    const produce = async (p: number) => {
      for (let i = 0; i < perProducer; i++) {
        const key = keys[(p + i) % keys.length];
        const records = [keyed(key, `p${p}-${i}-a`), keyed(key, `p${p}-${i}-b`)];
        await db.sql.begin(async (tx) => {
          const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", db.tables);
          if (i % 2 === 0) await outbox.enqueueMany(records);
          else for (const record of records) await outbox.enqueue(record);
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 5));
        });
        const list = committed.get(`${p}/${key}`) ?? [];
        list.push(...records.map((r) => r.id));
        committed.set(`${p}/${key}`, list);
      }
    };
    const published: OutboxMessage[] = [];
    const inFlight = new Set<string>();
    let producing = true;
    const claim = async (outbox: SqlOutboxRepository) => {
      while (true) {
        const batch = await outbox.claimDue(7, new Date());
        if (batch.length === 0) {
          if (!producing) {
            const stats = await outbox.stats();
            if (stats.pending + stats.claimed + stats.failed === 0) return;
          }
          await new Promise((resolve) => setTimeout(resolve, 3));
          continue;
        }
        for (const message of batch) {
          assert.ok(!inFlight.has(message.orderingKey!), `two of ${message.orderingKey} in flight`);
          inFlight.add(message.orderingKey!);
          published.push(message);
        }
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 3));
        for (const message of batch) inFlight.delete(message.orderingKey!);
        const marks = batch.map((claim) => ({ claim, state: "dispatched" as const }));
        assert.ok((await outbox.markMany(marks, new Date())).every(Boolean));
      }
    };
    const claiming = [claim(claimers[0]), claim(claimers[1]), claim(claimers[0])];
    await Promise.all(Array.from({ length: producers }, (_, p) => produce(p)));
    producing = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      Promise.all(claiming),
      new Promise((_, reject) =>
        timer = setTimeout(
          () => reject(new Error("messages left undispatched (orphaned?)")),
          30_000,
        )
      ),
    ]).finally(() => clearTimeout(timer));
    assert.equal(published.length, producers * perProducer * 2);
    assert.equal(new Set(published.map((m) => m.id)).size, published.length);
    // Per producer and key, the publish order is the commit order.
    for (const [producerKey, ids] of committed) {
      const [p, key] = producerKey.split("/");
      const seen = published
        .filter((m) => m.orderingKey === key && m.id.startsWith(`p${p}-`))
        .map((m) => m.id);
      assert.deepEqual(seen, ids, producerKey);
    }
  } finally {
    await pool.end();
    await db.close();
  }
});
