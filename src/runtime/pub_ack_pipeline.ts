/**
 * A pipelined JetStream publisher in the style of the Go client's `PublishAsync`: messages are
 * sent with `nc.publish(subject, payload, { reply, headers })`, every reply arrives on ONE
 * wildcard subscription per connection (`<inbox>.*`) and is matched to its publish through a
 * pending map keyed by the reply token. A bounded window applies back-pressure, and ONE sweeping
 * timer enforces the timeouts: the success path allocates no timer, no promise race and no Error.
 *
 * Failures reject with the nats.js errors a `js.publish` would have produced (`NoResponders`,
 * `TimeoutError`, `ClosedConnectionError`, `DrainingConnectionError`, `ConnectionError`, a
 * `JetStreamApiError` for an API error in the reply), so {@linkcode classifyJetStreamError}
 * classifies both paths the same way.
 *
 * @module
 */

import { createInbox, errors } from "@nats-io/nats-core";
import { pubAckApiError, pubAckInvalidError } from "./jetstream_errors.ts";
import { PlainPubAckReader } from "./plain_pub_ack.ts";

/**
 * Default number of PubAcks a {@linkcode PubAckPipeline} awaits at once; further publishes wait
 * for a slot (their timeout runs while they wait).
 *
 * @example
 * ```ts
 * import { defaultPubAckWindow } from "@outbox/nats";
 * console.log(defaultPubAckWindow); // 1024
 * ```
 */
export const defaultPubAckWindow = 1024;

/**
 * Message headers as nats.js builds them: a `PubAckHeaders` (`headers()` from `@nats-io/nats-core`).
 * Typed loosely so this API does not depend on nats.js's types; nats.js checks them.
 *
 * @example
 * ```ts
 * import { headers } from "@nats-io/nats-core";
 * import type { PubAckHeaders } from "@outbox/nats";
 * const h: PubAckHeaders = headers();
 * ```
 */
export type PubAckHeaders = object;

/**
 * A reply as the pipeline reads it (a nats.js `Msg`).
 *
 * @example
 * ```ts
 * import type { PubAckReply } from "@outbox/nats";
 * const reply: PubAckReply = { subject: "_INBOX.abc.1", data: new Uint8Array() };
 * ```
 */
export interface PubAckReply {
  /** The reply subject: `<inbox>.<token>`. */
  readonly subject: string;
  /** The body: a PubAck or an API error as JSON; empty for a status message. */
  readonly data: Uint8Array;
  /** Status headers (503: no responders). */
  readonly headers?: { readonly code: number; readonly description: string };
}

/**
 * The reply subscription as the pipeline uses it (a nats.js `Subscription`).
 *
 * @example
 * ```ts
 * import type { PubAckSubscription } from "@outbox/nats";
 * const subscription: PubAckSubscription = { closed: Promise.resolve() };
 * ```
 */
export interface PubAckSubscription {
  /** Resolves when the subscription ends (unsubscribed, drained, connection closed). */
  readonly closed: Promise<void | Error>;
}

/**
 * The part of a nats.js connection (`NatsConnection`, any transport) the pipeline uses.
 *
 * @example
 * ```ts
 * import type { NatsConnection } from "@nats-io/transport-node";
 * import type { PubAckConnection } from "@outbox/nats";
 * const use = (nc: NatsConnection): PubAckConnection => nc;
 * ```
 */
