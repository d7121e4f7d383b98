import fc from "fast-check";
import { commands } from "./store_commands.ts";
import { StoreRunner } from "./store_runner.ts";
import { natsKvTarget } from "./store_targets.ts";
const runs = fc.sample(
  commands({ transactional: false, calls: 4, focus: "requeueRaces", maxLength: 10 }),
  { numRuns: 100, seed: 20261201 },
);
const s = await natsKvTarget.open();
let shown = 0;
for (const r of runs) {
  if (
    r.some((c) =>
      c.op === "overtake" && (c.inner.op === "mark" && c.inner.state === "dead") &&
      c.delay === "hold" && c.by.op === "requeue"
    )
  ) {
    const run = await s.run();
    const x = new StoreRunner(natsKvTarget, run, { fence: "auto" }, Date.now());
    try {
      await x.execute(r);
    } catch (e) {
      console.log("FAIL", String(e).slice(0, 300));
    }
    console.log(x.log.filter((l) => l.includes("requeue")).join("\n"));
    await run.close();
    if (++shown > 6) break;
  }
}
await s.close();
