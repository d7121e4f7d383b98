/**
 * `rawRemover` (the compare-and-delete prune uses on a `Bucket`) on a real bucket: a key written
 * again since the scan read it is reported as changed (and kept), in a bucket that keeps history
 * as in one that does not.
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import { rawRemover } from "../src/stores/nats_kv/scan.ts";
import { connectNats, uniqueName } from "./kit/mod.ts";

for (const history of [1, 5]) {
  Deno.test(`nats kv remover: a key rewritten since the scan is kept and reported changed (history ${history})`, async () => {
    const nc = await connectNats();
    const kv = await new Kvm(nc).create(uniqueName("kvrm"), { history });
    try {
      const remove = rawRemover(kv)!;
      const seen = await kv.put("k", "scanned");
      await kv.put("k", "requeued");
      // A requeue (or an enqueue again) since the scan: the prune must not count it removed.
      assert.equal(await remove("k", seen), false);
      assert.equal((await kv.get("k"))?.string(), "requeued");
      const unchanged = await kv.put("other", "settled");
      assert.equal(await remove("other", unchanged), true);
      assert.equal(await kv.get("other"), null);
      // Removed already (another pruner): not counted twice.
      assert.equal(await remove("other", unchanged), false);
    } finally {
      await kv.destroy();
      await nc.close();
    }
  });
}
