/**
 * An executor whose transactions hold their locks until the test lets them commit, so the other
 * side of a race runs at the moment that matters instead of a timed one.
 *
 * @module
 */

import type { SqlExecutor } from "../../mod.ts";

/** What `heldExecutor` returns. */
export interface HeldExecutor {
  /** Runs queries on `inner`; its transactions wait for `commit()` after their work. */
  executor: SqlExecutor;
  /** Lets the held transactions commit. */
  commit(): void;
  /** Resolves once a transaction has done its work (and holds its row locks). */
  worked: Promise<void>;
}

/**
 * An executor whose transactions do their work, then wait for `commit()` before committing:
 * the other side of a race runs while this one holds its row locks.
 */
export function heldExecutor(inner: SqlExecutor): HeldExecutor {
  let commit!: () => void;
  const gate = new Promise<void>((resolve) => commit = resolve);
  let worked!: () => void;
  const done = new Promise<void>((resolve) => worked = resolve);
  const executor: SqlExecutor = {
    query: (text, params) => inner.query(text, params),
    transaction<T>(fn: (tx: SqlExecutor) => Promise<T>): Promise<T> {
      return inner.transaction!(async (tx) => {
        const result = await fn(tx);
        worked();
        await gate;
        return result;
      });
    },
  };
  return { executor, commit, worked: done };
}
