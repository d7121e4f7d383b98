/**
 * Claim latency on SQLite (node:sqlite, WAL file), batch sizes 1/25/100/500, with an empty
 * history and with 1,000,000 dispatched rows in the SAME table, and with 100,000 failed rows waiting for their
 * retry time. Both tables hold the same 1,000
 * live pending rows, enqueued through the library after the history. Only the claim statement
 * is timed; see ./support/claim_cycle.ts.
 *
 * The history is seeded with one recursive-CTE `INSERT` in one transaction (a few seconds).
 *
 * Run with `deno task bench` (or `deno bench -A bench/claim_sqlite_bench.ts`).
 *
 * @module
 */

import { migrate, nodeSqliteExecutor, SqlOutboxRepository } from "../mod.ts";
import { liveMessages, registerClaimBenches } from "./support/claim_cycle.ts";
import { records } from "./support/records.ts";
import { openBenchSqlite, seedSqliteHistory, seedSqliteRetryBacklog } from "./support/sqlite.ts";

const history = 1_000_000;
const retryBacklog = 100_000;

async function outbox(
  label: string,
  dispatched: number,
  waiting = 0,
): Promise<SqlOutboxRepository> {
  const { db } = await openBenchSqlite(`claim_${label}`);
  const executor = nodeSqliteExecutor(db);
  await migrate(executor, { dialect: "sqlite" });
  const started = performance.now();
  if (dispatched > 0) seedSqliteHistory(db, "trellis_outbox", dispatched);
  if (waiting > 0) seedSqliteRetryBacklog(db, "trellis_outbox", waiting);
  const repository = new SqlOutboxRepository(executor, "sqlite");
  await repository.enqueueMany(records(`${label}-live`, "bench", liveMessages));
  db.exec("ANALYZE");
  if (dispatched > 0) {
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(
      `sqlite: seeded ${dispatched.toLocaleString("en")} dispatched rows in ${seconds} s`,
    );
  }
  return repository;
}

await registerClaimBenches({
  store: "sqlite",
  empty: await outbox("empty", 0),
  full: await outbox("full", history),
  history,
  backlog: { outbox: await outbox("backlog", 0, retryBacklog), count: retryBacklog },
});
