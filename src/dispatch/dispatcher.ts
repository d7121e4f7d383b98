/**
 * OutboxDispatcher: keeps draining the outbox. Wake-ups (start, notify, idle polling, retry
 * timers), pipelined batches within one in-flight window, the circuit breaker, and a clean
 * `stop()`.
 *
 * @module
 */

import type { OutboxPublishError } from "../core/errors.ts";
import { nonNegative, positiveInteger } from "../core/limits.ts";
import { backoffCeilingMs, type RetryPolicy } from "../core/retry.ts";
import type { OutboxMessage, OutboxRepository, OutboxRuntime } from "../core/types.ts";
import { CircuitBreaker, type CircuitState } from "./circuit_breaker.ts";
import {
  type BatchEngine,
  defaultDispatchLimit,
  type DispatchOutboxResult,
  isScoped,
  type KeyFence,
  type OutboxDispatchHooks,
  resolveBatchSettings,
  settleClaimed,
  spendUnavailable,
  type UnavailableDecision,
} from "./dispatch_outbox.ts";
import {
  maxScopeProbeIntervalMs,
  type PausedScope,
  type PausedScopeInfo,
  pausedScopeInfo,
  PausedScopes,
  type ScopeResumedInfo,
} from "./paused_scopes.ts";
import { InFlightWindow } from "./window.ts";

/**
 * What {@linkcode OutboxDispatcherOptions.onPaused} receives.
 *
 * @example
 * ```ts
 * import type { PausedInfo } from "@outbox/nats";
 * const log = (info: PausedInfo) => console.warn("outbox paused:", info.error.code);
 * ```
 */
export interface PausedInfo {
  /** The `unavailable` failure that opened the circuit breaker. */
  error: OutboxPublishError;
}

/**
 * What {@linkcode OutboxDispatcherOptions.onResumed} receives.
 *
 * @example
 * ```ts
 * import type { ResumedInfo } from "@outbox/nats";
 * const log = (info: ResumedInfo) => console.info(`outbox resumed after ${info.pausedMs} ms`);
 * ```
 */
export interface ResumedInfo {
  /** How long dispatching was paused. */
  pausedMs: number;
}

/**
 * Options for {@linkcode OutboxDispatcher}.
 *
 * @example
 * ```ts
 * import type { OutboxDispatcherOptions } from "@outbox/nats";
 * const options: OutboxDispatcherOptions = {
 *   limit: 100,
 *   maxInFlight: 100,
 *   leaseMs: 30_000,
 *   idleRetryMs: 1_000,
 *   retry: { baseMs: 1_000, capMs: 300_000, maxAttempts: 10 },
 *   onDead: (message, info) => console.error("dead", message.id, info.lastError),
 *   onPaused: (info) => console.warn("broker unavailable", info.error.code),
 *   onResumed: (info) => console.info("resumed after", info.pausedMs, "ms"),
 * };
 * ```
 */
