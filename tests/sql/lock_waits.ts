/**
 * Watching Postgres backends wait for locks (pg_stat_activity), to build lock interleavings
 * step by step in tests instead of racing them.
 *
 * @module
 */

import type postgres from "postgres";

type Queryable = Pick<postgres.Sql, "unsafe">;

/** The backend process id of the connection (or transaction) `sql`. */
export async function backendPid(sql: Queryable): Promise<number> {
  const [row] = await sql.unsafe("SELECT pg_backend_pid() AS pid");
  return Number(row.pid);
}

/** Whether backend `pid` waits for a heavyweight lock (with `event`: of that kind). */
export async function waitsForLock(
  admin: Queryable,
  pid: number,
  event?: string,
): Promise<boolean> {
  const rows = await admin.unsafe(
    `SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock' AND ($2::text IS NULL OR wait_event = $2)`,
    [pid, event ?? null],
  );
  return rows.length > 0;
}

/**
 * Resolves once `done` has settled (false) or backend `pid`, which runs it, waits for a lock
 * (true; with `event`: a lock of that kind). Throws when neither happens within 10 s.
 */
export async function settledOrWaiting(
  admin: Queryable,
  pid: number,
  done: Promise<unknown>,
  event?: string,
): Promise<boolean> {
  let settled = false;
  done.then(() => settled = true, () => settled = true);
  for (let poll = 0; poll < 400; poll++) {
    if (settled) return false;
    if (await waitsForLock(admin, pid, event)) return true;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`backend ${pid} neither finished nor waited for a lock`);
}
