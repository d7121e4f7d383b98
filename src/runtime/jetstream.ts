/**
 * The JetStream runtime: publishes outbox events with `Nats-Msg-Id` and awaits the PubAck.
 *
 * @module
 */

import { OutboxPublishError } from "../core/errors.ts";
import { outboxHeaders } from "../core/events.ts";
import { encodeText } from "../core/slab_encoder.ts";
import type {
  JsonValue,
  OutboxDeliveryOptions,
  OutboxFailureScope,
  OutboxMessage,
  OutboxPublishReceipt,
  OutboxRuntime,
  PreparedEvent,
} from "../core/types.ts";
import { classifyJetStreamError } from "./jetstream_errors.ts";
import { headerBlock, type HeaderEntry, natsHeaderMap } from "./header_block.ts";
import {
  defaultPubAckWindow,
  type PubAck,
  type PubAckConnection,
  pubAckPipelineFor,
} from "./pub_ack_pipeline.ts";
import { type JetStreamManagerLike, JetStreamScopes } from "./jetstream_scope.ts";
import {
  expectedLastSubjectSequenceHeader,
  isFenceRefusal,
  recogniseFenceRefusal,
} from "./jetstream_fence.ts";

/**
 * Default time to wait for a PubAck, in milliseconds.
 *
 * @example
 * ```ts
 * import { defaultPublishTimeoutMs } from "@outbox/nats";
 * console.log(defaultPublishTimeoutMs); // 5000
 * ```
 */
export const defaultPublishTimeoutMs = 5_000;

/**
 * The part of a nats.js JetStream client (`JetStreamClient` from `@nats-io/jetstream`, v3) the
 * runtime uses. Pass the client itself; this type only keeps our API independent of nats.js's.
 *
 * @example
 * ```ts
 * import type { NatsConnection } from "@nats-io/transport-node";
 * import { jetstream } from "@nats-io/jetstream";
 * import type { JetStreamPublisher } from "@outbox/nats";
 * const publisherFor = (nc: NatsConnection): JetStreamPublisher => jetstream(nc);
 * ```
 */
export interface JetStreamPublisher {
  /** Publishes and resolves with the PubAck. */
  publish(
    subject: string,
    payload?: string | Uint8Array,
    options?: { msgID?: string; timeout?: number; headers?: unknown },
  ): Promise<{ stream: string; seq: number; duplicate: boolean }>;
  /**
   * A JetStream manager; `checkAPI: false` sends no request. Its `streams.find` / `streams.info`
   * (when present) tell a missing stream from one without a leader.
   */
  jetstreamManager(checkAPI?: boolean): Promise<JetStreamManagerLike>;
  /**
   * The client's connection (nats.js's `JetStreamClient` has it). With it the runtime publishes
   * through a {@linkcode PubAckPipeline}; without it, through `publish()`.
   */
  getConnection?(): PubAckConnection;
}

/**
 * Options for {@linkcode createJetStreamRuntime}.
 *
 * @example
 * ```ts
 * import type { JetStreamRuntimeOptions } from "@outbox/nats";
 * const options: JetStreamRuntimeOptions = {
 *   timeoutMs: 3_000,
 *   onPublished: (event, receipt) => {
 *     if (receipt.duplicate) console.log("already in the stream:", event.header.id);
 *   },
 * };
 * ```
 */
