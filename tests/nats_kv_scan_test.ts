import assert from "node:assert/strict";
import { mapInFlight } from "../src/stores/nats_kv/scan.ts";

Deno.test("nats kv prune: removals run with a bounded number in flight, results in input order", async () => {
  let inFlight = 0;
  let most = 0;
  const items = Array.from({ length: 1_000 }, (_, i) => i);
  const results = await mapInFlight(items, 32, async (item) => {
    inFlight += 1;
    most = Math.max(most, inFlight);
    await new Promise((resolve) => setTimeout(resolve, item % 3));
    inFlight -= 1;
    return item * 2;
  });
  assert.equal(most, 32);
  assert.deepEqual(results, items.map((item) => item * 2));
  assert.deepEqual(await mapInFlight([], 32, () => Promise.resolve(1)), []);
  await assert.rejects(
    mapInFlight(
      [1, 2, 3],
      2,
      (item) => item === 2 ? Promise.reject(new Error("boom")) : Promise.resolve(item),
    ),
    /boom/,
  );
});
