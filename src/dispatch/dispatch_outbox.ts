/**
 * One dispatch batch: claim due messages, deliver them concurrently within an in-flight window,
 * and record every outcome with one batched mark.
 *
 * @module
 */

import {
  errorMessage,
  OutboxCorruptRecordError,
  OutboxOutcomeRefusedError,
  OutboxPublishError,
  OutboxStoreClosedError,
  OutboxValidationError,
} from "../core/errors.ts";
import { outboxMessageToPreparedEvent } from "../core/events.ts";
import { positiveInteger } from "../core/limits.ts";
import { applyMarks } from "../core/marks.ts";
import {
  backoffDelayMs,
  type ResolvedRetryPolicy,
  resolveRetryPolicy,
  type RetryPolicy,
} from "../core/retry.ts";
import { addMs, defaultLeaseMs } from "../core/time.ts";
import { storableErrorText, storableOutcome } from "../core/storable_text.ts";
import type {
  JsonValue,
  OutboxClaim,
  OutboxMark,
  OutboxMessage,
  OutboxPublishReceipt,
  OutboxRepository,
  OutboxRuntime,
} from "../core/types.ts";
import { InFlightWindow } from "./window.ts";

/**
 * Default number of messages claimed per batch.
 *
 * @example
 * ```ts
 * import { defaultDispatchLimit } from "@outbox/nats";
 * console.log(defaultDispatchLimit); // 100
 * ```
 */
export const defaultDispatchLimit = 100;

/**
 * Default in-flight window: deliveries awaiting their acknowledgement at once.
 *
 * @example
 * ```ts
 * import { defaultMaxInFlight } from "@outbox/nats";
 * console.log(defaultMaxInFlight); // 100
 * ```
 */
export const defaultMaxInFlight = 100;

/**
 * What {@linkcode OutboxDispatchHooks.onDispatched} learns about a delivered message.
 *
 * @example
 * ```ts
 * import type { DispatchedInfo } from "@outbox/nats";
 * const info: DispatchedInfo = { duplicate: true, receipt: { stream: "ORDERS", seq: 7, duplicate: true } };
 * ```
 */
export interface DispatchedInfo {
  /** The broker already had this message id (a re-publish absorbed by the duplicate window). */
  duplicate: boolean;
  /** The runtime's receipt (for JetStream: the PubAck's stream and sequence). */
  receipt?: OutboxPublishReceipt;
  /** The job outcome stored on the message, for job kinds. */
  outcome?: JsonValue;
}

/**
 * What {@linkcode OutboxDispatchHooks.onFailed} learns about a failed attempt.
 *
 * @example
 * ```ts
 * import { OutboxPublishError, type FailedInfo } from "@outbox/nats";
 * const error = new OutboxPublishError("retryable", "no stream", { code: "no_stream" });
 * const info: FailedInfo = { error, lastError: "no_stream: no stream", nextAttemptAt: new Date() };
 * ```
 */
export interface FailedInfo {
  /** The classified failure (`retryable` or `unavailable`). */
  error: OutboxPublishError;
  /** What was stored as `lastError`. */
  lastError: string;
  /** When the message is due again. */
  nextAttemptAt: Date;
}

/**
 * What {@linkcode OutboxDispatchHooks.onDead} learns about a message moved to `dead`.
 *
 * @example
 * ```ts
 * import type { DeadInfo } from "@outbox/nats";
 * const info: DeadInfo = { error: new Error("boom"), lastError: "boom" };
 * ```
 */
export interface DeadInfo {
  /** Why: an `OutboxPublishError`, or an `OutboxCorruptRecordError` for an undecodable message. */
  error: Error;
  /** What was stored as `lastError`. */
  lastError: string;
}

/**
 * Callbacks for logs and metrics, called once per message after its outcome was recorded (never
 * for a claim that was superseded meanwhile). `message` is the message as claimed (state
 * `claimed`, `attempts` counting this attempt); the outcome is in the callback's name and `info`.
 * Exceptions they throw are reported to `onError` where there is one, and never change an
 * outcome.
 *
 * @example
 * ```ts
 * import type { OutboxDispatchHooks } from "@outbox/nats";
 * const hooks: OutboxDispatchHooks = {
 *   onDispatched: (message, info) => console.log("sent", message.id, info.duplicate),
 *   onFailed: (message, info) => console.warn("retry", message.id, info.lastError),
 *   onDead: (message, info) => console.error("dead", message.id, info.lastError),
 * };
 * ```
 */
