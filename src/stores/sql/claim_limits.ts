/**
 * The Postgres claim with its limit written into the text, so Postgres keeps a generic plan of
 * it instead of planning it again on every execution.
 *
 * For a prepared statement Postgres makes five custom plans, then compares the cost of a generic
 * plan with theirs. The claim's `LIMIT $3` is what tips it: a generic plan cannot know the
 * limit, estimates it as a tenth of the rows, and so always looks dearer than the custom plans,
 * and every claim was planned anew (measured in the relay: 79 claims, 82 plans, about 1 ms of
 * planning each, next to ~9 ms of execution for 256 messages; at 16 messages per claim the
 * planning was most of the claim). With the limit written in, the generic plan's estimate is the
 * custom plans', and from the sixth claim on the claim is planned no more.
 *
 * Each written limit is another statement text, so another prepared statement on each
 * connection: only the first {@linkcode maxWrittenLimits} distinct limits of a statement set
 * (one per plan generation, plan_generations.ts) are written in; any other limit takes the
 * claim with the `$3` parameter. A dispatcher claims with its `limit`, 1 (the circuit breaker's
 * trial) and, after a hand-over of ordering-key heads, what the batch lacks.
 *
 * @module
 */

import { claimLimitMark, type OutboxStatements } from "./dialects.ts";

/** Distinct limits written into the claim's text, per statement set. */
export const maxWrittenLimits = 4;

const written = new WeakMap<OutboxStatements, Map<number, string>>();

/**
 * The statement and parameters that claim up to `limit` rows: `statements.claimLimited` with the
 * limit written in (parameters `now`, `lease`, `token`), or `statements.claim` (parameters `now`,
 * `lease`, `limit`, `token`) on SQLite and for limits past the first
 * {@linkcode maxWrittenLimits} of this statement set.
 */
export function claimStatement(
  statements: OutboxStatements,
  limit: number,
  now: string,
  lease: string,
  token: string,
): { text: string; params: unknown[] } {
  if (statements.claimLimited === "" || !Number.isSafeInteger(limit) || limit < 0) {
    return { text: statements.claim, params: [now, lease, limit, token] };
  }
  let byLimit = written.get(statements);
  if (!byLimit) {
    byLimit = new Map();
    written.set(statements, byLimit);
  }
  let text = byLimit.get(limit);
  if (text === undefined) {
    if (byLimit.size >= maxWrittenLimits) {
      return { text: statements.claim, params: [now, lease, limit, token] };
    }
    text = statements.claimLimited.replaceAll(claimLimitMark, String(limit));
    byLimit.set(limit, text);
  }
  return { text, params: [now, lease, token] };
}