export interface OutboxDispatcherOptions extends OutboxDispatchHooks {
  /** Messages claimed per batch. @default {100} */
  limit?: number;
  /**
   * Deliveries awaiting acknowledgement at once, across the (at most two) batches in flight.
   *
   * @default {100}
   */
  maxInFlight?: number;
  /**
   * The claim lease. Deliveries are bounded to end before `leaseMs - min(leaseMs / 5, 5000)`
   * after the claim; the rest of the lease is kept for recording outcomes.
   *
   * @default {30000}
   */
  leaseMs?: number;
  /** Backoff and attempt budget for retryable failures. @default {defaultRetryPolicy} */
  retry?: RetryPolicy;
  /**
   * The broker-side key fence (see {@linkcode DispatchOutboxOptions.keyFence}): `"subject"`
   * publishes a keyed message only if the last message on its subject is its key's previous
   * one. For keys whose messages all go to one subject that nothing else publishes to.
   *
   * @default {"off"}
   */
  keyFence?: KeyFence;
  /**
   * The reference's fixed retry delay; now the backoff base when `retry.baseMs` is not given.
   *
   * @deprecated Use `retry.baseMs`.
   */
  retryDelayMs?: number;
  /**
   * Longest delay between an idle dispatcher's first `notify()` and the drain it triggers. Later
   * notifies never move the drain further out (unlike a trailing debounce).
   *
   * @default {0}
   */
  debounceMs?: number;
  /**
   * Idle polling interval: how long an idle dispatcher waits before looking for due messages it
   * was not notified about (committed by other processes, retries, expired leases). `false`
   * turns polling off.
   *
   * @default {1000}
   */
  idleRetryMs?: number | false;
  /**
   * First delay before probing the broker after the circuit breaker opened (and before retrying
   * after a store error); doubles on every failed probe.
   *
   * @default {250}
   */
  probeIntervalMs?: number;
  /** Largest delay between probes (and store-error retries). @default {10000} */
  probeMaxIntervalMs?: number;
  /** The clock for claim and mark timestamps (tests). @default {() => new Date()} */
  clock?: () => Date;
  /**
   * Receives errors the dispatcher recovers from on its own: a failed claim (retried with
   * backoff), marks that could not be recorded within the lease (the messages are recovered
   * when their lease expires), exceptions from hooks. Its own exceptions are ignored.
   *
   * @default {(error) => console.error(error)}
   */
  onError?: (error: unknown) => void;
  /** The circuit breaker opened: the broker is unavailable and claiming stopped. */
  onPaused?: (info: PausedInfo) => void;
  /** The circuit breaker closed again: dispatching resumed. */
  onResumed?: (info: ResumedInfo) => void;
  /**
   * One stream (or subject) failed as `unavailable` while the broker answers: only its messages
   * wait (not attempted, due again when its next probe is expected), everything else flows.
   */
  onScopePaused?: (info: PausedScopeInfo) => void;
  /** A paused stream (or subject) answered its probe: its messages flow again. */
  onScopeResumed?: (info: ScopeResumedInfo) => void;
  /** After every batch, with its counts. */
  onBatch?: (result: DispatchOutboxResult) => void;
}

/**
 * Keeps an outbox drained: claims due messages in batches and delivers them through the runtime
 * until nothing is due, then waits for `notify()`, the idle poll, or the next known retry.
 *
 * - Starts at once with a drain, so messages left by a crashed process are recovered without a
 *   new enqueue.
 * - `notify()` after a commit: calls coalesce, a drain starts within `debounceMs`, and a drain
 *   already running makes one more pass. Drains never run concurrently.
 * - Pipelining: while one batch is being delivered the next is claimed; both share the
 *   `maxInFlight` window. A delivered batch records its outcomes while the next ones are claimed
 *   and delivered (at most three batches claimed and not yet recorded).
 * - Circuit breaker: an `unavailable` failure stops claiming; the broker is probed with backoff
 *   (`runtime.probe()`), then one trial message is delivered, and dispatching resumes on its
 *   own. A trial that fails although the probe answered backs off on its own, so the next trial
 *   is another message. See the README for exactly how many attempts an outage can cost.
 * - Scoped pauses: an `unavailable` failure scoped to one stream or subject (`error.scope`, as
 *   `createJetStreamRuntime` reports a stream without leader or a full stream) pauses only that
 *   scope: its messages are not attempted and wait for `runtime.probeScope()` (with backoff up
 *   to 2 s, or `probeMaxIntervalMs` when smaller), the rest flows. Such a message goes `dead` once its `attempts`
 *   reached `retry.maxUnavailableAttempts`.
 * - `whenIdle()` resolves once nothing is due; `stop()` resolves once in-flight work settled and
 *   no timer is left.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { jetstream } from "@nats-io/jetstream";
 * import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const outbox = new MemoryOutboxRepository();
 * const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
 *   onDead: (message, info) => console.error("dead", message.id, info.lastError),
 * });
 * await outbox.enqueue({
 *   id: "order-1-created", kind: "event.publish", name: "order.created",
 *   subject: "orders.created", payload: JSON.stringify({ orderId: 1 }), headers: {},
 * });
 * dispatcher.notify(); // after the transaction committed
 * await dispatcher.whenIdle();
 * await dispatcher.stop();
 * await nc.close();
 * ```
 */
export class OutboxDispatcher implements AsyncDisposable {
  readonly #repository: OutboxRepository;
  readonly #runtime: OutboxRuntime;
  readonly #options: OutboxDispatcherOptions;
  readonly #limit: number;
  readonly #debounceMs: number;
  readonly #idleRetryMs: number | false;
  readonly #probeIntervalMs: number;
  readonly #probeMaxIntervalMs: number;
  readonly #clock: () => Date;
  readonly #engine: BatchEngine;
  readonly #breaker: CircuitBreaker;