export interface OutboxDispatchHooks {
  /** A message was delivered (or was already in the stream: `info.duplicate`). */
  onDispatched?: (message: OutboxMessage, info: DispatchedInfo) => void;
  /** An attempt failed; the message is due again at `info.nextAttemptAt`. */
  onFailed?: (message: OutboxMessage, info: FailedInfo) => void;
  /** A message went `dead` and needs an operator (`listDead` / `requeue`). */
  onDead?: (message: OutboxMessage, info: DeadInfo) => void;
}

/**
 * Options for {@linkcode dispatchOutbox}.
 *
 * @example
 * ```ts
 * import type { DispatchOutboxOptions } from "@outbox/nats";
 * const options: DispatchOutboxOptions = {
 *   limit: 200,
 *   maxInFlight: 64,
 *   leaseMs: 30_000,
 *   retry: { baseMs: 500, capMs: 60_000, maxAttempts: 8 },
 * };
 * ```
 */
export interface DispatchOutboxOptions extends OutboxDispatchHooks {
  /** Messages claimed in the batch. @default {100} */
  limit?: number;
  /** Deliveries awaiting acknowledgement at once. @default {100} */
  maxInFlight?: number;
  /**
   * The claim lease. Every delivery of the batch must finish before
   * `leaseMs - min(leaseMs / 5, 5000)` has passed since the claim; later ones are abandoned
   * as `unavailable` (see the README, "Leases").
   *
   * @default {30000}
   */
  leaseMs?: number;
  /** Backoff and attempt budget for retryable failures. @default {defaultRetryPolicy} */
  retry?: RetryPolicy;
  /**
   * The broker-side key fence, for ordering keys whose messages all go to ONE subject that
   * nothing else publishes to (a subject per key):
   *
   * - `"subject"`: a keyed message whose key's previous message was stored at stream sequence
   *   `n` (its `keySequence`) is published with `expectedLastSubjectSequence: n` (JetStream:
   *   `Nats-Expected-Last-Subject-Sequence`), so the broker refuses it unless the last message
   *   on its subject is that previous one: a stale claim's late publish (a zombie whose lease
   *   expired) cannot land after the key's later messages. A retry whose first attempt was
   *   stored is recognised and counts as dispatched. A refusal because something else is last
   *   on the subject is `permanent` (`key_fence`): the message goes `dead` and its key blocks
   *   until an operator retries or skips it, which publishes the key's next message unfenced.
   *   The first message of a key (no `keySequence` yet) is published unfenced.
   * - `"off"`: no expectation is sent.
   *
   * Either way, dispatched marks of keyed messages carry the PubAck's stream sequence, so the
   * store always knows each key's last sequence. Needs a runtime that honours
   * `expectedLastSubjectSequence` (the JetStream runtime does) and, on SQL, schema version 4.
   *
   * @default {"off"}
   */
  keyFence?: KeyFence;
  /**
   * The reference's fixed retry delay; now the backoff base (`retry.baseMs`) when that is not
   * given.
   *
   * @deprecated Use `retry.baseMs`.
   */
  retryDelayMs?: number;
  /** The time used for the claim and the marks (tests). @default {new Date()} */
  now?: Date;
  /** Receives exceptions thrown by hooks. */
  onError?: (error: unknown) => void;
}

/**
 * The broker-side key fence setting of {@linkcode DispatchOutboxOptions.keyFence}.
 *
 * @example
 * ```ts
 * import type { KeyFence } from "@outbox/nats";
 * const fence: KeyFence = "subject";
 * ```
 */
export type KeyFence = "subject" | "off";

/**
 * The outcome of one batch.
 *
 * @example
 * ```ts
 * import type { DispatchOutboxResult } from "@outbox/nats";
 * const result: DispatchOutboxResult = {
 *   claimed: 3, dispatched: 2, duplicates: 0, failed: 1, unavailable: 0, dead: 0, superseded: 0,
 * };
 * ```
 */
