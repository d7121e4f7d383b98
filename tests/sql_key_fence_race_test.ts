/**
 * The key fence on Postgres under concurrency: a stale claim's mark statement whose snapshot
 * predates another dispatcher's claim (its UPDATE waits on a row lock meanwhile) must record
 * nothing for the mark that does not apply, however long it waited.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";

Deno.test("postgres: a stale mark that waited on a lock does not overwrite its key's newer sequence", async () => {
  const sql = postgres(await postgresUrl(), { max: 6, onnotice: () => {} });
  const locker = postgres(await postgresUrl(), { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const a = new SqlOutboxRepository(executor, "postgres", tables);
    const b = new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables);
    const base = { kind: "event.publish" as const, name: "n", payload: "{}", headers: {} };
    await a.enqueue({ ...base, id: "x", subject: "s.x" });
    for (const id of ["k1", "k2", "k3"]) {
      await a.enqueue({ ...base, id, subject: "s.k", orderingKey: "k" });
    }
    const t0 = new Date();
    const at = (ms: number) => new Date(t0.getTime() + ms);
    // Dispatcher A claims x and k1 (lease 1 s) and published k1 at stream sequence 11.
    const claimedA = await a.claimDue(10, t0, { leaseMs: 1_000 });
    assert.deepEqual(claimedA.map((m) => m.id), ["x", "k1"]);
    const [x, k1] = claimedA;
    // Something holds x's row lock for a while (a caller transaction, an admin's UPDATE).
    let release!: () => void;
    const released = new Promise<void>((resolve) => release = resolve);
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => locked = resolve);
    const holder = locker.begin(async (tx) => {
      await tx.unsafe(`SELECT id FROM ${tables.outbox} WHERE id = 'x' FOR UPDATE`);
      locked();
      await released;
    });
    await isLocked;
    // A's (late) marks: its statement starts now and waits on x's lock.
    const late = a.markMany([
      { claim: x, state: "dispatched" },
      { claim: k1, state: "dispatched", sequence: 11 },
    ], at(2_000));
    await new Promise((resolve) => setTimeout(resolve, 300));
    // Meanwhile A's lease is gone: B claims k1 again, its fenced retry is recognised (11), B
    // dispatches k1 and then k2 (12).
    const [k1b] = await b.claimDue(10, at(5_000), { leaseMs: 30_000 });
    assert.equal(k1b?.id, "k1");
    assert.deepEqual(
      await b.markMany([{ claim: k1b, state: "dispatched", sequence: 11 }], at(5_001)),
      [true],
    );
    const [k2] = await b.claimDue(10, at(5_002), { leaseMs: 30_000 });
    assert.equal(k2?.id, "k2");
    assert.equal(k2.keySequence, 11);
    assert.deepEqual(
      await b.markMany([{ claim: k2, state: "dispatched", sequence: 12 }], at(5_003)),
      [true],
    );
    release();
    await holder;
    // A's k1 mark is superseded (x's applies).
    assert.deepEqual(await late, [true, false]);
    const [k3] = await b.claimDue(10, at(5_004), { leaseMs: 30_000 });
    assert.equal(k3?.id, "k3");
    assert.equal(k3.keySequence, 12, "the key keeps k2's sequence");
  } finally {
    await dropPostgresTables(executor, tables);
    await locker.end();
    await sql.end();
  }
});