export interface PubAckConnection {
  /** Sends a message (nats.js throws at once on a closed or draining connection). */
  publish(
    subject: string,
    payload?: string | Uint8Array,
    options?: { reply?: string; headers?: PubAckHeaders },
  ): void;
  /** Subscribes with a callback. */
  subscribe(
    subject: string,
    options: { callback: (error: Error | null, msg: PubAckReply) => void },
  ): PubAckSubscription;
  /** `true` once the connection is closed. */
  isClosed(): boolean;
  /** `true` while the connection drains. */
  isDraining(): boolean;
  /** Resolves when the connection closes. */
  closed(): Promise<void | Error>;
  /**
   * The connection's status events (nats.js has it): a publish permissions violation comes only
   * this way (`{ type: "error", error: PermissionViolationError }`), and fails its publish at once.
   */
  status?(): AsyncIterable<{ type: string; error?: unknown }>;
  /**
   * A round trip to the server (nats.js has it). The runtime uses it to tell a PubAck timeout
   * of one stream (the server answers) from a broker that does not answer.
   */
  flush?(): Promise<void>;
}

/**
 * A PubAck: where JetStream stored the message.
 *
 * @example
 * ```ts
 * import type { PubAck } from "@outbox/nats";
 * const ack: PubAck = { stream: "ORDERS", seq: 42, duplicate: false };
 * ```
 */
export interface PubAck {
  /** The stream that stored the message. */
  stream: string;
  /** Its sequence in the stream (the original's, for a duplicate). */
  seq: number;
  /** `true` when the stream already had this `Nats-Msg-Id` (inside its duplicate window). */
  duplicate: boolean;
}

interface Entry {
  subject: string;
  payload: string | Uint8Array | undefined;
  headers: PubAckHeaders | undefined;
  /** `performance.now()` time after which the publish fails with a timeout. */
  deadline: number;
  resolve: (ack: PubAck) => void;
  reject: (error: unknown) => void;
}

/** The longest delay `setTimeout` honours; a longer one fires after 1 ms (a busy sweep). */
const maxTimerDelayMs = 2_147_483_647;

/** A re-arm of the sweep timer is skipped for deadlines less than this much earlier. */
const sweepSlackMs = 1;

const decoder = new TextDecoder();

/**
 * Publishes to JetStream with many PubAcks in flight over one reply subscription.
 *
 * - `publish()` resolves with the PubAck (`duplicate: true` is a success) or rejects with a
 *   nats.js error; a reply that arrives after its publish timed out is ignored.
 * - At most `window` publishes await their PubAck; the others queue (FIFO) and their timeout
 *   runs while they wait.
 * - The reply subscription survives reconnects (nats.js re-subscribes it). PubAcks lost with
 *   the connection, and messages nats.js discards while reconnecting, fail by their timeout. If
 *   the subscription closes (the connection drains or closes, or a permissions error), every
 *   pending publish fails at once and the next publish creates a new one. A publish on a closed
 *   or draining connection fails at once.
 *
 * Use {@linkcode pubAckPipelineFor} to share one pipeline per connection.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { headers } from "@nats-io/nats-core";
 * import { PubAckPipeline } from "@outbox/nats";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const pipeline = new PubAckPipeline(nc, { window: 256 });
 * const h = headers();
 * h.set("Nats-Msg-Id", "order-1");
 * const ack = await pipeline.publish("orders.created", '{"id":1}', h, 5_000);
 * console.log(ack.stream, ack.seq, ack.duplicate);
 * await nc.close();
 * ```
 */
export class PubAckPipeline {
  readonly #nc: PubAckConnection;
  readonly #inboxPrefix: string | undefined;
  #window: number;
  #subscription: PubAckSubscription | undefined;
  /** `<inbox>.`: reply subjects are this plus a token. */
  #replyPrefix = "";
  #nextToken = 0;
  readonly #pending = new Map<string, Entry>();
  readonly #acks = new PlainPubAckReader();
  /** Publishes waiting for a window slot, oldest first, from `#queueHead` on. */
  #queue: Entry[] = [];
  #queueHead = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timerAt = Infinity;
  #connectionClosed = false;

