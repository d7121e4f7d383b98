/**
 * CPU time used by a local Postgres cluster (Linux): the postmaster's own, its live backends'
 * (and background workers'), and what its exited children left in its `cutime`/`cstime`.
 * `undefined` when the server is not local or /proc is not readable. Differences between two
 * readings are what a scenario cost the server.
 *
 * @module
 */

import type postgres from "postgres";

const ticksPerSecond = 100; // USER_HZ on Linux

function statTicks(pid: number, withChildren: boolean): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  // Fields after the command name (which may contain spaces) start at state (field 3).
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const [utime, stime, cutime, cstime] = fields.slice(11, 15).map(Number);
  return utime + stime + (withChildren ? cutime + cstime : 0);
}

function children(pid: number): number[] {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/task/${pid}/children`).trim().split(/\s+/)
      .filter((s) => s.length > 0).map(Number);
  } catch {
    return [];
  }
}

/** Reads the postmaster pid once (through `data_directory`), then sums its CPU on each call. */
export async function postgresCpu(
  sql: postgres.Sql,
): Promise<(() => number | undefined) | undefined> {
  try {
    const [row] = await sql`SELECT current_setting('data_directory') AS dir`;
    const pid = Number(
      Deno.readTextFileSync(`${row.dir}/postmaster.pid`).split("\n")[0],
    );
    statTicks(pid, true);
    return () => {
      try {
        let ticks = statTicks(pid, true);
        for (const child of children(pid)) {
          try {
            ticks += statTicks(child, false);
          } catch {
            // exited meanwhile: counted in the postmaster's cutime once reaped
          }
        }
        return ticks / ticksPerSecond;
      } catch {
        return undefined;
      }
    };
  } catch {
    return undefined;
  }
}