export interface DispatchOutboxResult {
  /** Messages the batch claimed. */
  claimed: number;
  /** Messages recorded as `dispatched` (duplicates included). */
  dispatched: number;
  /** Of `dispatched`: the broker already had them (PubAck `duplicate: true`). */
  duplicates: number;
  /** Messages recorded as `failed` (due again later). */
  failed: number;
  /** Of `failed`: failed or not attempted because the broker was unavailable. */
  unavailable: number;
  /** Messages recorded as `dead`. */
  dead: number;
  /** Outcomes not recorded because another claimer had taken the message over (fencing). */
  superseded: number;
}

/**
 * Claims one batch of due messages and dispatches it.
 *
 * - `event.publish` messages are published through `runtime.publishPreparedEvent`, job kinds
 *   go to `runtime.dispatchJobSubmission` (its result is stored as `outcome`); up to
 *   `maxInFlight` at once.
 * - Outcomes are recorded with one `markMany` call (one mark at a time on stores without it).
 * - Per-message isolation: an undecodable message (payload not JSON), a job without a
 *   `dispatchJobSubmission` handler, or a `permanent` failure goes `dead` with a clear
 *   `lastError`; its neighbours are dispatched as usual.
 * - A `retryable` failure is retried after a full-jitter backoff (`retry`); at `maxAttempts` the
 *   message goes `dead`.
 * - An `unavailable` failure (broker unreachable, no PubAck in time) is recorded as `failed`,
 *   due at once, and never makes a message `dead`; the batch then starts no further deliveries
 *   (they are recorded the same way without being attempted). One scoped to a single stream or
 *   subject (`error.scope`) stops nothing else, and moves the message to `dead` once its
 *   `attempts` reached `retry.maxUnavailableAttempts`.
 *
 * Use {@linkcode OutboxDispatcher} to run batches continuously, with pipelining and a circuit
 * breaker.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { jetstream } from "@nats-io/jetstream";
 * import { createJetStreamRuntime, dispatchOutbox, MemoryOutboxRepository } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const outbox = new MemoryOutboxRepository();
 * const result = await dispatchOutbox(outbox, createJetStreamRuntime(jetstream(nc)), { limit: 50 });
 * console.log(result.dispatched, result.failed, result.dead);
 * await nc.close();
 * ```
 */
export async function dispatchOutbox(
  repository: OutboxRepository,
  runtime: OutboxRuntime,
  options: DispatchOutboxOptions = {},
): Promise<DispatchOutboxResult> {
  const limit = positiveInteger("limit", options.limit ?? defaultDispatchLimit);
  const settings = resolveBatchSettings(options);
  const now = options.now;
  let halted = false;
  const pending: Promise<unknown>[] = [];
  const engine: BatchEngine = {
    repository,
    runtime,
    ...settings,
    window: new InFlightWindow(settings.maxInFlight),
    hooks: options,
    now: now ? () => now : () => new Date(),
    halted: () => halted,
    unavailable: (error, message) => {
      if (isScoped(error)) return spendUnavailable(message, settings.policy, engine.now());
      halted = true;
      return { retryAt: engine.now() };
    },
    abandoned: (promise) => {
      pending.push(promise);
    },
    report: (error) => {
      try {
        options.onError?.(error);
      } catch {
        // An error callback must not break dispatching.
      }
    },
  };
  const startedAt = performance.now();
  const claimed = await repository.claimDue(limit, engine.now(), { leaseMs: settings.leaseMs });
  try {
    return await settleClaimed(engine, claimed, startedAt);
  } finally {
    // Deliveries abandoned at their deadline still hold timers of their own; let them finish so
    // a caller who awaited us leaves nothing running.
    await Promise.all(pending);
  }
}

/** Settings shared by `dispatchOutbox` and `OutboxDispatcher`. Internal. */
export interface BatchSettings {
  policy: ResolvedRetryPolicy;
  leaseMs: number;
  maxInFlight: number;
  /** The broker-side key fence is on (`keyFence: "subject"`). */
  keyFence: boolean;
}

