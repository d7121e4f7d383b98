/**
 * Review of the marker copies (`Marker.r`): a copy that says its record is not due is only as
 * good as a read when it is current. A marker written by a recovery path (`repair()`, a requeue
 * or a duplicate enqueue of an active record that lost its marker) carries no due time, so the
 * index offers it to claims at once; its copy of a claimed (or failed) record says "not due".
 * When the record changed since (its claim failed and is due again, the failed mark's marker
 * write lost or not seen yet), the claim must read it, as it does without a copy, instead of
 * skipping the message until the copy's lease ends.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
import { markerKeyOf, outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { intercept, openKvFixture } from "./nats_kv_fixture.ts";

async function markerOf(kv: KV, id: string): Promise<Record<string, unknown> | undefined> {
  const entry = await kv.get(markerKeyOf(await outboxRecordKey(id)));
  return entry?.operation === "PUT" ? entry.json<Record<string, unknown>>() : undefined;
}

Deno.test("nats kv marker copy review: a stale copy that says not due does not hide a message that is due", async () => {
  await using fixture = await openKvFixture({ markerCopies: true });
  const message = keyedRecord("mcr", undefined);
  const markerKey = markerKeyOf(await outboxRecordKey(message.id));
  const producer = fixture.outbox();
  await producer.enqueue(message);
  const t0 = new Date();
  const [claimed] = await producer.claimDue(1, t0, { leaseMs: 60_000 });
  assert.equal(claimed?.id, message.id);

  // The claimed record loses its marker; repair() writes it again (a copy of the claimed
  // record, no due time).
  await fixture.kv.delete(markerKey);
  assert.equal((await producer.repair()).markersCreated, 1);
  const repaired = await markerOf(fixture.kv, message.id);
  assert.equal((repaired?.r as { state?: string } | undefined)?.state, "claimed");

  const relay = fixture.outbox({ kv: fixture.peerKv });
  await (await relay.watch(() => {}))(); // its index holds the repaired marker and its copy

  // The claim fails, due again at once; the failed mark's marker write is lost (documented:
  // the record is the truth, the marker only a pointer).
  const settler = fixture.outbox({
    kv: intercept(
      fixture.kv,
      "put",
      (put) => (key, value, options) =>
        key === markerKey
          ? Promise.reject(new Error("lost (simulated)"))
          : put(key, value, options),
    ),
  });
  assert.equal(
    await settler.markFailed(claimed, { error: "boom", now: t0, nextAttemptAt: t0 }),
    true,
  );
  assert.equal((await relay.get(message.id))?.state, "failed");

  // Due now: a claim that reads the record (as one without a copy does) takes it.
  const [again] = await relay.claimDue(10, new Date(t0.getTime() + 1_000));
  assert.equal(again?.id, message.id, "the due message is claimed, not hidden until the lease");
  assert.equal(again.attempts, 2);
});

// Fails on kv-fewer-ops by design (enqueue writes its marker only after the record's ack, to
// name its revision), passes on main (record and marker issued together). Measured with a
// producer killed (SIGKILL) at a random moment while running 64 enqueues at once: 64, 52, 0 and
// 64 records left without a marker in 4 runs, 0 in 4 runs of main. Nothing but repair() or a
// duplicate enqueue indexes them. Goes green once the enqueue without copies (the planned
// default) issues both writes together again, as main does.
// With `markerCopies` on, this is the option's documented price (the marker follows the record's
// acknowledgement); the default must keep both writes together, as before the option existed.
Deno.test("nats kv marker copy review: by default, a producer that dies right after its record write is acknowledged leaves a claimable message", async () => {
  await using fixture = await openKvFixture();
  const message = keyedRecord("mcr", undefined);
  const recordKey = await outboxRecordKey(message.id);
  // The process dies as the record's acknowledgement arrives: nothing it issues later is sent.
  let dead = false;
  const kv = intercept(fixture.kv, "create", (create) => (key, value, ttl) => {
    if (dead) return new Promise<number>(() => {});
    const written = create(key, value, ttl);
    if (key === recordKey) written.then(() => dead = true, () => {});
    return written;
  });
  void fixture.outbox({ kv }).enqueue(message).catch(() => {});
  const started = Date.now();
  while (!dead && Date.now() - started < 5_000) await new Promise((r) => setTimeout(r, 10));
  assert.ok(dead, "the record was written");

  // A relay (another process) finds the message without anyone running repair().
  const relay = fixture.outbox({ kv: fixture.peerKv });
  const [claimed] = await relay.claimDue(10, new Date());
  assert.equal(claimed?.id, message.id, "the message is claimable, not stranded");
});
