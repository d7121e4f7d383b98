/**
 * Re-planning a repository's Postgres statements as its outbox grows.
 *
 * postgres.js prepares named statements (the executor's default), and for a prepared statement
 * Postgres makes five custom plans and then, when a generic plan is estimated no dearer, keeps
 * that generic plan for the connection's life: only an `ANALYZE` of the table (autovacuum's,
 * once enough rows changed and its next round comes) makes it plan again. A generic plan made
 * while the outbox was empty or nearly so is free to read the whole table (a sequential scan is
 * the cheapest plan for ten rows), and keeps doing that as the dispatched history grows: on a
 * fresh table a claim and mark of 5 messages measured 10-49 ms against 3 ms once the history
 * held 19,000 rows, until the table was analyzed.
 *
 * So a repository on Postgres varies the text of its statements with a comment, `/* plan g<N> *\/`,
 * as the number of rows it has claimed (or pruned: a retention job that only prunes, outbox or
 * inbox, has the same problem with its prune statement) passes 64, 256, 1,024, 4,096, 16,384
 * and 65,536. Each new text is a new prepared statement on each connection, planned with the
 * table as it is then; a plan made once the repository has worked through thousands of rows
 * probes the indexes. That is at most six extra prepared statements per statement and
 * connection, over the repository's life (measured: 22 prepared statements, about 3 MB of cached
 * plans, on a relay connection after 70,000 claims), and nothing at all past 65,536. A plan made
 * on a large table stays right when the table shrinks again (pruning): index probes cost little
 * at any size. Repositories that only enqueue never change generation; their statements look
 * rows up through indexes whatever the plan (dialects.ts).
 *
 * @module
 */

import type { OutboxStatements } from "./dialects.ts";
import type { SqlDialect } from "./tables.ts";

/** Claimed-message counts at which a repository's statements are planned again. */
const thresholds = [64, 256, 1_024, 4_096, 16_384, 65_536] as const;

/** The plan generation of a repository that has claimed `claimed` messages (0 to 6). */
export function planGeneration(claimed: number): number {
  let generation = 0;
  while (generation < thresholds.length && claimed >= thresholds[generation]) generation++;
  return generation;
}

const variants = new WeakMap<OutboxStatements, Map<number, OutboxStatements>>();

/**
 * `statements` with every statement text marked with `generation` (generation 0: unchanged).
 * Empty texts (a statement the dialect does not need) stay empty. Cached per statement set.
 */
export function withPlanGeneration(
  statements: OutboxStatements,
  generation: number,
): OutboxStatements {
  if (generation === 0) return statements;
  let byGeneration = variants.get(statements);
  if (!byGeneration) {
    byGeneration = new Map();
    variants.set(statements, byGeneration);
  }
  let marked = byGeneration.get(generation);
  if (!marked) {
    const prefix = `/* plan g${generation} */ `;
    const mark = (text: string) => text === "" ? text : prefix + text;
    const copy: Record<string, unknown> = {};
    for (const [name, value] of Object.entries(statements)) {
      if (typeof value === "string") copy[name] = mark(value);
      else if (Array.isArray(value)) copy[name] = Object.freeze(value.map(mark));
      else {
        copy[name] = Object.freeze(
          Object.fromEntries(
            Object.entries(value as Record<string, string>).map(([k, text]) => [k, mark(text)]),
          ),
        );
      }
    }
    marked = Object.freeze(copy) as unknown as OutboxStatements;
    byGeneration.set(generation, marked);
  }
  return marked;
}

/**
 * A repository's statements, planned again (Postgres) as the rows it has claimed or pruned pass
 * each threshold; on SQLite, which plans each prepared statement itself, always the same set.
 */
export class PlannedStatements {
  readonly #statements: OutboxStatements;
  readonly #follows: boolean;
  #current: OutboxStatements;
  #worked = 0;

  /** Starts at generation 0 of `statements`. */
  constructor(statements: OutboxStatements, dialect: SqlDialect) {
    this.#statements = statements;
    this.#current = statements;
    this.#follows = dialect === "postgres";
  }

  /** The statements of the current generation. */
  get current(): OutboxStatements {
    return this.#current;
  }

  /** Counts `rows` claimed or pruned; past a threshold, the next generation's statements. */
  count(rows: number): void {
    if (!this.#follows || rows === 0) return;
    const before = planGeneration(this.#worked);
    this.#worked += rows;
    const after = planGeneration(this.#worked);
    if (after !== before) this.#current = withPlanGeneration(this.#statements, after);
  }
}