export interface JetStreamRuntimeOptions {
  /**
   * How long to wait for the PubAck. The dispatcher may ask for less (what is left of the claim's
   * lease); the smaller value wins (a NaN budget is ignored; either is capped at 2^31-1 ms, the
   * longest timer). A publish without PubAck in time fails as `unavailable`.
   *
   * @default {5000}
   */
  timeoutMs?: number;
  /**
   * Handles `job.create` / `job.submit` messages; its result is stored as the message's
   * `outcome`. Without it, job messages go `dead` ("no dispatchJobSubmission handler").
   */
  dispatchJobSubmission?: (
    message: OutboxMessage,
    options?: OutboxDeliveryOptions,
  ) => Promise<JsonValue>;
  /**
   * Called after every acknowledged publish, duplicates included (`receipt.duplicate`), for
   * logs and metrics. Exceptions it throws are ignored.
   */
  onPublished?: (event: PreparedEvent, receipt: Required<OutboxPublishReceipt>) => void;
  /**
   * How messages are published: `"pipeline"` sends them over the connection's shared
   * {@linkcode PubAckPipeline} (one reply subscription, a pending map, one sweeping timer);
   * `"js.publish"` calls the client's `publish()` per message (a request, a timer and two stack
   * traces each; kept for comparison). A client without `getConnection()` always uses
   * `publish()`. Both classify failures the same way.
   *
   * @default {"pipeline"}
   */
  publisher?: "pipeline" | "js.publish";
  /**
   * PubAcks the pipeline awaits at once on this connection (the largest value any runtime on
   * the connection asked for); further publishes wait, their timeout running.
   *
   * @default {1024}
   */
  pubAckWindow?: number;
}

/**
 * A complete JetStream runtime: {@linkcode OutboxRuntime} with a `probe()` for the dispatcher's
 * circuit breaker.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { jetstream } from "@nats-io/jetstream";
 * import { createJetStreamRuntime, type JetStreamOutboxRuntime } from "@outbox/nats";
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const runtime: JetStreamOutboxRuntime = createJetStreamRuntime(jetstream(nc));
 * console.log(await runtime.probe()); // true while JetStream answers
 * await nc.close();
 * ```
 */
export interface JetStreamOutboxRuntime extends OutboxRuntime {
  /** Publishes the event; resolves with the PubAck as a receipt. */
  publishPreparedEvent(
    event: PreparedEvent,
    options?: OutboxDeliveryOptions,
  ): Promise<Required<OutboxPublishReceipt>>;
  /** `true` when the JetStream API answers an account-info request; never publishes. */
  probe(): Promise<boolean>;
  /**
   * `true` when a `stream` scope has a leader and room (stream info), or a `subject` scope's
   * stream does (`$JS.API.STREAM.NAMES` with the subject as filter, then stream info); for the
   * `connection` and `jetstream` scopes, the same as `probe()`. Never publishes.
   */
  probeScope(scope: OutboxFailureScope): Promise<boolean>;
}

/**
 * Creates the runtime that publishes outbox events to JetStream.
 *
 * Every publish carries the stored headers and `Nats-Msg-Id` = the event id, so JetStream drops
 * a re-publish inside the stream's duplicate window; a PubAck with `duplicate: true` counts as
 * success. Failures reject with an {@linkcode OutboxPublishError} classified by
 * {@linkcode classifyJetStreamError}: no stream for the subject is `retryable`, a timeout or a
 * closed connection is `unavailable`, a payload over `max_payload` or an invalid subject is
 * `permanent`. A publish nothing answered, or a stream's 503, is then told apart by asking the
 * JetStream API (one lookup per subject per second at most): JetStream not enabled is
 * `unavailable` for everything (`jetstream_not_enabled`, scope `jetstream`); no stream capturing
 * the subject is `retryable` (`no_stream`, scope `subject`); a stream without a leader or full
 * is `unavailable` for that stream only (`stream_unavailable` / `api_<code>`, scope `stream`). A
 * PubAck timeout while the server answers a round trip (`nc.flush()`) is scoped to its stream
 * (or subject); one the server does not answer stays unscoped (broker-wide).
 *
 * Messages go out through the connection's shared {@linkcode PubAckPipeline} (one reply
 * subscription, a bounded window, one sweeping timer) unless `publisher: "js.publish"` is set or
 * `js` has no `getConnection()`.
 *
 * `probe()` sends a JetStream account-info request (waiting as long as the client's own API
 * timeout, 5 s unless configured in `jetstream(nc, { timeout })`) and publishes nothing.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { jetstream } from "@nats-io/jetstream";
 * import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const runtime = createJetStreamRuntime(jetstream(nc), {
 *   timeoutMs: 5_000,
 *   dispatchJobSubmission: async (message) => ({ kind: "accepted", jobId: message.id }),
 * });
 * const dispatcher = new OutboxDispatcher(new MemoryOutboxRepository(), runtime);
 * await dispatcher.stop();
 * await nc.close();
 * ```
 */