/** Checks and fills in the batch settings. Internal. */
export function resolveBatchSettings(options: {
  maxInFlight?: number;
  leaseMs?: number;
  retry?: RetryPolicy;
  retryDelayMs?: number;
  keyFence?: KeyFence;
}): BatchSettings {
  const retry = options.retry ?? {};
  const policy = resolveRetryPolicy(
    options.retryDelayMs !== undefined && retry.baseMs === undefined
      ? { ...retry, baseMs: options.retryDelayMs }
      : retry,
  );
  const leaseMs = options.leaseMs ?? defaultLeaseMs;
  if (!Number.isFinite(leaseMs) || leaseMs < 10) {
    throw new OutboxValidationError("leaseMs", `leaseMs must be a number >= 10, got ${leaseMs}`);
  }
  return {
    policy,
    leaseMs,
    maxInFlight: positiveInteger("maxInFlight", options.maxInFlight ?? defaultMaxInFlight),
    keyFence: checkedKeyFence(options.keyFence),
  };
}

function checkedKeyFence(keyFence: unknown): boolean {
  if (keyFence === undefined || keyFence === "off") return false;
  if (keyFence === "subject") return true;
  throw new OutboxValidationError(
    "keyFence",
    `keyFence must be "subject" or "off", got ${JSON.stringify(keyFence)}`,
  );
}

/**
 * The time reserved at the end of a lease for recording outcomes: deliveries must end before
 * `leaseMs - settleReserveMs(leaseMs)`. Internal.
 */
export function settleReserveMs(leaseMs: number): number {
  return Math.min(leaseMs / 5, 5_000);
}

/** What a batch needs from its owner (`dispatchOutbox` or `OutboxDispatcher`). Internal. */
export interface BatchEngine extends BatchSettings {
  repository: OutboxRepository;
  runtime: OutboxRuntime;
  window: InFlightWindow;
  hooks: OutboxDispatchHooks;
  /** Wall-clock time for marks and backoff. */
  now(): Date;
  /** Whether deliveries must not start (the broker is unavailable). */
  halted(): boolean;
  /** A delivery failed as `unavailable`: when to retry it, or whether its budget is spent. */
  unavailable(error: OutboxPublishError, message: OutboxMessage): UnavailableDecision;
  /** The paused scope holding `message` back (it is not attempted), if any. */
  held?(message: OutboxMessage): { error: OutboxPublishError; until: Date } | undefined;
  /** A delivery abandoned at its deadline; settles when the runtime finally gives up. */
  abandoned(settled: Promise<unknown>): void;
  /** A hook threw. */
  report(error: unknown): void;
}

/** How an `unavailable` failure is recorded: due again at `retryAt`, or dead. Internal. */
export type UnavailableDecision = { retryAt: Date } | { dead: true };

/** Whether an error is scoped to one stream or subject (others keep flowing). Internal. */
export function isScoped(error: OutboxPublishError): boolean {
  return error.scope?.kind === "stream" || error.scope?.kind === "subject";
}

/**
 * An `unavailable` failure of the message's own scope: due at `retryAt` unless its `attempts`
 * reached `maxUnavailableAttempts`. Internal.
 */
export function spendUnavailable(
  message: OutboxMessage,
  policy: ResolvedRetryPolicy,
  retryAt: Date,
): UnavailableDecision {
  return message.attempts >= policy.maxUnavailableAttempts ? { dead: true } : { retryAt };
}

type Settlement =
  | { state: "dispatched"; info: DispatchedInfo }
  | { state: "failed"; info: FailedInfo; unavailable: boolean }
  | { state: "dead"; info: DeadInfo };

/**
 * Delivers already-claimed messages and records the outcomes. `claimStartedAt` is
 * `performance.now()` just before the claim (the lease runs from there). `onDelivered` is called
 * once every delivery has ended, before the outcomes are recorded (the dispatcher claims its next
 * batch from then on). Marks that fail (a store blip) are retried with backoff until the lease
 * ends; after that the error is thrown and the messages are recovered by a later claim when their
 * lease expires. Internal.
 */
