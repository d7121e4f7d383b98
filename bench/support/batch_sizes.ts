/**
 * What a dispatcher scenario's store saw: how many messages each `claimDue` returned, how many
 * marks each `markMany` carried, and (Postgres) how each prepared statement was planned
 * (`pg_prepared_statements.generic_plans` / `custom_plans`, Postgres 14+).
 *
 * @module
 */

import type postgres from "postgres";
import type { OutboxRepository } from "../../mod.ts";

/** Sizes seen, summarised. */
export interface SizeSummary {
  calls: number;
  total: number;
  min: number;
  p50: number;
  max: number;
  /** `size:count` for the most frequent sizes, most frequent first. */
  common: string;
}

/** A list of sizes. */
export class Sizes {
  readonly values: number[] = [];

  /** Summary of the sizes recorded (zeros when none). */
  summary(): SizeSummary {
    const sorted = [...this.values].sort((a, b) => a - b);
    const counts = new Map<number, number>();
    for (const value of sorted) counts.set(value, (counts.get(value) ?? 0) + 1);
    const common = [...counts].sort((a, b) => b[1] - a[1]).slice(0, 4)
      .map(([size, n]) => `${size}:${n}`).join(" ");
    return {
      calls: sorted.length,
      total: sorted.reduce((sum, value) => sum + value, 0),
      min: sorted[0] ?? 0,
      p50: sorted[sorted.length >> 1] ?? 0,
      max: sorted[sorted.length - 1] ?? 0,
      common,
    };
  }
}

/** Records claim and mark sizes of a repository. */
export class BatchSizes {
  readonly claims: Sizes = new Sizes();
  readonly marks: Sizes = new Sizes();

  /** `repository`, recording the size of every `claimDue` answer and `markMany` call. */
  counting(repository: OutboxRepository): OutboxRepository {
    return new Proxy(repository, {
      get: (target, property) => {
        const value = Reflect.get(target, property, target);
        if (typeof value !== "function") return value;
        if (property === "claimDue") {
          return async (...args: Parameters<OutboxRepository["claimDue"]>) => {
            const claimed = await target.claimDue(...args);
            this.claims.values.push(claimed.length);
            return claimed;
          };
        }
        if (property === "markMany") {
          return (...args: Parameters<NonNullable<OutboxRepository["markMany"]>>) => {
            this.marks.values.push(args[0].length);
            return target.markMany!(...args);
          };
        }
        return value.bind(target);
      },
    });
  }
}

/** One prepared statement on one connection. */
export interface StatementPlans {
  connection: number;
  statement: string;
  generic: number;
  custom: number;
}

/**
 * CPU seconds (user + system) the given local backends used in their life so far (Linux /proc;
 * `undefined` when not readable: a remote server).
 */
export function backendCpuSeconds(pids: readonly number[]): number | undefined {
  try {
    let ticks = 0;
    for (const pid of pids) {
      const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      ticks += Number(fields[11]) + Number(fields[12]);
    }
    return ticks / 100; // USER_HZ
  } catch {
    return undefined;
  }
}

/** What {@linkcode preparedStatementPlans} found. */
export interface PoolPlans {
  statements: StatementPlans[];
  /** CPU seconds the pool's backends used in their life (local server only). */
  backendCpuSeconds?: number;
}

/**
 * The prepared statements of every connection of a postgres.js pool of `max` connections
 * (`max` concurrent reservations hold each connection once), and the CPU its backends used.
 */
export async function preparedStatementPlans(
  sql: postgres.Sql,
  max: number,
): Promise<PoolPlans> {
  const reserved = await Promise.all(Array.from({ length: max }, () => sql.reserve()));
  try {
    const rows = await Promise.all(reserved.map((connection) =>
      connection.unsafe(
        "SELECT pg_backend_pid() AS pid, statement, generic_plans::int AS generic, custom_plans::int AS custom FROM pg_prepared_statements",
      )
    ));
    const pids = await Promise.all(
      reserved.map(async (connection) =>
        Number((await connection.unsafe("SELECT pg_backend_pid() AS pid"))[0].pid)
      ),
    );
    return {
      statements: rows.flatMap((list) =>
        list.map((row) => ({
          connection: row.pid as number,
          statement: String(row.statement).replace(/\s+/g, " ").slice(0, 110),
          generic: row.generic as number,
          custom: row.custom as number,
        }))
      ),
      backendCpuSeconds: backendCpuSeconds(pids),
    };
  } finally {
    for (const connection of reserved) connection.release();
  }
}
