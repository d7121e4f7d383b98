/**
 * Postgres prune against keyed producers: a prune must never close a lock cycle with a producer
 * (whose transaction "deadlock detected" would abort: a business transaction lost), nor with
 * another pruner. The cycle the old prune closed, built step by step on two keys k1 and k2 whose
 * dispatched heads h1 and h2 wait for their hand-over to n1 and n2:
 *
 * 1. A producer's transaction enqueues to k1: it locks the head h1 FOR KEY SHARE until it commits.
 * 2. Its next enqueue, to k2, takes its snapshot (h2 is k2's head) and waits for k2's key lock,
 *    which a skip of k2 in flight holds.
 * 3. A relay's claim hands h1 and h2 over to n1 and n2 (visible next rows need no key lock). h1 and
 *    h2 are now prunable, and the producer still holds h1.
 * 4. A prune deleted h2 (the older) and waited for h1, held by the producer.
 * 5. The skip ends; the producer's enqueue locks h2, which its snapshot saw as k2's head: h2's
 *    latest version is the prune's deletion, so it waits for the prune. Deadlock.
 *
 * Now the prune skips h1 (held) and deletes h2; a later run deletes h1.
 *
 * @module
 */

import assert from "node:assert/strict";
import { type OutboxRecord, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { keyedRecord } from "./conformance/records.ts";
import { backendPid, settledOrWaiting } from "./sql/lock_waits.ts";
import { openPostgresTables } from "./sql/postgres_tables.ts";

const keyed = (id: string, key: string): OutboxRecord => keyedRecord(id, key, { id });

function isDeadlock(error: unknown): boolean {
  return (error as { code?: unknown })?.code === "40P01";
}

Deno.test("postgres: a prune never deadlocks a keyed producer whose transaction holds a head handed over since", async () => {
  await using pg = await openPostgresTables();
  const { admin, tables } = pg;
  const [producerSql, skipSql, relaySql, jobSql] = [1, 2, 3, 4].map(() => pg.connect());
  const o = tables.outbox;
  // k1 and k2: a dispatched head still to hand over (h2 the older) and a pending next row.
  await admin.unsafe(
    `INSERT INTO ${o} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, ordering_key, key_head)
     VALUES ('h2', 'event.publish', 'old', 'orders.old', '{}', '{}'::jsonb, 'dispatched', 1, now() - interval '2 days', now() - interval '2 days', 'k2', true),
            ('h1', 'event.publish', 'old', 'orders.old', '{}', '{}'::jsonb, 'dispatched', 1, now() - interval '2 days', now() - interval '1 day', 'k1', true),
            ('n1', 'event.publish', 'new', 'orders.new', '{}', '{}'::jsonb, 'pending', 0, now(), now(), 'k1', false),
            ('n2', 'event.publish', 'new', 'orders.new', '{}', '{}'::jsonb, 'pending', 0, now(), now(), 'k2', false)`,
  );
  const relay = new SqlOutboxRepository(postgresJsExecutor(relaySql), "postgres", tables);
  const job = new SqlOutboxRepository(postgresJsExecutor(jobSql), "postgres", tables);
  const jobPid = await backendPid(jobSql);

  const skipHoldsK2 = Promise.withResolvers<void>();
  const endSkip = Promise.withResolvers<void>();
  // Stands for a skip of k2 in flight: unblockKey takes k2's key lock exclusively first.
  const skip = skipSql.begin(async (tx) => {
    await tx.unsafe(`SELECT pg_advisory_xact_lock(hashtext('${o}'), hashtext('k2'))`);
    skipHoldsK2.resolve();
    await endSkip.promise;
  });
  await skipHoldsK2.promise;

  const heldK1 = Promise.withResolvers<number>();
  const secondEnqueue = Promise.withResolvers<{ enqueue: Promise<unknown> }>();
  const producer = producerSql.begin(async (tx) => {
    const outbox = new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables);
    await outbox.enqueueMany([keyed("p1a", "k1"), keyed("p1b", "k1")]);
    heldK1.resolve(await backendPid(tx));
    const enqueue = outbox.enqueueMany([keyed("p2a", "k2"), keyed("p2b", "k2")]);
    secondEnqueue.resolve({ enqueue });
    await enqueue;
  });
  producer.catch(() => {});
  const producerPid = await heldK1.promise;
  const { enqueue: enqueueK2 } = await secondEnqueue.promise;
  enqueueK2.catch(() => {});
  assert.ok(
    await settledOrWaiting(admin, producerPid, enqueueK2, "advisory"),
    "the producer's enqueue to k2 waits for k2's key lock",
  );

  // The relay hands h1 and h2 over (and claims n1 and n2).
  const claimed = await relay.claimDue(10, new Date());
  assert.deepEqual(claimed.map((message) => message.id).sort(), ["n1", "n2"]);

  const pruning = job.prune({
    dispatchedBefore: new Date(Date.now() - 3_600_000),
    batchSize: 10,
  });
  pruning.catch(() => {});
  // The old prune waits here for h1, having deleted h2; the new one returns.
  await settledOrWaiting(admin, jobPid, pruning);
  endSkip.resolve();
  await skip;

  const outcomes = await Promise.allSettled([pruning, producer]);
  for (const outcome of outcomes) {
    if (outcome.status === "rejected" && isDeadlock(outcome.reason)) {
      assert.fail(`deadlock: ${(outcome.reason as Error).message}`);
    }
    if (outcome.status === "rejected") throw outcome.reason;
  }
  // h1 was held by the producer's transaction: skipped, then pruned by the next run.
  assert.deepEqual(await pruning, { dispatched: 1, dead: 0 });
  assert.deepEqual(
    await job.prune({ dispatchedBefore: new Date(Date.now() - 3_600_000), batchSize: 10 }),
    { dispatched: 1, dead: 0 },
  );
  const rows = await admin.unsafe(
    `SELECT id, ordering_key, key_head FROM ${o} ORDER BY seq`,
  );
  assert.deepEqual(
    rows.map((row) => `${row.id}:${row.ordering_key}:${row.key_head}`),
    [
      "n1:k1:true",
      "n2:k2:true",
      "p1a:k1:false",
      "p1b:k1:false",
      "p2a:k2:false",
      "p2b:k2:false",
    ],
  );
});
