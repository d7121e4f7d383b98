/**
 * The dispatcher's circuit breaker: open while the broker is unavailable, so a broker outage
 * pauses dispatching instead of burning every message's attempts.
 *
 * @module
 */

import type { OutboxPublishError } from "../core/errors.ts";

/**
 * State of the dispatcher's circuit breaker.
 *
 * - `closed`: dispatching normally.
 * - `open`: a delivery failed as `unavailable`; nothing is claimed, the broker is probed with
 *   backoff.
 * - `half-open`: a probe succeeded; one trial message is claimed and delivered. Success closes
 *   the breaker, another `unavailable` failure opens it again.
 *
 * @example
 * ```ts
 * import type { CircuitState } from "@outbox/nats";
 * const state: CircuitState = "half-open";
 * ```
 */
export type CircuitState = "closed" | "open" | "half-open";

/** Probe timing of the breaker. Internal. */
export interface CircuitBreakerTiming {
  probeIntervalMs: number;
  probeMaxIntervalMs: number;
}

/** The breaker's state machine (no timers of its own). Internal. */
export class CircuitBreaker {
  #state: CircuitState = "closed";
  #openedAt = 0;
  #probes = 0;
  #error: OutboxPublishError | undefined;
  readonly #timing: CircuitBreakerTiming;

  constructor(timing: CircuitBreakerTiming) {
    this.#timing = timing;
  }

  get state(): CircuitState {
    return this.#state;
  }

  /** The failure that opened the breaker. */
  get error(): OutboxPublishError | undefined {
    return this.#error;
  }

  /** Opens the breaker; `true` when it was closed (a new pause begins). */
  trip(error: OutboxPublishError, now: number): boolean {
    const wasClosed = this.#state === "closed";
    if (wasClosed) {
      this.#openedAt = now;
      this.#probes = 0;
      this.#error = error;
    }
    this.#state = "open";
    return wasClosed;
  }

  /** Delay before the next probe: probeIntervalMs doubling up to probeMaxIntervalMs. */
  nextProbeDelayMs(): number {
    const { probeIntervalMs, probeMaxIntervalMs } = this.#timing;
    const delay = Math.min(probeMaxIntervalMs, probeIntervalMs * 2 ** Math.min(this.#probes, 30));
    this.#probes += 1;
    return delay;
  }

  /** A probe succeeded: allow one trial delivery. */
  halfOpen(): void {
    if (this.#state === "open") this.#state = "half-open";
  }

  /** The trial succeeded (or there was nothing to try): returns how long the pause lasted. */
  close(now: number): number | undefined {
    if (this.#state === "closed") return undefined;
    this.#state = "closed";
    this.#error = undefined;
    return Math.max(0, now - this.#openedAt);
  }
}