export async function settleClaimed(
  engine: BatchEngine,
  messages: readonly OutboxMessage[],
  claimStartedAt: number,
  onDelivered?: () => void,
): Promise<DispatchOutboxResult> {
  const result: DispatchOutboxResult = {
    claimed: messages.length,
    dispatched: 0,
    duplicates: 0,
    failed: 0,
    unavailable: 0,
    dead: 0,
    superseded: 0,
  };
  if (messages.length === 0) return result;
  const deadline = new BatchDeadline(
    engine,
    claimStartedAt + engine.leaseMs - settleReserveMs(engine.leaseMs),
  );
  let settlements: Settlement[];
  try {
    settlements = await Promise.all(deliverInKeyOrder(engine, messages, deadline));
  } finally {
    deadline.clear();
  }
  onDelivered?.();
  // The hooks see the error text the stores keep (see storableErrorText).
  for (const settlement of settlements) {
    if (settlement.state !== "dispatched") {
      settlement.info.lastError = storableErrorText(settlement.info.lastError);
    }
  }
  const marks = messages.map((message, index) => toMark(message, settlements[index]));
  // A store that refuses a job's outcome after all (it has no `outcomeRoomBytes`, or a wrapper
  // hid it) stored the message dead: record and report it as such.
  const refused = (error: OutboxOutcomeRefusedError): boolean => {
    const index = marks.findIndex((mark) =>
      mark.state === "dispatched" && mark.outcome !== undefined && mark.claim.id === error.id
    );
    if (index < 0) return false;
    const cause = new OutboxPublishError(
      "permanent",
      error.lastError.replace(/^outcome: /, ""),
      { code: "outcome", cause: error },
    );
    settlements[index] = { state: "dead", info: { error: cause, lastError: error.lastError } };
    marks[index] = { claim: marks[index].claim, state: "dead", error: error.lastError };
    return true;
  };
  const applied = await applyMarksWithinLease(
    engine,
    marks,
    claimStartedAt + engine.leaseMs,
    refused,
  );
  for (let index = 0; index < messages.length; index++) {
    const settlement = settlements[index];
    if (!applied[index]) {
      result.superseded += 1;
      continue;
    }
    const message = messages[index];
    try {
      switch (settlement.state) {
        case "dispatched":
          result.dispatched += 1;
          if (settlement.info.duplicate) result.duplicates += 1;
          engine.hooks.onDispatched?.(message, settlement.info);
          break;
        case "failed":
          result.failed += 1;
          if (settlement.unavailable) result.unavailable += 1;
          engine.hooks.onFailed?.(message, settlement.info);
          break;
        case "dead":
          result.dead += 1;
          engine.hooks.onDead?.(message, settlement.info);
          break;
      }
    } catch (error) {
      engine.report(error);
    }
  }
  return result;
}

/**
 * Starts every delivery of a batch: messages of different ordering keys (and messages without
 * one) concurrently, messages of one key one after the other in claim order. A store's claim
 * hands out one message per key at a time, so a batch normally holds at most one per key; if it
 * holds more (a store without ordering keys), a message whose predecessor of the same key was
 * not delivered is not attempted either.
 */
function deliverInKeyOrder(
  engine: BatchEngine,
  messages: readonly OutboxMessage[],
  deadline: BatchDeadline,
): Promise<Settlement>[] {
  const last = new Map<string, Promise<Settlement>>();
  return messages.map((message) => {
    const key = message.orderingKey;
    if (key === undefined) return deliver(engine, message, deadline);
    const previous = last.get(key);
    const settlement = previous === undefined
      ? deliver(engine, message, deadline)
      : previous.then((earlier) =>
        earlier.state === "dispatched" ? deliver(engine, message, deadline) : keyHeld(engine)
      );
    last.set(key, settlement);
    return settlement;
  });
}

/** Not attempted: an earlier message of the same ordering key in the batch was not delivered. */
function keyHeld(engine: BatchEngine): Settlement {
  const error = new OutboxPublishError(
    "retryable",
    "not attempted: an earlier message of its ordering key was not delivered",
    { code: "key_order" },
  );
  return {
    state: "failed",
    info: { error, lastError: describe(error), nextAttemptAt: engine.now() },
    unavailable: false,
  };
}

/**
 * One message's delivery, never rejecting: whatever throws while it is classified (a thrown
 * value whose text cannot be read, a receipt whose fields throw) settles that message `dead`
 * instead of failing the whole batch's settlement, every time its lease runs out.
 */
function deliver(
  engine: BatchEngine,
  message: OutboxMessage,
  deadline: BatchDeadline,
): Promise<Settlement> {
  return attempt(engine, message, deadline).catch((error) =>
    dead(
      new OutboxPublishError(
        "permanent",
        `the delivery's result could not be read: ${errorMessage(error)}`,
        { code: "unreadable", cause: error },
      ),
    )
  );
}

