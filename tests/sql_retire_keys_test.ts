/**
 * Idle-key retirement (prune with dispatchedBefore, retire_keys.ts) racing the dispatcher on real
 * Postgres (READ COMMITTED) and a real SQLite file. Each Postgres test holds one side's
 * transaction open at the moment that matters, so the interleaving is chosen, not timed.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { type OutboxRecord, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { keyedRecord } from "./conformance/records.ts";
import { heldExecutor } from "./sql/held_executor.ts";
import { type Db, open } from "./sql/ordering_db.ts";
import { migrate, nodeSqliteExecutor } from "../mod.ts";
import { openSqlite } from "./sql/harness.ts";
import { retireKeyStatements } from "../src/stores/sql/retire_keys.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";

const keyed = (key: string, id: string): OutboxRecord => keyedRecord(id, key, { id });

const old = () => new Date(Date.now() - 120_000);
const cutoff = () => new Date(Date.now() - 60_000);

/** Enqueues, claims and dispatches `id` (sequence `sequence`) long ago. */
async function dispatchedLongAgo(db: Db, key: string, id: string, sequence: number) {
  await db.outbox.enqueue(keyed(key, id));
  const [claim] = await db.outbox.claimDue(10, old());
  assert.equal(claim.id, id);
  assert.equal(await db.outbox.markDispatched(claim, old(), undefined, { sequence }), true);
}

async function keyRows(db: Db): Promise<string[]> {
  const rows = await db.sql.unsafe(`SELECT ordering_key FROM ${db.tables.outbox}_keys`);
  return rows.map((row) => String(row.ordering_key));
}