  /**
   * Creates a pipeline on `nc`; the reply subscription is made on first publish.
   *
   * @param nc A nats.js connection (any transport).
   * @param options `window`: PubAcks awaited at once (@default {1024}); `inboxPrefix`: the
   * prefix of the reply subject (@default the connection's `inboxPrefix` option, else `_INBOX`).
   */
  constructor(nc: PubAckConnection, options: { window?: number; inboxPrefix?: string } = {}) {
    this.#nc = nc;
    this.#window = checkWindow(options.window ?? defaultPubAckWindow);
    this.#inboxPrefix = options.inboxPrefix ?? connectionInboxPrefix(nc);
    nc.closed().then(
      () => this.#closeAll(),
      () => this.#closeAll(),
    );
    this.#watchStatus();
  }

  /** PubAcks awaited at once. */
  get window(): number {
    return this.#window;
  }

  /** Publishes awaiting their PubAck plus those waiting for a slot. */
  get pending(): number {
    return this.#pending.size + this.#queue.length - this.#queueHead;
  }

  /** Raises the window (never lowers it; a shared pipeline serves its largest user). */
  widen(window: number): void {
    this.#window = Math.max(this.#window, checkWindow(window));
    this.#pump();
  }

  /**
   * Publishes `payload` to `subject` with `headers` and resolves with the PubAck, or rejects
   * after `timeoutMs` (counted from this call, waiting for a window slot included); a NaN
   * `timeoutMs` rejects at once with a `RangeError`.
   */
  publish(
    subject: string,
    payload: string | Uint8Array | undefined,
    headers: PubAckHeaders | undefined,
    timeoutMs: number,
  ): Promise<PubAck> {
    return new Promise<PubAck>((resolve, reject) => {
      if (Number.isNaN(timeoutMs)) {
        // A NaN deadline is never reached: the publish would never settle.
        reject(new RangeError("timeoutMs must be a number, got NaN"));
        return;
      }
      const entry: Entry = {
        subject,
        payload,
        headers,
        deadline: performance.now() + timeoutMs,
        resolve,
        reject,
      };
      if (this.#pending.size < this.#window && this.#queueHead === this.#queue.length) {
        if (!this.#send(entry)) return;
      } else {
        this.#queue.push(entry);
      }
      this.#arm(entry.deadline);
    });
  }

  /** Sends `entry`; rejects it and returns `false` when nats.js refuses. */
  #send(entry: Entry): boolean {
    const token = (this.#nextToken++).toString(36);
    try {
      // While the connection drains, its reply subscription is going away: fail at once.
      if (this.#nc.isDraining()) throw new errors.DrainingConnectionError();
      if (this.#subscription === undefined) this.#subscribe();
      this.#nc.publish(entry.subject, entry.payload, {
        reply: this.#replyPrefix + token,
        headers: entry.headers,
      });
    } catch (error) {
      entry.reject(error);
      return false;
    }
    entry.payload = undefined;
    entry.headers = undefined;
    this.#pending.set(token, entry);
    return true;
  }

  #subscribe(): void {
    if (this.#connectionClosed || this.#nc.isClosed()) throw new errors.ClosedConnectionError();
    if (this.#nc.isDraining()) throw new errors.DrainingConnectionError();
    const replyPrefix = `${createInbox(this.#inboxPrefix)}.`;
    const subscription = this.#nc.subscribe(`${replyPrefix}*`, {
      callback: (error, msg) => {
        if (error) this.#failSubscription(subscription, error);
        else this.#reply(replyPrefix, msg);
      },
    });
    this.#subscription = subscription;
    this.#replyPrefix = replyPrefix;
    subscription.closed.then(
      (error) => this.#failSubscription(subscription, error instanceof Error ? error : undefined),
      (error) => this.#failSubscription(subscription, error),
    );
  }

