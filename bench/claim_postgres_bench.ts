/**
 * Claim latency on Postgres (postgres.js), batch sizes 1/25/100/500, with an empty history and
 * with 1,000,000 dispatched rows in the SAME table, and with 100,000 failed rows waiting for
 * their retry time (a backlog behind one refusing stream). Both tables hold the same 1,000 live pending
 * rows (enqueued through the library after the history, so they are the newest rows). Only the
 * claim statement is timed; see ./support/claim_cycle.ts.
 *
 * The history is seeded with one `INSERT ... SELECT generate_series` (about 20-40 s on a 2-core
 * machine), then `VACUUM ANALYZE`, in a fresh database dropped when the run ends.
 *
 * Run with `deno task bench` (or `deno bench -A bench/claim_postgres_bench.ts` with
 * OUTBOX_TEST_POSTGRES_URL set).
 *
 * @module
 */

import postgres from "postgres";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import { cleanUpAtExit } from "./support/cleanup.ts";
import { liveMessages, registerClaimBenches } from "./support/claim_cycle.ts";
import {
  createBenchDatabase,
  seedPostgresHistory,
  seedPostgresRetryBacklog,
} from "./support/postgres.ts";
import { records } from "./support/records.ts";

const history = 1_000_000;
const retryBacklog = 100_000;

const database = await createBenchDatabase("claim");
cleanUpAtExit({ kind: "postgres-database", serverUrl: database.serverUrl, name: database.name });
const sql = postgres(database.url, { max: 2, onnotice: () => {} });
const executor = postgresJsExecutor(sql);

async function outbox(
  table: string,
  dispatched: number,
  waiting = 0,
): Promise<SqlOutboxRepository> {
  const tables = { outbox: `${table}_outbox`, inbox: `${table}_inbox` };
  await migrate(executor, { dialect: "postgres", tables });
  const started = performance.now();
  if (dispatched > 0) await seedPostgresHistory(sql, tables.outbox, dispatched);
  if (waiting > 0) await seedPostgresRetryBacklog(sql, tables.outbox, waiting);
  const repository = new SqlOutboxRepository(executor, "postgres", tables);
  const live = records(`${table}-live`, "bench", liveMessages);
  await repository.enqueueMany(live);
  await sql.unsafe(`VACUUM ANALYZE ${tables.outbox}`);
  if (dispatched > 0) {
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(
      `postgres: seeded ${dispatched.toLocaleString("en")} dispatched rows in ${seconds} s`,
    );
  }
  return repository;
}

await registerClaimBenches({
  store: "postgres",
  empty: await outbox("empty", 0),
  full: await outbox("full", history),
  history,
  backlog: { outbox: await outbox("backlog", 0, retryBacklog), count: retryBacklog },
});