  #stopped = false;
  #stopping: Promise<void> | undefined;
  #drain: Promise<void> | undefined;
  #dirty = false;
  #wakeTimer: ReturnType<typeof setTimeout> | undefined;
  #pollTimer: ReturnType<typeof setTimeout> | undefined;
  #pause: { timer: ReturnType<typeof setTimeout>; resolve: (ok: boolean) => void } | undefined;
  #claims = 0;
  #idleWaiters: Array<{ after: number; resolve: () => void }> = [];
  /**
   * When the retries this dispatcher scheduled are due (clock time, rounded up to
   * `retryResolutionMs`), so each one wakes it even with idle polling off.
   */
  #retryTimes = new RetryTimes();
  #storeErrors = 0;
  #blockedUntil = 0;
  /** Ends a {@linkcode #settledOrNotified} wait early (set while the loop waits there). */
  #notified: (() => void) | undefined;
  #abandoned = new Set<Promise<unknown>>();
  readonly #scopes = new PausedScopes();
  #scopeProbes = new Set<Promise<void>>();

  /** Creates the dispatcher and starts its first drain. Options are checked at once. */
  constructor(
    repository: OutboxRepository,
    runtime: OutboxRuntime,
    options: OutboxDispatcherOptions = {},
  ) {
    this.#repository = repository;
    this.#options = options;
    this.#limit = positiveInteger("limit", options.limit ?? defaultDispatchLimit);
    const settings = resolveBatchSettings(options);
    this.#debounceMs = nonNegative("debounceMs", options.debounceMs ?? 0);
    this.#idleRetryMs = options.idleRetryMs === false
      ? false
      : nonNegative("idleRetryMs", options.idleRetryMs ?? 1_000);
    this.#probeIntervalMs = nonNegative("probeIntervalMs", options.probeIntervalMs ?? 250);
    this.#probeMaxIntervalMs = Math.max(
      this.#probeIntervalMs,
      nonNegative("probeMaxIntervalMs", options.probeMaxIntervalMs ?? 10_000),
    );
    this.#clock = options.clock ?? (() => new Date());
    this.#breaker = new CircuitBreaker({
      probeIntervalMs: this.#probeIntervalMs,
      probeMaxIntervalMs: this.#probeMaxIntervalMs,
    });
    this.#runtime = runtime;
    this.#engine = {
      repository,
      runtime,
      ...settings,
      window: new InFlightWindow(settings.maxInFlight),
      hooks: {
        onDispatched: (message, info) => {
          // Its key's next message may be due now: look again before going idle.
          if (message.orderingKey !== undefined) this.#dirty = true;
          options.onDispatched?.(message, info);
        },
        onDead: options.onDead,
        onFailed: (message, info) => {
          // Failures while the breaker is open are handled by probing; the loop is still
          // running then, so tracking them too is harmless and keeps the rule simple.
          this.#noteRetry(info.nextAttemptAt);
          options.onFailed?.(message, info);
        },
      },
      now: this.#clock,
      halted: () => this.#breaker.state === "open",
      unavailable: (error, message) => this.#unavailable(error, message),
      held: (message) => this.#held(message),
      abandoned: (settled) => {
        this.#abandoned.add(settled);
        void settled.then(() => this.#abandoned.delete(settled));
      },
      report: (error) => this.#report(error),
    };
    this.notify();
  }

  /**
   * The circuit breaker's state: `closed` (dispatching), `open` (paused, probing the broker) or
   * `half-open` (delivering one trial message).
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
   * const dispatcher = new OutboxDispatcher(new MemoryOutboxRepository(), {
   *   publishPreparedEvent: () => Promise.resolve(),
   * });
   * console.log(dispatcher.state); // "closed"
   * await dispatcher.stop();
   * ```
   */
  get state(): CircuitState {
    return this.#breaker.state;
  }

  /**
   * The streams and subjects paused on their own (one stream without a leader, or full) while
   * the rest flows, oldest first.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
   * const dispatcher = new OutboxDispatcher(new MemoryOutboxRepository(), {
   *   publishPreparedEvent: () => Promise.resolve(),
   * });
   * console.log(dispatcher.pausedScopes); // []
   * await dispatcher.stop();
   * ```
   */
  get pausedScopes(): PausedScopeInfo[] {
    return this.#scopes.all().map(pausedScopeInfo);
  }

  /**
   * Signals that messages may be due (call it after the enqueueing transaction committed).
   * Cheap and safe to call often: calls coalesce into one drain that starts within
   * `debounceMs`; during a drain they cause one more pass. No-op after `stop()`.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
   * const dispatcher = new OutboxDispatcher(new MemoryOutboxRepository(), {
   *   publishPreparedEvent: () => Promise.resolve(),
   * });
   * dispatcher.notify();
   * dispatcher.notify(); // coalesced with the first
   * await dispatcher.stop();
   * ```
   */
  notify(): void {
    if (this.#stopped) return;
    this.#dirty = true;
    this.#notified?.();
    if (this.#drain || this.#wakeTimer !== undefined) return;
    // After a store error the poll timer is armed for the end of the backoff.
    if (Date.now() < this.#blockedUntil) return;
    this.#clearPoll();
    if (this.#debounceMs === 0) {
      // No timer: a 0 ms timeout still waits for the next timers phase (about 2 ms measured on
      // Deno), which is most of the commit-to-publish latency at a steady trickle. The drain
      // itself starts a microtask later, so calls in the same synchronous burst coalesce.
      this.#start();
      return;
    }
    this.#wakeTimer = setTimeout(() => {
      this.#wakeTimer = undefined;
      this.#start();
    }, this.#debounceMs);
  }

  /**
   * Resolves once a claim made after this call found nothing more due (messages failed with a
   * future `nextAttemptAt` are not due). While the broker is unavailable it waits for the
   * dispatcher to resume. Resolves at once after `stop()`.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
   * const outbox = new MemoryOutboxRepository();
   * const dispatcher = new OutboxDispatcher(outbox, { publishPreparedEvent: () => Promise.resolve() });
   * await outbox.enqueue({
   *   id: "m-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: "{}", headers: {},
   * });
   * await dispatcher.whenIdle();
   * console.log((await outbox.get("m-1"))?.state); // "dispatched"
   * await dispatcher.stop();
   * ```
   */
  whenIdle(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    return new Promise((resolve) => {
      this.#idleWaiters.push({ after: this.#claims, resolve });
      this.notify();
    });
  }

  /**
   * Stops dispatching: cancels timers and probes, claims nothing more, and resolves once the
   * batches already claimed are delivered and recorded (recording retries within the lease)
   * and no timer of the dispatcher is left. Idempotent.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
   * const dispatcher = new OutboxDispatcher(new MemoryOutboxRepository(), {
   *   publishPreparedEvent: () => Promise.resolve(),
   * });
   * await dispatcher.stop();
   * ```
   */
  stop(): Promise<void> {
    if (!this.#stopping) {
      this.#stopped = true;
      this.#dirty = false;
      if (this.#wakeTimer !== undefined) clearTimeout(this.#wakeTimer);
      this.#wakeTimer = undefined;
      this.#clearPoll();
      if (this.#pause) {
        clearTimeout(this.#pause.timer);
        this.#pause.resolve(false);
        this.#pause = undefined;
      }
      this.#scopes.clearTimers();
      for (const waiter of this.#idleWaiters.splice(0)) waiter.resolve();
      this.#stopping = (async () => {
        while (this.#drain) await this.#drain;
        while (this.#abandoned.size > 0) await Promise.all([...this.#abandoned]);
        while (this.#scopeProbes.size > 0) await Promise.all([...this.#scopeProbes]);
      })();
    }
    return this.#stopping;
  }

  /** Same as {@linkcode stop}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  #start(): void {
    if (this.#stopped || this.#drain) return;
    this.#clearPoll();
    // Start the loop a microtask later, so `#drain` is set before any of its code (and any hook
    // it calls, which may call stop()) runs.
    this.#drain = Promise.resolve()
      .then(() => this.#loop())
      .catch((error) => this.#report(error))
      .finally(() => {
        this.#drain = undefined;
        this.#afterDrain();
      });
  }

  async #loop(): Promise<void> {
    // Pipelining: while one batch is being delivered the next is claimed, and a batch whose
    // deliveries ended records its outcomes while the next ones are claimed and delivered.
    // `delivering` is the batch claimed before the current one; `recording` holds every batch
    // not yet fully settled, oldest first (at most `maxUnsettled`, so memory and the number of
    // statements in flight stay bounded).
    let delivering: Promise<void> | undefined;
    const recording: Promise<void>[] = [];
    const recorded = async () => {
      while (recording.length > 0) await recording.shift();
    };
    try {
      while (!this.#stopped) {
        if (this.#breaker.state === "open") {
          if (delivering) {
            await delivering;
            delivering = undefined;
            continue;
          }
          await recorded();
          if (!(await this.#awaitBroker())) return;
          continue;
        }
        if (recording.length >= maxUnsettled) {
          // Wait for room, then look again: stop() may have been called, or the breaker may
          // have opened, while the oldest batch was being recorded.
          while (recording.length >= maxUnsettled) await recording.shift();
          continue;
        }
        const trial = this.#breaker.state === "half-open";
        const limit = trial ? 1 : this.#limit;
        this.#dirty = false;
        const seq = ++this.#claims;
        const startedAt = performance.now();
        let claimed: OutboxMessage[];
        try {
          claimed = await this.#repository.claimDue(limit, this.#clock(), {
            leaseMs: this.#engine.leaseMs,
          });
          this.#storeErrors = 0;
        } catch (error) {
          this.#report(error);
          this.#dirty = true;
          this.#blockedUntil = Date.now() + this.#backoff(this.#storeErrors++);
          return;
        }
        if (claimed.length === 0) {
          if (trial) this.#resume();
          // Nothing due now: wait for the batches still settling, unless notify() brings new
          // work first (then claim it at once, as below).
          const newest = recording[recording.length - 1];
          if (newest && !trial && await this.#settledOrNotified(newest)) continue;
          if (delivering) {
            await delivering;
            delivering = undefined;
          }
          await recorded();
          if (this.#dirty || this.#breaker.state !== "closed") continue;
          this.#reachedIdle(seq);
          return;
        }
        const batch = this.#settle(claimed, startedAt, trial);
        recording.push(batch.settled);
        if (trial) {
          await recorded();
          continue;
        }
        if (delivering) await delivering;
        delivering = batch.delivered;
        if (claimed.length < limit && !this.#dirty) {
          // A short batch: the outbox looked empty. Wait for it to settle, unless notify()
          // brings new work first: then claim at once while it keeps settling (pipelined as
          // above), instead of making the new message wait for this batch's PubAcks and marks.
          if (await this.#settledOrNotified(batch.settled)) continue;
          await batch.delivered;
          delivering = undefined;
          await recorded();
          if (this.#dirty || this.#breaker.state !== "closed") continue;
          this.#reachedIdle(seq);
          return;
        }
      }
    } finally {
      if (delivering) await delivering;
      await recorded();
    }
  }

  /**
   * `true` when notify() came first, or already had since the last claim started (the batch
   * keeps settling), `false` once `settled`.
   */
  #settledOrNotified(settled: Promise<void>): Promise<boolean> {
    if (this.#dirty) return Promise.resolve(true);
    return new Promise<boolean>((resolve) => {
      this.#notified = () => resolve(true);
      void settled.then(() => resolve(false));
    }).finally(() => {
      this.#notified = undefined;
    });
  }

  /**
   * Delivers and records one batch. `delivered` resolves once every delivery ended, `settled`
   * once the outcomes are recorded (or recording gave up). Neither rejects.
   */
  #settle(
    claimed: OutboxMessage[],
    startedAt: number,
    trial: boolean,
  ): { delivered: Promise<void>; settled: Promise<void> } {
    let onDelivered!: () => void;
    const delivered = new Promise<void>((resolve) => onDelivered = resolve);
    const settled = (async () => {
      let result: DispatchOutboxResult;
      try {
        result = await settleClaimed(this.#engine, claimed, startedAt, onDelivered);
      } catch (error) {
        // Outcomes could not be recorded within the lease; the messages are claimed again when
        // it expires (a re-publish then lands in JetStream's duplicate window).
        this.#report(error);
        return;
      } finally {
        onDelivered();
      }
      if (trial && this.#breaker.state === "half-open") this.#resume();
      if (this.#options.onBatch) this.#call(() => this.#options.onBatch?.(result));
    })();
    return { delivered, settled };
  }

  /** Waits (cancellably) and probes; `false` when stopped. */
  async #awaitBroker(): Promise<boolean> {
    if (!(await this.#sleep(this.#breaker.nextProbeDelayMs()))) return false;
    const probe = this.#runtime.probe?.bind(this.#runtime);
    if (probe) {
      let ok = false;
      try {
        ok = (await probe()) === true;
      } catch {
        ok = false;
      }
      if (this.#stopped) return false;
      if (!ok) return true;
    }
    this.#breaker.halfOpen();
    return true;
  }

  #sleep(ms: number): Promise<boolean> {
    if (this.#stopped) return Promise.resolve(false);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#pause = undefined;
        resolve(true);
      }, ms);
      this.#pause = { timer, resolve };
    });
  }

  /** An `unavailable` failure: pause its scope, or open the breaker; when to retry it. */
  #unavailable(error: OutboxPublishError, message: OutboxMessage): UnavailableDecision {
    const policy = this.#engine.policy;
    if (isScoped(error)) {
      const result = this.#scopes.pause(error, message.subject, Date.now());
      if (!result) return { retryAt: this.#clock() };
      if (result.isNew) {
        this.#scheduleScopeProbe(result.paused);
        if (this.#options.onScopePaused) {
          const info = pausedScopeInfo(result.paused);
          this.#call(() => this.#options.onScopePaused?.(info));
        }
      }
      return spendUnavailable(message, policy, this.#holdUntil(result.paused));
    }
    if (this.#breaker.state === "half-open") {
      // The trial failed although the probe answered: maybe this message's own trouble. It backs
      // off on its own (within its budget), so the next trial is another message.
      this.#trip(error);
      const delay = Math.max(this.#probeMaxIntervalMs, backoffCeilingMs(message.attempts, policy));
      return spendUnavailable(message, policy, new Date(this.#clock().getTime() + delay));
    }
    this.#trip(error);
    return { retryAt: this.#clock() };
  }

  /** The paused scope holding `message` back, and until when. */
  #held(message: OutboxMessage): { error: OutboxPublishError; until: Date } | undefined {
    if (this.#scopes.size === 0) return undefined;
    const paused = this.#scopes.holding(message.subject);
    return paused ? { error: paused.error, until: this.#holdUntil(paused) } : undefined;
  }

  /**
   * When a held message is due again: just after its scope's next probe starts (so a release
   * finds it due); while a probe runs (a stream without leader makes it last the API timeout),
   * when that probe should have ended, so the messages are not claimed over and over meanwhile.
   */
  #holdUntil(paused: PausedScope): Date {
    const margin = Math.min(1_000, Math.max(50, this.#probeIntervalMs));
    const now = Date.now();
    // Due just after the next probe starts: a stream that answers again is released before the
    // margin has passed. Claimed while a probe runs: due when it is expected to have ended (it
    // takes about as long as the last one), or one probe delay from now.
    let wait = paused.nextProbeAt - now;
    if (paused.probing) {
      wait = paused.probeStartedAt + paused.lastProbeMs - now;
      if (wait <= 0) wait = this.#scopeProbeDelay(paused);
    }
    return new Date(this.#clock().getTime() + Math.max(0, wait) + margin);
  }

  #scopeProbeDelay(paused: PausedScope): number {
    return Math.min(
      this.#probeMaxIntervalMs,
      maxScopeProbeIntervalMs,
      this.#probeIntervalMs * 2 ** Math.min(paused.probes, 30),
    );
  }

  #scheduleScopeProbe(paused: PausedScope): void {
    if (this.#stopped) return;
    const delay = this.#scopeProbeDelay(paused);
    paused.probes += 1;
    paused.nextProbeAt = Date.now() + delay;
    paused.timer = setTimeout(() => {
      paused.timer = undefined;
      this.#probeScope(paused);
    }, delay);
  }

  #probeScope(paused: PausedScope): void {
    const probe = this.#runtime.probeScope?.bind(this.#runtime);
    paused.probing = true;
    paused.probeStartedAt = Date.now();
    const run = (async () => {
      let ok = true;
      if (probe) {
        try {
          ok = (await probe(paused.scope)) === true;
        } catch {
          ok = false;
        }
      }
      paused.probing = false;
      paused.lastProbeMs = Date.now() - paused.probeStartedAt;
      if (this.#stopped || !this.#scopes.has(paused)) return;
      if (!ok) {
        this.#scheduleScopeProbe(paused);
        return;
      }
      const pausedMs = this.#scopes.release(paused, Date.now());
      if (this.#options.onScopeResumed) {
        const info = { scope: paused.scope, pausedMs };
        this.#call(() => this.#options.onScopeResumed?.(info));
      }
      this.notify();
    })();
    this.#scopeProbes.add(run);
    void run.finally(() => this.#scopeProbes.delete(run));
  }

  #trip(error: OutboxPublishError): void {
    if (this.#breaker.trip(error, Date.now()) && this.#options.onPaused) {
      this.#call(() => this.#options.onPaused?.({ error }));
    }
  }

  #resume(): void {
    const pausedMs = this.#breaker.close(Date.now());
    if (pausedMs !== undefined && this.#options.onResumed) {
      this.#call(() => this.#options.onResumed?.({ pausedMs }));
    }
  }

  #noteRetry(at: Date): void {
    this.#retryTimes.add(at.getTime());
  }

  #reachedIdle(seq: number): void {
    if (this.#idleWaiters.length === 0) return;
    const waiting = this.#idleWaiters;
    this.#idleWaiters = [];
    for (const waiter of waiting) {
      if (waiter.after < seq) waiter.resolve();
      else this.#idleWaiters.push(waiter);
    }
  }

  /** Arms the next wake-up after a drain: now if notified, else poll / retry / backoff time. */
  #afterDrain(): void {
    if (this.#stopped) return;
    const now = Date.now();
    if (this.#dirty && now >= this.#blockedUntil) {
      this.notify();
      return;
    }
    let delay: number;
    if (this.#dirty) {
      // A store error: wait for the end of its backoff, whatever polling or retries would say.
      delay = this.#blockedUntil - now;
    } else {
      delay = this.#idleRetryMs === false ? Infinity : this.#idleRetryMs;
      const nextRetry = this.#retryTimes.next();
      if (nextRetry !== undefined) delay = Math.min(delay, nextRetry - this.#clock().getTime());
    }
    if (!Number.isFinite(delay)) return;
    this.#clearPoll();
    this.#pollTimer = setTimeout(() => {
      this.#pollTimer = undefined;
      this.#retryTimes.dropUntil(this.#clock().getTime());
      this.#dirty = true;
      this.#start();
    }, Math.max(0, delay));
  }

  #clearPoll(): void {
    if (this.#pollTimer !== undefined) clearTimeout(this.#pollTimer);
    this.#pollTimer = undefined;
  }

  #backoff(failures: number): number {
    return Math.min(this.#probeMaxIntervalMs, this.#probeIntervalMs * 2 ** Math.min(failures, 30));
  }

  #call(fn: () => void): void {
    try {
      fn();
    } catch (error) {
      this.#report(error);
    }
  }

  #report(error: unknown): void {
    try {
      if (this.#options.onError) this.#options.onError(error);
      else console.error("outbox dispatcher:", error);
    } catch {
      // An error callback must not break dispatcher recovery.
    }
  }
}

/** Retry times are kept rounded up to this, so a burst of failures costs a few entries. */
const retryResolutionMs = 50;

/** The distinct (rounded) times at which scheduled retries become due, earliest first. */
class RetryTimes {
  #times: number[] = [];

  add(time: number): void {
    const rounded = Math.ceil(time / retryResolutionMs) * retryResolutionMs;
    const times = this.#times;
    let low = 0;
    let high = times.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (times[middle] < rounded) low = middle + 1;
      else high = middle;
    }
    if (times[low] !== rounded) times.splice(low, 0, rounded);
  }

  /** The earliest time still pending. */
  next(): number | undefined {
    return this.#times[0];
  }

  /** Forgets the times that are due by `now` (their retries are claimable now). */
  dropUntil(now: number): void {
    let count = 0;
    while (count < this.#times.length && this.#times[count] <= now) count++;
    if (count > 0) this.#times.splice(0, count);
  }
}

/**
 * Batches claimed and not yet settled, at most: one being claimed, one being delivered, and one
 * recording its outcomes (at most two are ever delivering: the window is shared).
 */
const maxUnsettled = 3;
