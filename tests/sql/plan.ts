/**
 * Reading Postgres plans in tests: a statement run under `EXPLAIN ... FORMAT JSON` (as it is, or
 * in a transaction that is always rolled back: an `EXPLAIN ANALYZE` of a claim really claims),
 * the plan's nodes as a flat list, and the rows a node read.
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
  "Actual Loops"?: number;
  Filter?: string;
  "Rows Removed by Filter"?: number;
  "Rows Removed by Index Recheck"?: number;
  "Join Filter"?: string;
  "Rows Removed by Join Filter"?: number;
  Plans?: PlanNode[];
}

/** The node and all its descendants, depth first. */
export function planNodes(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(planNodes)];
}

/** The nodes below the plan's ModifyTable nodes (what its INSERT, UPDATE or DELETE ran on). */
export function modifyingNodes(plan: PlanNode): PlanNode[] {
  const children = plan.Plans ?? [];
  return plan["Node Type"] === "ModifyTable"
    ? children.flatMap(planNodes)
    : children.flatMap(modifyingNodes);
}

/** Whether `node` reads `table` (a scan of it; its ModifyTable node writes it). */
export function readsTable(node: PlanNode, table: string): boolean {
  return node["Relation Name"] === table && node["Node Type"] !== "ModifyTable";
}

/** The rows `node` read: returned and removed by its filters, in all its loops. */
export function rowsRead(node: PlanNode): number {
  return (Number(node["Actual Rows"]) + Number(node["Rows Removed by Filter"] ?? 0) +
    Number(node["Rows Removed by Index Recheck"] ?? 0)) * Number(node["Actual Loops"] ?? 1);
}

/** The plan of an `EXPLAIN (..., FORMAT JSON)` result row (its text, or its parsed JSON). */
function planOf(row: Record<string, unknown>): PlanNode {
  const explained = row["QUERY PLAN"];
  const parsed = typeof explained === "string" ? JSON.parse(explained) : explained;
  return (parsed as Array<{ Plan: PlanNode }>)[0].Plan;
}

/** Runs `explain` (an `EXPLAIN (..., FORMAT JSON) ...` text) on `sql` as it is. */
export async function explainPlan(
  sql: Pick<postgres.Sql, "unsafe">,
  explain: string,
): Promise<PlanNode> {
  const [row] = await sql.unsafe(explain);
  return planOf(row);
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
    plan = planOf(row);
    throw new Rollback();
  }).catch((error) => {
    if (!(error instanceof Rollback)) throw error;
  });
  return plan!;
}
