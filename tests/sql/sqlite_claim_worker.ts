/// <reference no-default-lib="true" />
/// <reference lib="deno.worker" />

/**
 * A claimer in its own thread with its own SQLite connection (for the concurrent-claim test):
 * claims until nothing is due, settles what it claimed, and reports the ids.
 */

import { nodeSqliteExecutor, SqlOutboxRepository } from "../../mod.ts";
import { openSqlite } from "./harness.ts";

interface Job {
  path: string;
  now: string;
  batch: number;
}

self.onmessage = async (event: MessageEvent<Job>) => {
  const { path, now, batch } = event.data;
  const db = openSqlite(path);
  try {
    const outbox = new SqlOutboxRepository(nodeSqliteExecutor(db), "sqlite");
    const ids: string[] = [];
    let settled = 0;
    while (true) {
      const claimed = await outbox.claimDue(batch, new Date(now));
      if (claimed.length === 0) break;
      ids.push(...claimed.map((message) => message.id));
      const results = await outbox.markMany(
        claimed.map((claim) => ({ claim, state: "dispatched" as const })),
        new Date(now),
      );
      settled += results.filter(Boolean).length;
    }
    self.postMessage({ ids, settled });
  } catch (error) {
    self.postMessage({ error: String(error) });
  } finally {
    db.close();
  }
};
