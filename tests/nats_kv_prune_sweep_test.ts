/**
 * NATS KV prune and the marker tombstones it does not reach through a record: a marker whose
 * delete was lost (or landed late) outlives its dispatched record, which prune then removes; the
 * claim that finds the marker without a record drops it with a tombstone. Nothing else ever
 * removed that tombstone, so every new claimer's watch replayed one per lost delete, forever.
 */

import assert from "node:assert/strict";
import { markerKeyOf, markerPrefix, outboxRecordKey, syncKey } from "../src/stores/nats_kv/keys.ts";
import { keyedRecord } from "./conformance/records.ts";
import { openKvFixture } from "./nats_kv_fixture.ts";

Deno.test("nats kv prune sweep: a marker tombstone written after its record was pruned goes at the next prune", async () => {
  await using fixture = await openKvFixture();
  const outbox = fixture.outbox({ orphanGraceMs: 0 });
  const record = keyedRecord("sw", undefined);
  await outbox.enqueue(record);
  const markerKey = markerKeyOf(await outboxRecordKey(record.id));
  const marker = await fixture.kv.get(markerKey);
  assert.equal(marker?.operation, "PUT");
  const [claim] = await outbox.claimDue(1, new Date());
  assert.equal(await outbox.markDispatched(claim, new Date()), true);
  // The marker's delete was lost: the marker is still there, its record dispatched.
  await fixture.kv.put(markerKey, marker!.value);
  const future = () => new Date(Date.now() + 60_000);
  assert.equal((await outbox.prune({ dispatchedBefore: future() })).dispatched, 1);
  // A claim finds the marker without a record and drops it (a tombstone).
  assert.deepEqual(await outbox.claimDue(10, new Date()), []);
  assert.equal((await fixture.kv.get(markerKey))?.operation, "DEL");
  await outbox.prune({ dispatchedBefore: future() });
  const left: string[] = [];
  const iterator = await fixture.kv.history({ key: `${markerPrefix}.>` });
  for await (const entry of iterator) {
    if (entry.key !== syncKey) left.push(`${entry.key} ${entry.operation}`);
  }
  assert.deepEqual(left, [], "what a new claimer's watch replays");
});