async function attempt(
  engine: BatchEngine,
  message: OutboxMessage,
  deadline: BatchDeadline,
): Promise<Settlement> {
  // Decisions that need no broker come first, so a poison message is settled even while the
  // broker is down.
  let start: (timeoutMs: number) => Promise<void | OutboxPublishReceipt | JsonValue>;
  if (message.kind === "event.publish") {
    let event;
    try {
      event = outboxMessageToPreparedEvent(message);
    } catch (error) {
      const cause = error instanceof Error ? error : new Error(errorMessage(error));
      return { state: "dead", info: { error: cause, lastError: cause.message } };
    }
    const hold = engine.held?.(message);
    if (hold) {
      // Its stream (or subject) is paused: not attempted, due when the scope's probe is next
      // expected to release it.
      const error = new OutboxPublishError("unavailable", `not attempted: ${hold.error.message}`, {
        code: hold.error.code,
        cause: hold.error,
        ...(hold.error.scope ? { scope: hold.error.scope } : {}),
      });
      const decision = spendUnavailable(message, engine.policy, hold.until);
      return "dead" in decision
        ? gaveUp(message, error)
        : retryLater(engine, error, decision.retryAt);
    }
    // The key fence: publish only on top of the key's previous message (see `keyFence`).
    const expected = engine.keyFence && message.orderingKey !== undefined
      ? message.keySequence
      : undefined;
    start = (timeoutMs) =>
      engine.runtime.publishPreparedEvent(
        event,
        expected === undefined
          ? { timeoutMs }
          : { timeoutMs, expectedLastSubjectSequence: expected },
      );
  } else if (message.kind === "job.create" || message.kind === "job.submit") {
    const handler = engine.runtime.dispatchJobSubmission?.bind(engine.runtime);
    if (!handler) {
      return dead(
        new OutboxPublishError(
          "permanent",
          `no dispatchJobSubmission handler for ${message.kind} '${message.name}'`,
          { code: "no_job_handler" },
        ),
      );
    }
    start = (timeoutMs) => handler(message, { timeoutMs });
  } else {
    const error = new OutboxCorruptRecordError(message.id, `unknown kind ${String(message.kind)}`);
    return { state: "dead", info: { error, lastError: error.message } };
  }

  const slot = engine.window.acquire();
  if (slot) await slot;
  try {
    if (engine.halted()) {
      return retryLater(
        engine,
        new OutboxPublishError("unavailable", "not attempted: the broker is unavailable", {
          code: "paused",
        }),
      );
    }
    const budget = Math.floor(deadline.at - performance.now());
    if (budget < 1) {
      return retryLater(
        engine,
        new OutboxPublishError(
          "unavailable",
          "not attempted: the claim's lease ran out while waiting for the in-flight window",
          { code: "lease_budget" },
        ),
      );
    }
    let value: void | OutboxPublishReceipt | JsonValue;
    try {
      value = await deadline.race(start, budget);
    } catch (error) {
      return failure(engine, message, error);
    }
    if (message.kind === "event.publish") {
      // A plain copy of the receipt, read once here: its fields are read again when the batch
      // is marked and by the hooks, where a throwing getter would stop the whole batch.
      const receipt = readReceipt(value as OutboxPublishReceipt | undefined);
      const info: DispatchedInfo = { duplicate: receipt?.duplicate === true };
      if (receipt) info.receipt = receipt;
      return { state: "dispatched", info };
    }
    let outcome = value as JsonValue | undefined;
    if (outcome !== undefined) {
      // An outcome no store can keep would fail the whole batch's mark, every time: the
      // message goes dead instead (the job did run; an operator's retry runs it again). The
      // mark carries a copy made from the checked text: the handler's value may still change.
      let text: string;
      try {
        text = storableOutcome(outcome);
      } catch (error) {
        return dead(
          new OutboxPublishError(
            "permanent",
            `the job's outcome cannot be stored: ${errorMessage(error)}`,
            { code: "outcome", cause: error },
          ),
        );
      }
      // So would one larger than this message's store keeps next to it (a NATS KV record
      // below the server's max_payload).
      const room = outcomeRoom(engine.repository, message);
      if (room !== undefined && text.length > room / 3) {
        const bytes = new TextEncoder().encode(text).length;
        if (bytes > room) {
          return dead(
            new OutboxPublishError(
              "permanent",
              `the job's outcome cannot be stored: Outbox outcome is ${bytes} bytes of JSON, more than the ${room} bytes the store has room for next to this message`,
              { code: "outcome" },
            ),
          );
        }
      }
      outcome = JSON.parse(text) as JsonValue;
    }
    return {
      state: "dispatched",
      info: outcome === undefined ? { duplicate: false } : { duplicate: false, outcome },
    };
  } finally {
    engine.window.release();
  }
}