  #reply(replyPrefix: string, msg: PubAckReply): void {
    if (replyPrefix !== this.#replyPrefix) return;
    const token = msg.subject.substring(replyPrefix.length);
    const entry = this.#pending.get(token);
    // Unknown token: a reply after its publish timed out (or a stray message): ignored.
    if (entry === undefined) return;
    this.#pending.delete(token);
    settle(entry, msg, this.#acks);
    this.#pump();
  }

  /**
   * nats-server answers a PUB the account may not make with `-ERR 'Permissions Violation for
   * Publish to "<subject>"'` and no reply; nats.js reports it only as a status event. Without
   * this the publish would wait out its timeout as `unavailable` (a broker-wide pause for one
   * subject's permissions) where `js.publish` fails at once with the `PermissionViolationError`.
   */
  #watchStatus(): void {
    const events = this.#nc.status?.();
    if (events === undefined) return;
    void (async () => {
      for await (const event of events) {
        if (event.type !== "error") continue;
        const error = event.error as { name?: unknown; operation?: unknown; subject?: unknown };
        if (
          error?.name === "PermissionViolationError" && error.operation === "publish" &&
          typeof error.subject === "string"
        ) {
          this.#denied(error.subject, error);
        }
      }
    })().catch(() => {});
  }

  /**
   * Fails the oldest pending publish to `subject` with `error`: the server refuses PUBs in the
   * order they were sent (as nats.js matches such an error to the first request to that subject).
   */
  #denied(subject: string, error: unknown): void {
    for (const [token, entry] of this.#pending) {
      if (entry.subject !== subject) continue;
      this.#pending.delete(token);
      entry.reject(error);
      this.#pump();
      return;
    }
  }

  /** Sends queued publishes while the window has room. */
  #pump(): void {
    while (this.#queueHead < this.#queue.length && this.#pending.size < this.#window) {
      const entry = this.#queue[this.#queueHead];
      this.#queue[this.#queueHead++] = undefined as unknown as Entry;
      this.#send(entry);
    }
    if (this.#queueHead === this.#queue.length && this.#queueHead > 0) {
      this.#queue = [];
      this.#queueHead = 0;
    }
  }

  /** Makes sure the sweep runs by `deadline`. */
  #arm(deadline: number): void {
    if (this.#timer !== undefined) {
      if (deadline >= this.#timerAt - sweepSlackMs) return;
      clearTimeout(this.#timer);
    }
    if (this.#connectionClosed) return;
    this.#timerAt = deadline;
    this.#timer = setTimeout(
      this.#sweep,
      Math.min(maxTimerDelayMs, Math.max(0, deadline - performance.now())),
    );
  }

  /** Fails every publish past its deadline and re-arms for the earliest one left. */
  #sweep = (): void => {
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const now = performance.now();
    let next = Infinity;
    for (const [token, entry] of this.#pending) {
      if (entry.deadline <= now) {
        this.#pending.delete(token);
        entry.reject(new errors.TimeoutError());
      } else if (entry.deadline < next) {
        next = entry.deadline;
      }
    }
    if (this.#queueHead < this.#queue.length) {
      const kept: Entry[] = [];
      for (let i = this.#queueHead; i < this.#queue.length; i++) {
        const entry = this.#queue[i];
        if (entry.deadline <= now) {
          entry.reject(new errors.TimeoutError());
        } else {
          kept.push(entry);
          if (entry.deadline < next) next = entry.deadline;
        }
      }
      this.#queue = kept;
      this.#queueHead = 0;
    }
    this.#pump();
    if (next !== Infinity) this.#arm(next);
  };

  /** The reply subscription ended: its pending publishes fail; the next publish re-subscribes. */
  #failSubscription(subscription: PubAckSubscription, cause?: unknown): void {
    if (this.#subscription !== subscription) return;
    this.#subscription = undefined;
    this.#replyPrefix = "";
    if (this.#pending.size === 0) return;
    const error = this.#connectionError(cause);
    const failed = [...this.#pending.values()];
    this.#pending.clear();
    for (const entry of failed) entry.reject(error);
    this.#pump();
  }

  #closeAll(): void {
    this.#connectionClosed = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const error = new errors.ClosedConnectionError();
    const failed = [
      ...this.#pending.values(),
      ...this.#queue.slice(this.#queueHead),
    ];
    this.#pending.clear();
    this.#queue = [];
    this.#queueHead = 0;
    this.#subscription = undefined;
    for (const entry of failed) entry.reject(error);
  }

  #connectionError(cause: unknown): Error {
    if (this.#connectionClosed || this.#nc.isClosed()) return new errors.ClosedConnectionError();
    if (this.#nc.isDraining()) return new errors.DrainingConnectionError();
    // Ended without an error: only `nc.close()` does that (nobody else holds the subscription),
    // and nats.js marks the connection closed only after its status listeners stopped, so with
    // any `nc.status()` iterator around `isClosed()` is still false here.
    if (cause === undefined) return new errors.ClosedConnectionError();
    return new errors.ConnectionError("the PubAck subscription closed", { cause });
  }
}

const shared = new WeakMap<PubAckConnection, PubAckPipeline>();

/**
 * The connection's shared {@linkcode PubAckPipeline} (one reply subscription per connection),
 * created on first use; its window is the largest any caller asked for.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { pubAckPipelineFor } from "@outbox/nats";
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * console.log(pubAckPipelineFor(nc) === pubAckPipelineFor(nc)); // true
 * await nc.close();
 * ```
 */
export function pubAckPipelineFor(
  nc: PubAckConnection,
  options: { window?: number } = {},
): PubAckPipeline {
  let pipeline = shared.get(nc);
  if (pipeline === undefined) {
    pipeline = new PubAckPipeline(nc, options);
    shared.set(nc, pipeline);
  } else if (options.window !== undefined) {
    pipeline.widen(options.window);
  }
  return pipeline;
}

function settle(entry: Entry, msg: PubAckReply, acks: PlainPubAckReader): void {
  const data = msg.data;
  const plain = acks.read(data);
  if (plain !== undefined) {
    entry.resolve({ stream: plain.stream, seq: plain.seq, duplicate: false });
    return;
  }
  if (data.length === 0) {
    const status = msg.headers;
    if (status?.code === 503) {
      entry.reject(new errors.NoRespondersError(entry.subject));
    } else {
      entry.reject(
        pubAckInvalidError(
          `an empty reply with status ${status?.code ?? "none"} ${status?.description ?? ""}`
            .trim(),
        ),
      );
    }
    return;
  }
  let body: {
    stream?: unknown;
    seq?: unknown;
    duplicate?: unknown;
    error?: { code?: number; err_code?: number; description?: string };
  };
  try {
    body = JSON.parse(decoder.decode(data));
  } catch (error) {
    entry.reject(pubAckInvalidError("a reply that is not JSON", error));
    return;
  }
  if (body === null || typeof body !== "object") {
    entry.reject(pubAckInvalidError("a reply that is not a JSON object"));
  } else if (body.error !== undefined && body.error !== null) {
    entry.reject(pubAckApiError(body.error));
  } else if (
    typeof body.stream !== "string" || body.stream === "" || typeof body.seq !== "number"
  ) {
    entry.reject(pubAckInvalidError("a PubAck without stream or sequence"));
  } else {
    acks.learn(data, body);
    entry.resolve({ stream: body.stream, seq: body.seq, duplicate: body.duplicate === true });
  }
}

function checkWindow(window: number): number {
  if (!Number.isInteger(window) || window < 1) {
    throw new RangeError(`window must be an integer >= 1, got ${window}`);
  }
  return window;
}

function connectionInboxPrefix(nc: PubAckConnection): string | undefined {
  // nats.js keeps its connect options on the connection (`NatsConnectionImpl.options`); the
  // mux subscription of `nc.request` uses the same prefix, which permissions may require.
  const prefix = (nc as { options?: { inboxPrefix?: unknown } }).options?.inboxPrefix;
  return typeof prefix === "string" && prefix !== "" ? prefix : undefined;
}
