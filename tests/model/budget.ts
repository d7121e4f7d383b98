/**
 * The run budget of the model tests: a fixed seed and a small number of runs in CI, a long
 * budget for nightly use, and the replay of one failure.
 *
 * - `OUTBOX_MODEL_RUNS` (or `--runs N` after `--`): runs per property; default 100 (CI).
 * - `OUTBOX_MODEL_SEED` (or `--seed N`): the seed; default a fixed one, so CI is repeatable.
 * - `OUTBOX_MODEL_PATH` (or `--path P`): replay one counterexample, as fast-check printed it.
 *
 * @module
 */

import type fc from "fast-check";

/** The seed CI uses. */
export const defaultSeed = 20261201;

function argument(name: string): string | undefined {
  const i = Deno.args.indexOf(`--${name}`);
  if (i >= 0) return Deno.args[i + 1];
  return Deno.args.find((arg) => arg.startsWith(`--${name}=`))?.slice(name.length + 3);
}

function setting(env: string, arg: string): string | undefined {
  return Deno.env.get(env) ?? argument(arg);
}

/**
 * fast-check parameters for one property. `scale` shrinks the run count for expensive
 * properties (a 0.5 property gets half the runs).
 */
export function budget(scale = 1): fc.Parameters<unknown> {
  const runs = Number(setting("OUTBOX_MODEL_RUNS", "runs") ?? 100);
  const seed = Number(setting("OUTBOX_MODEL_SEED", "seed") ?? defaultSeed);
  const path = setting("OUTBOX_MODEL_PATH", "path");
  return {
    numRuns: Math.max(1, Math.round(runs * scale)),
    seed,
    ...(path ? { path } : {}),
    // The shrunk counterexample and the seed are in fast-check's error; keep it readable.
    endOnFailure: false,
    verbose: 0,
  };
}