/**
 * The store's `outcomeRoomBytes` for a claimed message, or `undefined` (no such method, or it
 * threw or answered something that is not a byte count: the store's own check at the mark then
 * decides).
 */
function outcomeRoom(repository: OutboxRepository, message: OutboxMessage): number | undefined {
  try {
    const room = repository.outcomeRoomBytes?.(message);
    return typeof room === "number" && room >= 0 ? room : undefined;
  } catch {
    return undefined;
  }
}

/** The runtime's receipt as a plain object of its known fields (`undefined` without one). */
function readReceipt(
  value: OutboxPublishReceipt | null | undefined,
): OutboxPublishReceipt | undefined {
  if (value === null || typeof value !== "object") return undefined;
  const receipt: OutboxPublishReceipt = {};
  const { duplicate, stream, seq } = value;
  if (duplicate !== undefined) receipt.duplicate = duplicate === true;
  if (typeof stream === "string") receipt.stream = stream;
  if (typeof seq === "number") receipt.seq = seq;
  return receipt;
}

/**
 * The delivery deadline shared by a batch (all its deliveries must end by the same time, `at`,
 * in `performance.now()` time): ONE timer per batch instead of one per delivery. At `at`, every
 * delivery still running is abandoned and fails as `unavailable` (`timeout`); the runtime was
 * told the same budget and gives up on its own (the abandoned promise is handed to
 * `engine.abandoned`). `clear()` once every delivery has ended.
 */
class BatchDeadline {
  readonly at: number;
  readonly #engine: BatchEngine;
  readonly #expiring = new Set<() => void>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #expired = false;

  constructor(engine: BatchEngine, at: number) {
    this.#engine = engine;
    this.at = at;
  }

  /** Runs `start(budgetMs)`, but stops waiting for it at the deadline. */
  race<T>(start: (budgetMs: number) => Promise<T>, budgetMs: number): Promise<T> {
    let promise: Promise<T>;
    try {
      promise = Promise.resolve(start(budgetMs));
    } catch (error) {
      return Promise.reject(error);
    }
    if (this.#expired) {
      this.#abandon(promise);
      return Promise.reject(timeoutError(budgetMs));
    }
    this.#timer ??= setTimeout(() => this.#expire(), Math.max(0, this.at - performance.now()));
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      const expire = () => {
        settled = true;
        this.#abandon(promise);
        reject(timeoutError(budgetMs));
      };
      this.#expiring.add(expire);
      promise.then(
        (value) => {
          if (settled) return;
          this.#expiring.delete(expire);
          resolve(value);
        },
        (error) => {
          if (settled) return;
          this.#expiring.delete(expire);
          reject(error);
        },
      );
    });
  }

  /** Cancels the timer (every delivery has ended). */
  clear(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #expire(): void {
    this.#timer = undefined;
    this.#expired = true;
    const expiring = [...this.#expiring];
    this.#expiring.clear();
    for (const expire of expiring) expire();
  }

  #abandon(promise: Promise<unknown>): void {
    this.#engine.abandoned(promise.then(() => {}, () => {}));
  }
}

function timeoutError(budgetMs: number): OutboxPublishError {
  return new OutboxPublishError(
    "unavailable",
    `no acknowledgement within ${budgetMs} ms (what was left of the claim's lease)`,
    { code: "timeout" },
  );
}

