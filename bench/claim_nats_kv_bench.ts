/**
 * Claim latency on NATS KV, batch sizes 1/25/100/500, with an empty history and with 100,000
 * dispatched records in the SAME bucket. Both buckets hold the same 1,000 live pending messages,
 * enqueued through the library after the history. Only the claim is timed; see
 * ./support/claim_cycle.ts.
 *
 * 100,000 (not 1,000,000) dispatched records: seeding costs one JetStream publish per record
 * (about 5-10 s per 100,000 here, and ~45 MB of stream per 100,000), and the claim path does
 * not read dispatched records at all (it walks the in-process index of active markers), so a
 * larger history would only lengthen the seeding. Set BENCH_KV_HISTORY to try another size.
 *
 * Run with `deno task bench` (or `deno bench -A bench/claim_nats_kv_bench.ts` with
 * OUTBOX_TEST_NATS_URL set).
 *
 * @module
 */

import { NatsKvOutboxRepository } from "../mod.ts";
import { connectNats } from "../tests/kit/mod.ts";
import { liveMessages, registerClaimBenches } from "./support/claim_cycle.ts";
import { createBenchBucket, seedKvHistory } from "./support/nats_kv.ts";
import { records } from "./support/records.ts";

const history = Number(Deno.env.get("BENCH_KV_HISTORY") ?? 100_000);

const nc = await connectNats();
// deno bench has no teardown: the connection and watches end with the process.

async function outbox(label: string, dispatched: number): Promise<NatsKvOutboxRepository> {
  const kv = await createBenchBucket(nc, `claim_${label}`);
  const started = performance.now();
  if (dispatched > 0) await seedKvHistory(kv, dispatched);
  const repository = new NatsKvOutboxRepository(kv);
  await repository.enqueueMany(records(`${label}-live`, "bench", liveMessages));
  // Build the claim index now, not in the first timed claim.
  await (await repository.watch(() => {}))();
  if (dispatched > 0) {
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(
      `nats kv: seeded ${dispatched.toLocaleString("en")} dispatched records in ${seconds} s`,
    );
  }
  return repository;
}

await registerClaimBenches({
  store: "nats kv",
  empty: await outbox("empty", 0),
  full: await outbox("full", history),
  history,
});
