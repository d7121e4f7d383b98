/**
 * Helpers for the dispatch tests: records, reading a stream back, and an instrumented store (a
 * real MemoryOutboxRepository underneath, with call counters and injectable store errors).
 *
 * @module
 */

import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  type JsonValue,
  MemoryOutboxRepository,
  type OutboxClaim,
  type OutboxClaimOptions,
  type OutboxDeadLetter,
  type OutboxDispatchedOptions,
  type OutboxFailure,
  type OutboxMark,
  type OutboxMessage,
  type OutboxRecord,
  type OutboxRepository,
  type OutboxRuntime,
} from "../../mod.ts";
import { eventually } from "../kit/mod.ts";

let counter = 0;

/** `count` event records publishing to `${prefix}.<n>`, ids unique per call. */
export function events(
  prefix: string,
  count: number,
  overrides: Partial<OutboxRecord> = {},
): OutboxRecord[] {
  const batch = ++counter;
  return Array.from({ length: count }, (_, index) => ({
    id: `${prefix}-${batch}-${index}`,
    kind: "event.publish" as const,
    name: "test.event",
    subject: `${prefix}.e${index % 4}`,
    payload: JSON.stringify({ n: index }),
    headers: { "X-Test": `v${index}` },
    ...overrides,
  }));
}

/** The `Nats-Msg-Id` of every message stored in `stream`, in stream order. */
export async function streamIds(nc: NatsConnection, stream: string): Promise<string[]> {
  const jsm = await jetstreamManager(nc);
  const info = await eventually(() => jsm.streams.info(stream));
  const ids: string[] = [];
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages; seq++) {
    const message = await jsm.streams.getMessage(stream, { seq });
    if (message) ids.push(message.header.get("Nats-Msg-Id"));
  }
  return ids;
}

/** Stored message count of `stream`. */
export async function streamCount(jsm: JetStreamManager, stream: string): Promise<number> {
  return (await eventually(() => jsm.streams.info(stream))).state.messages;
}

/** Asserts nothing: returns ids that occur more than once. */
export function duplicatesOf(ids: string[]): string[] {
  const seen = new Set<string>();
  const twice = new Set<string>();
  for (const id of ids) (seen.has(id) ? twice : seen).add(id);
  return [...twice];
}

/**
 * A MemoryOutboxRepository with instrumentation: counts calls, tracks concurrent claims, and
 * can fail the next N claims or mark batches (as a database blip would).
 */
export class InstrumentedOutbox implements OutboxRepository {
  readonly store = new MemoryOutboxRepository();
  claimCalls = 0;
  /** The `limit` of every claim, in order. */
  claimLimits: number[] = [];
  markManyCalls = 0;
  claimsInFlight = 0;
  maxClaimsInFlight = 0;
  failClaims = 0;
  failMarks = 0;
  /** Called when a claim starts (for overlap checks). */
  onClaim?: () => void;
  /**
   * Ids whose claimed payload reads as `{not json`: a row written behind the library's back
   * (enqueue refuses such a payload).
   */
  corruptPayloads = new Set<string>();

  enqueue(record: OutboxRecord): Promise<OutboxMessage> {
    return this.store.enqueue(record);
  }
  enqueueMany(records: readonly OutboxRecord[]): Promise<OutboxMessage[]> {
    return this.store.enqueueMany(records);
  }
  get(id: string): Promise<OutboxMessage | undefined> {
    return this.store.get(id);
  }
  async claimDue(
    limit: number,
    now: Date,
    options?: OutboxClaimOptions,
  ): Promise<OutboxMessage[]> {
    this.claimCalls += 1;
    this.claimLimits.push(limit);
    this.claimsInFlight += 1;
    this.maxClaimsInFlight = Math.max(this.maxClaimsInFlight, this.claimsInFlight);
    this.onClaim?.();
    try {
      // A real store answers asynchronously; give other work the chance to interleave.
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (this.failClaims > 0) {
        this.failClaims -= 1;
        throw new Error("injected claim failure");
      }
      const claimed = await this.store.claimDue(limit, now, options);
      for (const message of claimed) {
        if (this.corruptPayloads.has(message.id)) message.payload = "{not json";
      }
      return claimed;
    } finally {
      this.claimsInFlight -= 1;
    }
  }
  markDispatched(
    claim: OutboxClaim,
    now: Date,
    outcome?: JsonValue,
    options?: OutboxDispatchedOptions,
  ): Promise<boolean> {
    return this.store.markDispatched(claim, now, outcome, options);
  }
  markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean> {
    return this.store.markFailed(claim, failure);
  }
  markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean> {
    return this.store.markDead(claim, dead);
  }
  markMany(marks: readonly OutboxMark[], now: Date): Promise<boolean[]> {
    this.markManyCalls += 1;
    if (this.failMarks > 0) {
      this.failMarks -= 1;
      return Promise.reject(new Error("injected mark failure"));
    }
    return this.store.markMany(marks, now);
  }
  all(): OutboxMessage[] {
    return this.store.snapshot();
  }
}

/** Wraps a runtime to count deliveries in flight (around the real publish). */
export function countingRuntime<T extends OutboxRuntime>(
  runtime: T,
): T & { inFlight: number; maxInFlight: number; published: number } {
  const wrapped = Object.assign(Object.create(runtime) as T, {
    inFlight: 0,
    maxInFlight: 0,
    published: 0,
  });
  const publish: OutboxRuntime["publishPreparedEvent"] = async (event, options) => {
    wrapped.inFlight += 1;
    wrapped.maxInFlight = Math.max(wrapped.maxInFlight, wrapped.inFlight);
    try {
      return await runtime.publishPreparedEvent(event, options);
    } finally {
      wrapped.inFlight -= 1;
      wrapped.published += 1;
    }
  };
  (wrapped as OutboxRuntime).publishPreparedEvent = publish;
  return wrapped;
}

/** A promise with its resolve function. */
export function signal<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