function failure(engine: BatchEngine, message: OutboxMessage, error: unknown): Settlement {
  // An OutboxPublishError of a kind this version does not know (built by a runtime) is
  // retryable, as any other error.
  const classified = error instanceof OutboxPublishError &&
      (error.kind === "permanent" || error.kind === "unavailable" || error.kind === "retryable")
    ? error
    : new OutboxPublishError("retryable", errorMessage(error), { code: "error", cause: error });
  switch (classified.kind) {
    case "permanent":
      return dead(classified);
    case "unavailable": {
      const decision = engine.unavailable(classified, message);
      return "dead" in decision
        ? gaveUp(message, classified)
        : retryLater(engine, classified, decision.retryAt);
    }
    case "retryable": {
      const lastError = describe(classified);
      if (message.attempts >= engine.policy.maxAttempts) {
        return {
          state: "dead",
          info: {
            error: classified,
            lastError: `gave up after ${message.attempts} attempts: ${lastError}`,
          },
        };
      }
      const nextAttemptAt = addMs(engine.now(), backoffDelayMs(message.attempts, engine.policy));
      return {
        state: "failed",
        info: { error: classified, lastError, nextAttemptAt },
        unavailable: false,
      };
    }
  }
}

/**
 * `unavailable`: due again at `at` (default: at once; the dispatcher's circuit breaker decides
 * when to retry).
 */
function retryLater(engine: BatchEngine, error: OutboxPublishError, at?: Date): Settlement {
  return {
    state: "failed",
    info: { error, lastError: describe(error), nextAttemptAt: at ?? engine.now() },
    unavailable: true,
  };
}

/** The `unavailable` budget is spent: dead, with the reason. */
function gaveUp(message: OutboxMessage, error: OutboxPublishError): Settlement {
  return {
    state: "dead",
    info: {
      error,
      lastError: `gave up after ${message.attempts} attempts (retry.maxUnavailableAttempts): ${
        describe(error)
      }`,
    },
  };
}

function dead(error: OutboxPublishError): Settlement {
  return { state: "dead", info: { error, lastError: describe(error) } };
}

function describe(error: OutboxPublishError): string {
  return `${String(error.code)}: ${errorMessage(error.message)}`;
}

function toMark(message: OutboxMessage, settlement: Settlement): OutboxMark {
  const claim: OutboxClaim = {
    id: message.id,
    attempts: message.attempts,
    nextAttemptAt: message.nextAttemptAt,
  };
  if (message.claimToken !== undefined) claim.claimToken = message.claimToken;
  switch (settlement.state) {
    case "dispatched": {
      const mark: OutboxMark = settlement.info.outcome === undefined
        ? { claim, state: "dispatched" }
        : { claim, state: "dispatched", outcome: settlement.info.outcome };
      // The key fence's knowledge: where the key's message was stored (fence on or off).
      const seq = settlement.info.receipt?.seq;
      if (
        message.orderingKey !== undefined && typeof seq === "number" && Number.isSafeInteger(seq) &&
        seq >= 1
      ) {
        mark.sequence = seq;
      }
      return mark;
    }
    case "failed":
      return {
        claim,
        state: "failed",
        error: settlement.info.lastError,
        nextAttemptAt: settlement.info.nextAttemptAt,
      };
    case "dead":
      return { claim, state: "dead", error: settlement.info.lastError };
  }
}

/**
 * Once the broker acknowledged a message, that fact must reach the store: a failed mark (a
 * database blip) is retried with backoff until the lease ends (not when the store is closed:
 * `OutboxStoreClosedError`), instead of letting the lease
 * expire and publishing again. A retry after a partial failure counts every mark once: a store's
 * `markMany` reports marks its earlier call had applied as `true` (claim tokens), and the
 * one-by-one fallback does not send answered marks again. An `OutboxOutcomeRefusedError` that
 * `refused` accepts (it turned that dispatched mark into the `dead` mark the store applied) is
 * retried at once: each such error settles one mark for good.
 */
async function applyMarksWithinLease(
  engine: BatchEngine,
  marks: OutboxMark[],
  leaseEnd: number,
  refused: (error: OutboxOutcomeRefusedError) => boolean,
): Promise<boolean[]> {
  let delay = 25;
  const answered: Array<boolean | undefined> = [];
  while (true) {
    try {
      return await applyMarks(engine.repository, marks, engine.now(), answered);
    } catch (error) {
      // A closed store answers no retry: the claims wait for their lease (and a new store).
      if (error instanceof OutboxStoreClosedError) throw error;
      if (error instanceof OutboxOutcomeRefusedError && refused(error)) continue;
      if (performance.now() + delay >= leaseEnd) throw error;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 1_000);
    }
  }
}