export function createJetStreamRuntime(
  js: JetStreamPublisher,
  options: JetStreamRuntimeOptions = {},
): JetStreamOutboxRuntime {
  const timeoutMs = options.timeoutMs ?? defaultPublishTimeoutMs;
  if (!Number.isFinite(timeoutMs) || timeoutMs < 1) {
    throw new RangeError(`timeoutMs must be a number >= 1, got ${timeoutMs}`);
  }
  const onPublished = options.onPublished;
  const send = publisherFor(js, options);
  let manager: Promise<JetStreamManagerLike> | undefined;
  const managed = (): Promise<JetStreamManagerLike> => {
    const current = manager ??= js.jetstreamManager(false);
    // A failed creation is not kept: the next call tries again.
    current.catch(() => {
      if (manager === current) manager = undefined;
    });
    return current;
  };
  const connection = typeof js.getConnection === "function" ? js.getConnection() : undefined;
  const scopes = new JetStreamScopes(
    managed,
    typeof connection?.flush === "function" ? () => connection.flush!() : undefined,
  );

  const runtime: JetStreamOutboxRuntime = {
    async publishPreparedEvent(event, delivery) {
      // A budget that is not a number (NaN) is ignored: a NaN deadline is never reached. A timer
      // holds at most 2^31-1 ms (longer ones fire at once in nats.js's request timer).
      const budget = delivery?.timeoutMs;
      const timeout = Math.min(
        maxTimerDelayMs,
        Math.max(
          1,
          Math.floor(
            typeof budget !== "number" || Number.isNaN(budget)
              ? timeoutMs
              : Math.min(timeoutMs, budget),
          ),
        ),
      );
      // Nats-Msg-Id goes FIRST, and not through the `msgID` option (which nats.js appends
      // last): nats-server 2.9 takes the first occurrence of the text "Nats-Msg-Id" in the
      // header block, so a header such as X-Original-Nats-Msg-Id written before ours would hide
      // the id and a re-publish would be stored twice.
      const id = event.header.id;
      if (typeof id !== "string" || id.length === 0 || id.trim() !== id || /[\r\n]/.test(id)) {
        // Rows written before ids were validated (or behind the store's back): published as is,
        // the trimmed id would collide with another message's and be dropped as its duplicate.
        throw new OutboxPublishError(
          "permanent",
          `the id ${
            JSON.stringify(id)
          } cannot be carried as Nats-Msg-Id (empty, CR/LF, or leading/trailing whitespace, which NATS trims)`,
          { code: "invalid_msg_id" },
        );
      }
      const expected = checkedExpectation(delivery?.expectedLastSubjectSequence);
      let ack;
      // The key's previous message can have been removed from the stream (limits, retention, a
      // delete): then the publish goes again, expecting the subject's last message now (0: none).
      // Twice at most: a second removal in between is a retryable failure.
      let expecting = expected;
      for (let round = 0; ack === undefined; round++) {
        try {
          // Inside the try: a header nats.js refuses (a row written behind the validator's back)
          // is classified like any other invalid argument, permanent.
          const messageHeaders: HeaderEntry[] = [[outboxHeaders.messageId, id]];
          for (const [name, value] of Object.entries(event.headers)) {
            // The event id above is the Nats-Msg-Id (validation keeps a stored one equal to it);
            // the fence's expectation is the dispatcher's, never a stored header's.
            const lower = name.toLowerCase();
            if (lower === messageIdLower || lower === expectationLower) continue;
            messageHeaders.push([name, value]);
          }
          if (expecting !== undefined) {
            messageHeaders.push([expectedLastSubjectSequenceHeader, String(expecting)]);
          }
          ack = await send(event.subject, event.encodedPayload, messageHeaders, timeout);
        } catch (error) {
          if (expecting === undefined || !isFenceRefusal(error)) {
            throw await scopes.refine(event.subject, classifyJetStreamError(error));
          }
          // The key fence refused it: this message stored by an earlier attempt, the key's
          // previous message removed, or a conflict (thrown).
          const refusal = await recogniseFenceRefusal(
            managed,
            event.subject,
            id,
            expecting,
            error,
          );
          if (refusal.kind === "stored") {
            ack = refusal.receipt;
          } else if (round === 0) {
            expecting = refusal.last;
          } else {
            throw new OutboxPublishError(
              "retryable",
              `the key fence refused the publish to ${event.subject} twice: the subject's last message was removed again while it was sent`,
              { code: "key_fence_unverified", cause: error },
            );
          }
        }
      }
      scopes.learn(event.subject, ack.stream);
      const receipt = { duplicate: ack.duplicate === true, stream: ack.stream, seq: ack.seq };
      if (onPublished) {
        try {
          onPublished(event, receipt);
        } catch {
          // Metrics hooks must not turn a delivered message into a failure.
        }
      }
      return receipt;
    },
    async probe() {
      try {
        await (await managed()).getAccountInfo();
        return true;
      } catch {
        return false;
      }
    },
    probeScope(scope) {
      return scopes.probe(scope);
    },
  };
  if (options.dispatchJobSubmission) {
    const handler = options.dispatchJobSubmission;
    runtime.dispatchJobSubmission = (message, delivery) => handler(message, delivery);
  }
  return runtime;
}

