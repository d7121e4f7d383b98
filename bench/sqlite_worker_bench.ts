/**
 * What a statement costs through `sqliteWorkerExecutor` (a worker thread's connection) against
 * `nodeSqliteExecutor` (the calling thread's): one round trip (`SELECT 1`), and one relay batch
 * (claim 256, mark them dispatched) on a WAL file with SQLite's default `synchronous = FULL`, so
 * each of the batch's writes commits with an fsync. Only claim + mark are timed; the rows are put
 * back to `pending` after each iteration, untimed.
 *
 * The relay issues about three statements per batch (claim, the stale-head check, the mark), so
 * the round trip times this, against the fsyncs, tells whether shipping a batch's statements in
 * one message would be worth it.
 *
 * Run with `deno task bench` (or `deno bench -A bench/sqlite_worker_bench.ts`).
 *
 * @module
 */

import {
  migrate,
  nodeSqliteExecutor,
  type SqlExecutor,
  sqliteWorkerExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { records } from "./support/records.ts";
import { openBenchSqlite } from "./support/sqlite.ts";

const batch = 256;

async function prepare(
  label: string,
): Promise<{ local: SqlExecutor; worker: SqlExecutor; reset(): void }> {
  const { db, path } = await openBenchSqlite(`worker_${label}`);
  const local = nodeSqliteExecutor(db);
  await migrate(local, { dialect: "sqlite" });
  await new SqlOutboxRepository(local, "sqlite").enqueueMany(
    records(`${label}-live`, "bench", batch),
  );
  db.exec("ANALYZE");
  const reset = db.prepare(
    "UPDATE trellis_outbox SET state = 'pending', claim_token = NULL, next_attempt_at = NULL",
  );
  const worker = await sqliteWorkerExecutor(path);
  globalThis.addEventListener("unload", () => void (worker as { close(): unknown }).close());
  return { local, worker, reset: () => void reset.run() };
}

const setup = await prepare("main");

for (
  const [name, executor] of [["nodeSqliteExecutor", setup.local], [
    "sqliteWorkerExecutor",
    setup.worker,
  ]] as const
) {
  Deno.bench({
    name: `SELECT 1 round trip, ${name}`,
    group: "round trip",
    baseline: name === "nodeSqliteExecutor",
    async fn() {
      await executor.query("SELECT 1 AS one", []);
    },
  });
  const outbox = new SqlOutboxRepository(executor, "sqlite");
  Deno.bench({
    name: `claim ${batch} + markMany dispatched (synchronous = FULL), ${name}`,
    group: "relay batch",
    baseline: name === "nodeSqliteExecutor",
    async fn(b) {
      b.start();
      const claimed = await outbox.claimDue(batch, new Date());
      await outbox.markMany(
        claimed.map((claim) => ({ claim, state: "dispatched" as const })),
        new Date(),
      );
      b.end();
      if (claimed.length !== batch) throw new Error(`claimed ${claimed.length} of ${batch}`);
      setup.reset();
    },
  });
}
