/**
 * Where a relay's time goes between the store and the broker (`bench:throughput --timeline`): how
 * long each `claimDue` and `markMany` took from call to answer, and how full the in-flight window
 * was over the run (deliveries started by the runtime and not yet answered). A window that is
 * often nearly empty means the relay waits for its store; a full one that it waits for the broker
 * or for CPU.
 *
 * A delivery counts as in flight from the call to `publishPreparedEvent` until its promise settles,
 * so one the dispatcher abandoned at its deadline still counts until the runtime gives it up (the
 * mean can then exceed the window); job submissions are not counted. Quantiles are the lower
 * nearest rank. The wrappers add a `performance.now()` and a closure per call: a few percent of CPU,
 * so compare scenarios that all ran with `--timeline`, never with runs without it.
 *
 * @module
 */

import type { OutboxRepository, OutboxRuntime } from "../../mod.ts";

/** A timeline summarised for the report. */
export interface TimelineSummary {
  /** `claimDue` latency, ms: median and 90th percentile. */
  claimP50Ms: number;
  claimP90Ms: number;
  /** `markMany` latency, ms: median and 90th percentile. */
  markP50Ms: number;
  markP90Ms: number;
  /** Deliveries in flight, averaged over time from the first delivery to the last answer. */
  meanInFlight: number;
  /** Share of that time (0-1) with fewer than half the window in flight. */
  belowHalf: number;
  /** Share of that time (0-1) with nothing in flight. */
  empty: number;
}

/** Records claim and mark latencies and the in-flight window of one relay. */
export class DispatchTimeline {
  readonly #claims: number[] = [];
  readonly #marks: number[] = [];
  #inFlight = 0;
  #first = 0;
  #last = 0;
  #area = 0;
  #belowHalf = 0;
  #empty = 0;

  constructor(readonly window: number) {}

  /** `repository`, timing every `claimDue` and `markMany`. */
  repository(repository: OutboxRepository): OutboxRepository {
    const timed =
      <A extends unknown[], R>(into: number[], f: (...args: A) => Promise<R>) =>
      async (...args: A): Promise<R> => {
        const started = performance.now();
        try {
          return await f(...args);
        } finally {
          into.push(performance.now() - started);
        }
      };
    return new Proxy(repository, {
      get: (target, property) => {
        const value = Reflect.get(target, property, target);
        if (typeof value !== "function") return value;
        if (property === "claimDue") return timed(this.#claims, target.claimDue.bind(target));
        if (property === "markMany") return timed(this.#marks, target.markMany!.bind(target));
        return value.bind(target);
      },
    });
  }

  /** `runtime`, counting deliveries in flight (every `publishPreparedEvent` until it settles). */
  runtime(runtime: OutboxRuntime): OutboxRuntime {
    return new Proxy(runtime, {
      get: (target, property) => {
        const value = Reflect.get(target, property, target);
        if (typeof value !== "function") return value;
        if (property !== "publishPreparedEvent") return value.bind(target);
        return async (...args: Parameters<OutboxRuntime["publishPreparedEvent"]>) => {
          this.#move(1);
          try {
            return await target.publishPreparedEvent(...args);
          } finally {
            this.#move(-1);
          }
        };
      },
    });
  }

  /** The summary; zeros where nothing was recorded. */
  summary(): TimelineSummary {
    const span = this.#last - this.#first;
    const share = (ms: number) => span > 0 ? ms / span : 0;
    return {
      claimP50Ms: quantile(this.#claims, 0.5),
      claimP90Ms: quantile(this.#claims, 0.9),
      markP50Ms: quantile(this.#marks, 0.5),
      markP90Ms: quantile(this.#marks, 0.9),
      meanInFlight: share(this.#area),
      belowHalf: share(this.#belowHalf),
      empty: share(this.#empty),
    };
  }

  #move(delta: number): void {
    const now = performance.now();
    if (this.#first === 0) this.#first = now;
    else {
      const elapsed = now - this.#last;
      this.#area += this.#inFlight * elapsed;
      if (this.#inFlight < this.window / 2) this.#belowHalf += elapsed;
      if (this.#inFlight === 0) this.#empty += elapsed;
    }
    this.#last = now;
    this.#inFlight += delta;
  }
}

function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(q * (sorted.length - 1))];
}