const messageIdLower = outboxHeaders.messageId.toLowerCase();
const expectationLower = expectedLastSubjectSequenceHeader.toLowerCase();

/** The key fence's expected sequence: `undefined`, or an integer >= 1 (else permanent). */
function checkedExpectation(expected: unknown): number | undefined {
  if (expected === undefined) return undefined;
  if (typeof expected === "number" && Number.isSafeInteger(expected) && expected >= 1) {
    return expected;
  }
  throw new OutboxPublishError(
    "permanent",
    `expectedLastSubjectSequence must be a stream sequence (an integer >= 1), got ${
      String(expected)
    }`,
    { code: "invalid_argument" },
  );
}

/** The longest delay `setTimeout` honours (2^31-1 ms, about 24.8 days). */
const maxTimerDelayMs = 2_147_483_647;

type Send = (
  subject: string,
  payload: string,
  headers: readonly HeaderEntry[],
  timeoutMs: number,
) => Promise<PubAck>;

function publisherFor(js: JetStreamPublisher, options: JetStreamRuntimeOptions): Send {
  const mode = options.publisher ?? "pipeline";
  if (mode !== "pipeline" && mode !== "js.publish") {
    throw new RangeError(`publisher must be "pipeline" or "js.publish", got ${String(mode)}`);
  }
  const window = options.pubAckWindow ?? defaultPubAckWindow;
  if (!Number.isInteger(window) || window < 1) {
    throw new RangeError(`pubAckWindow must be an integer >= 1, got ${window}`);
  }
  if (mode === "pipeline" && typeof js.getConnection === "function") {
    const pipeline = pubAckPipelineFor(js.getConnection(), { window });
    // Header block and payload encoded here, into a shared slab (header_block.ts): nats.js would
    // make a Map of the headers and two new buffers per message. A payload that is not text (a
    // custom store's row, behind the types' back) goes to nats.js as it is, which sends bytes and
    // refuses anything else, as it always did.
    return (subject, payload, headers, timeoutMs) =>
      pipeline.publish(
        subject,
        typeof payload === "string" ? encodeText(payload) : payload,
        headerBlock(headers),
        timeoutMs,
      );
  }
  return (subject, payload, headers, timeout) =>
    js.publish(subject, payload, { headers: natsHeaderMap(headers), timeout });
}