/** A transaction on its own connection that runs `work`, then waits for `commit()`. */
function openTransaction(db: Db, work: (outbox: SqlOutboxRepository) => Promise<void>) {
  let commit!: (rollback?: boolean) => void;
  const gate = new Promise<boolean | undefined>((resolve) => commit = resolve);
  let ready!: () => void;
  const worked = new Promise<void>((resolve) => ready = resolve);
  const done = db.sql.begin(async (sql) => {
    await work(new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", db.tables));
    ready();
    if (await gate) throw new Error("rolled back on purpose");
  }).catch((error) => {
    if (!String(error).includes("on purpose")) throw error;
  });
  return { worked, commit, done };
}

/**
 * Whether a session waits for a lock in a statement on this test's tables (the server is shared;
 * statement texts are truncated there, but the table name comes early in ours).
 */
async function waitsForLock(db: Db): Promise<boolean> {
  const rows = await db.sql.unsafe(
    `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND position($1 in query) > 0`,
    [db.tables.outbox],
  );
  return rows.length > 0;
}

Deno.test("postgres retire keys: a key whose next message is enqueued, claimed and marked in a transaction still open keeps the sequence that mark writes", async () => {
  const db = await open();
  try {
    await dispatchedLongAgo(db, "k", "k1", 7);
    // The other side: k2 enqueued, claimed and dispatched with sequence 9, not yet committed
    // (it holds the key row it upserted). In the retirement's snapshot the key is idle.
    const other = openTransaction(db, async (outbox) => {
      await outbox.enqueue(keyed("k", "k2"));
      const [claim] = await outbox.claimDue(10, new Date());
      assert.equal(claim.id, "k2");
      assert.equal(
        await outbox.markDispatched(claim, new Date(), undefined, { sequence: 9 }),
        true,
      );
    });
    await other.worked;
    let pruned = false;
    const prune = db.outbox.prune({ dispatchedBefore: cutoff() }).finally(() => pruned = true);
    // Either the prune finishes without waiting (it skips the locked key row), or it waits for
    // that row's lock (a single DELETE would, then delete the row the mark wrote).
    while (!pruned && !(await waitsForLock(db))) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    other.commit();
    await other.done;
    assert.equal((await prune).dispatched, 1);
    await db.outbox.enqueue(keyed("k", "k3"));
    const [k3] = await db.outbox.claimDue(10, new Date());
    assert.equal(k3.id, "k3");
    assert.equal(k3.keySequence, 9, "the sequence written by k2's mark was deleted");
  } finally {
    await db.close();
  }
});

Deno.test("postgres retire keys: a mark of the key while the retirement holds its key rows waits, then writes its sequence", async () => {
  const db = await open();
  try {
    await dispatchedLongAgo(db, "k", "k1", 7);
    const held = heldExecutor(db.executor);
    const pruner = new SqlOutboxRepository(held.executor, "postgres", db.tables);
    const prune = pruner.prune({ dispatchedBefore: cutoff() });
    // The key row is deleted, not committed.
    await Promise.race([
      held.worked,
      prune.then(() => assert.fail("the prune ran no retirement transaction")),
    ]);
    let mark: { promise: Promise<boolean> } | undefined;
    try {
      mark = await racingMark(db);
    } finally {
      held.commit();
    }
    assert.equal((await prune).dispatched, 1);
    assert.equal(await mark!.promise, true);
    assert.deepEqual(await keyRows(db), ["k"]);
    await db.outbox.enqueue(keyed("k", "k3"));
    const [k3] = await db.outbox.claimDue(10, new Date());
    assert.equal(k3.keySequence, 9);
  } finally {
    await db.close();
  }
});

/** Enqueues, claims and marks k2 until its mark waits for a lock; `promise` is the mark. */
async function racingMark(db: Db): Promise<{ promise: Promise<boolean> }> {
  await db.outbox.enqueue(keyed("k", "k2"));
  const [claim] = await db.outbox.claimDue(10, new Date());
  assert.equal(claim.id, "k2");
  assert.equal(claim.keySequence, 7, "the retirement has not committed");
  const mark = db.outbox.markDispatched(claim, new Date(), undefined, { sequence: 9 });
  for (let i = 0; !(await waitsForLock(db)); i++) {
    assert.ok(i < 500, "the mark never waited for the key row");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return { promise: mark };
}

Deno.test("postgres retire keys: an enqueue of the key in flight during the retirement is its key's head and flows (unfenced)", async () => {
  const db = await open();
  try {
    await dispatchedLongAgo(db, "k", "k1", 7);
    const other = openTransaction(db, async (outbox) => {
      await outbox.enqueue(keyed("k", "k2"));
    });
    await other.worked;
    const pruned = await db.outbox.prune({ dispatchedBefore: cutoff() }).finally(() =>
      other.commit()
    );
    await other.done;
    assert.equal(pruned.dispatched, 1);
    assert.deepEqual(await keyRows(db), [], "the key was idle as far as the prune could see");
    await db.outbox.enqueue(keyed("k", "k3"));
    const [k2] = await db.outbox.claimDue(10, new Date());
    assert.equal(k2.id, "k2", "k2 is its key's head");
    assert.equal(k2.keySequence, undefined);
    assert.deepEqual(await db.outbox.claimDue(10, new Date()), [], "k3 waits behind k2");
    assert.equal(await db.outbox.markDispatched(k2, new Date(), undefined, { sequence: 10 }), true);
    const [k3] = await db.outbox.claimDue(10, new Date());
    assert.equal(k3.id, "k3");
    assert.equal(k3.keySequence, 10);
  } finally {
    await db.close();
  }
});

Deno.test("postgres retire keys: a dispatched head whose hand-over is still to do is handed over by prune, then pruned and its key retired", async () => {
  const db = await open();
  try {
    await db.outbox.enqueue(keyed("k", "k1"));
    const [k1] = await db.outbox.claimDue(10, old());
    // An enqueue of the key in flight (later rolled back) keeps k1's hand-over from leaving the
    // key without a head: k1 stays its key's (dispatched) head.
    const other = openTransaction(db, async (outbox) => {
      await outbox.enqueue(keyed("k", "k-rolled-back"));
    });
    await other.worked;
    assert.equal(await db.outbox.markDispatched(k1, old(), undefined, { sequence: 7 }), true);
    other.commit(true);
    await other.done;
    const [head] = await db.sql.unsafe(
      `SELECT key_head FROM ${db.tables.outbox} WHERE id = 'k1'`,
    );
    assert.equal(head.key_head, true, "k1's hand-over is still to do");
    assert.equal((await db.outbox.prune({ dispatchedBefore: cutoff() })).dispatched, 1);
    assert.deepEqual(await keyRows(db), []);
    await db.outbox.enqueue(keyed("k", "k2"));
    const [k2] = await db.outbox.claimDue(10, new Date());
    assert.equal(k2.id, "k2");
    assert.equal(k2.keySequence, undefined);
  } finally {
    await db.close();
  }
});

Deno.test("postgres retire keys: a stale head with a waiting successor is handed over by prune; the key keeps its sequence", async () => {
  const db = await open();
  try {
    await db.outbox.enqueue(keyed("k", "k1"));
    const [k1] = await db.outbox.claimDue(10, old());
    const other = openTransaction(db, async (outbox) => {
      await outbox.enqueue(keyed("k", "k2"));
    });
    await other.worked;
    assert.equal(await db.outbox.markDispatched(k1, old(), undefined, { sequence: 7 }), true);
    other.commit();
    await other.done;
    assert.equal((await db.outbox.prune({ dispatchedBefore: cutoff() })).dispatched, 1);
    assert.deepEqual(await keyRows(db), ["k"]);
    const [k2] = await db.outbox.claimDue(10, new Date());
    assert.equal(k2.id, "k2");
    assert.equal(k2.keySequence, 7);
  } finally {
    await db.close();
  }
});

Deno.test("postgres retire keys: two pruners at once with enqueues of the same keys: idle keys retired, every message flows once in order", async () => {
  const db = await open();
  try {
    const keys = Array.from({ length: 150 }, (_, i) => `key-${i}`);
    for (const [i, key] of keys.entries()) {
      await db.outbox.enqueue(keyed(key, `${key}-a`));
      const [claim] = await db.outbox.claimDue(10, old());
      await db.outbox.markDispatched(claim, old(), undefined, { sequence: i + 1 });
    }
    const busy = keys.filter((_, i) => i % 3 === 0);
    const results = await Promise.all([
      db.outbox.prune({ dispatchedBefore: cutoff(), batchSize: 37 }),
      new SqlOutboxRepository(db.executor, "postgres", db.tables).prune({
        dispatchedBefore: cutoff(),
        batchSize: 10,
      }),
      (async () => {
        for (const key of busy) await db.outbox.enqueue(keyed(key, `${key}-b`));
      })(),
    ]);
    assert.equal(results[0]!.dispatched + results[1]!.dispatched, keys.length);
    await db.outbox.prune({ dispatchedBefore: cutoff() });
    // Every idle key is retired. A busy key stays when its second message was enqueued before a
    // pruner reached it (then it is not idle); that race is the point of the test.
    const kept = await keyRows(db);
    assert.deepEqual(kept.filter((key) => !busy.includes(key)), []);
    for (const key of busy) await db.outbox.enqueue(keyed(key, `${key}-c`));
    const order = new Map<string, string[]>();
    for (let round = 0; round < 4; round++) {
      const claims = await db.outbox.claimDue(500, new Date());
      const seen = new Set<string>();
      for (const claim of claims) {
        assert.equal(seen.has(claim.orderingKey!), false, "two of one key at once");
        seen.add(claim.orderingKey!);
        order.set(claim.orderingKey!, [...order.get(claim.orderingKey!) ?? [], claim.id]);
        await db.outbox.markDispatched(claim, new Date());
      }
    }
    for (const key of busy) assert.deepEqual(order.get(key), [`${key}-b`, `${key}-c`]);
  } finally {
    await db.close();
  }
});

// SQLite has one writer, and node:sqlite blocks the process while it waits for a lock, so a
// transaction of another connection cannot be held open across the prune in one process: the
// prune runs either before the enqueue's transaction or after its commit.
Deno.test("sqlite retire keys: an enqueue of the key on another connection, before or after the retirement, is its key's head", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_retire_" });
  const a = openSqlite(`${dir}/o.db`);
  const b = openSqlite(`${dir}/o.db`);
  try {
    const ea = nodeSqliteExecutor(a);
    const eb = nodeSqliteExecutor(b);
    await migrate(ea, { dialect: "sqlite" });
    const outbox = new SqlOutboxRepository(ea, "sqlite");
    let sequence = 7;
    for (const pruneFirst of [true, false]) {
      const key = `k-${pruneFirst}`;
      await outbox.enqueue(keyed(key, `${key}-1`));
      const [first] = await outbox.claimDue(10, old());
      await outbox.markDispatched(first, old(), undefined, { sequence: sequence++ });
      const enqueue = () =>
        eb.transaction!((tx) =>
          new SqlOutboxRepository(tx, "sqlite").enqueue(keyed(key, `${key}-2`))
        );
      if (pruneFirst) await outbox.prune({ dispatchedBefore: cutoff() });
      await enqueue();
      if (!pruneFirst) await outbox.prune({ dispatchedBefore: cutoff() });
      const [head] = await outbox.claimDue(10, new Date());
      assert.equal(head?.id, `${key}-2`, "the enqueued message is its key's head");
      assert.equal(head.keySequence, pruneFirst ? undefined : sequence - 1);
    }
  } finally {
    a.close();
    b.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("sqlite retire keys: the statements search indexes, never scan the outbox or its key table", async () => {
  const db = new DatabaseSync(":memory:");
  try {
    await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
    const statements = retireKeyStatements("sqlite", resolveSqlOutboxTables({}));
    for (const statement of [statements.keys, statements.retire]) {
      const plan = db.prepare(`EXPLAIN QUERY PLAN ${statement}`).all("", "x")
        .map((row) => String((row as { detail: unknown }).detail));
      for (const step of plan) {
        assert.ok(!/^SCAN trellis_outbox/.test(step), `${step} in ${plan.join("; ")}`);
      }
      assert.ok(plan.some((step) => step.startsWith("SEARCH trellis_outbox_keys")));
    }
  } finally {
    db.close();
  }
});
