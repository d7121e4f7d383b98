/**
 * Reading Postgres plans in tests: a statement run under `EXPLAIN ... FORMAT JSON` in a
 * transaction that is always rolled back (an `EXPLAIN ANALYZE` of a claim really claims), and
 * the plan's nodes as a flat list.
 */

import type postgres from "postgres";

/** The fields of a JSON plan node the plan tests read. */
export interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  "Shared Hit Blocks"?: number;
  "Shared Read Blocks"?: number;
  "Actual Rows"?: number;
  "Rows Removed by Filter"?: number;
  Plans?: PlanNode[];
}

/** The node and all its descendants, depth first. */
export function planNodes(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(planNodes)];
}

class Rollback extends Error {}

/** Runs `explain` (an `EXPLAIN (..., FORMAT JSON) ...` text) and rolls its transaction back. */
export async function explainRolledBack(
  sql: postgres.Sql,
  explain: string,
  params: unknown[],
): Promise<PlanNode> {
  let plan: PlanNode | undefined;
  await sql.begin(async (tx) => {
    const [row] = await tx.unsafe(explain, params as never[]);
    plan = (row["QUERY PLAN"] as Array<{ Plan: PlanNode }>)[0].Plan;
    throw new Rollback();
  }).catch((error) => {
    if (!(error instanceof Rollback)) throw error;
  });
  return plan!;
}
