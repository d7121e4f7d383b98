/**
 * Request/reply over one wildcard reply subscription per connection, without nats.js's
 * per-request machinery: `nc.request` builds a timer, a promise race, a `RequestError` (with a
 * stack when async traces are on) and another one when it cancels, for every request. Here a
 * request is one pending-map entry keyed by its reply token, and ONE sweeping timer enforces all
 * timeouts, so the success path allocates no timer and no Error.
 *
 * Replies are returned as they arrive, status messages (503 no responders, 404 ...) included: the
 * caller interprets them. Failures reject with the nats.js errors `nc.request` produces:
 * `TimeoutError`, `ClosedConnectionError` / `DrainingConnectionError` before sending, a
 * `RequestError("connection closed")` for requests in flight when the connection closes, and a
 * `RequestError` caused by the `PermissionViolationError` when the server refuses the publish.
 *
 * @module
 */

import { createInbox, errors, type Msg, type MsgHdrs } from "@nats-io/nats-core";

/** The part of a nats.js `NatsConnection` the mux uses. */
export interface ReplyMuxConnection {
  /** Sends a message (throws at once on a closed or draining connection, or a bad subject). */
  publish(
    subject: string,
    payload?: Uint8Array,
    options?: { reply?: string; headers?: MsgHdrs },
  ): void;
  /** Subscribes with a callback. */
  subscribe(
    subject: string,
    options: { callback: (error: Error | null, msg: Msg) => void },
  ): { readonly closed: Promise<void | Error> };
  /** `true` once the connection is closed. */
  isClosed(): boolean;
  /** `true` while the connection drains. */
  isDraining(): boolean;
  /** Resolves when the connection closes. */
  closed(): Promise<void | Error>;
  /** Status events; a publish permissions violation is reported only this way. */
  status?(): AsyncIterable<{ type: string; error?: unknown }>;
}

interface Waiting {
  subject: string;
  /** `performance.now()` time after which the request fails with a `TimeoutError`. */
  deadline: number;
  resolve: (msg: Msg) => void;
  reject: (error: unknown) => void;
}

/** `setTimeout`'s longest delay. */
const longestDelayMs = 2_147_483_647;

/**
 * Requests with their replies on one subscription (`<inbox>.*`, made on first use and again
 * after it ends). nats.js re-subscribes it after a reconnect; replies lost with the connection
 * fail by their timeout, and a reply after its timeout is ignored.
 */
export class ReplyMux {
  readonly #nc: ReplyMuxConnection;
  readonly #inboxPrefix: string | undefined;
  readonly #waiting = new Map<string, Waiting>();
  #subscription: object | undefined;
  #replyPrefix = "";
  #counter = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timerAt = Infinity;
  #ended = false;

  /** A mux on `nc`; reply subjects start with `inboxPrefix` (@default {"_INBOX"}). */
  constructor(nc: ReplyMuxConnection, inboxPrefix?: string) {
    this.#nc = nc;
    this.#inboxPrefix = inboxPrefix;
    const end = () => this.#end();
    nc.closed().then(end, end);
    this.#watchDenials();
  }

  /** Sends `payload` to `subject` and resolves with the first reply within `timeoutMs`. */
  request(
    subject: string,
    payload: Uint8Array,
    headers: MsgHdrs | undefined,
    timeoutMs: number,
  ): Promise<Msg> {
    return new Promise<Msg>((resolve, reject) => {
      const token = (this.#counter++).toString(36);
      try {
        // As nc.request checks: a draining connection takes no new request.
        if (this.#ended || this.#nc.isClosed()) throw new errors.ClosedConnectionError();
        if (this.#nc.isDraining()) throw new errors.DrainingConnectionError();
        if (this.#subscription === undefined) this.#listen();
        this.#nc.publish(subject, payload, { reply: this.#replyPrefix + token, headers });
      } catch (error) {
        reject(error);
        return;
      }
      const deadline = performance.now() + timeoutMs;
      this.#waiting.set(token, { subject, deadline, resolve, reject });
      if (deadline < this.#timerAt) this.#schedule(deadline);
    });
  }

  #listen(): void {
    const replyPrefix = `${createInbox(this.#inboxPrefix)}.`;
    const subscription = this.#nc.subscribe(`${replyPrefix}*`, {
      callback: (error, msg) => {
        if (error) {
          this.#lost(subscription, error);
          return;
        }
        if (this.#subscription !== subscription) return;
        const token = msg.subject.substring(replyPrefix.length);
        const waiting = this.#waiting.get(token);
        if (waiting === undefined) return; // timed out already, or a stray message
        this.#waiting.delete(token);
        this.#idle();
        waiting.resolve(msg);
      },
    });
    this.#subscription = subscription;
    this.#replyPrefix = replyPrefix;
    subscription.closed.then(
      (error) => this.#lost(subscription, error),
      (error) => this.#lost(subscription, error),
    );
  }

  /** The subscription ended (drained, closed, refused): its requests fail; the next re-subscribes. */
  #lost(subscription: object, cause: unknown): void {
    if (this.#subscription !== subscription) return;
    this.#subscription = undefined;
    this.#replyPrefix = "";
    const error = cause instanceof Error && !this.#nc.isClosed()
      ? new errors.RequestError(cause.message, { cause })
      : connectionClosed();
    this.#failAll(error);
  }

  /**
   * Stops the sweep once nothing waits: a pending timer would outlive the requests (as long as
   * their timeout), which a test's op sanitizer reports and nc.request, clearing its timer on
   * the reply, never shows.
   */
  #idle(): void {
    if (this.#waiting.size > 0 || this.#timer === undefined) return;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
  }

  /** Makes the sweep run at `deadline`. */
  #schedule(deadline: number): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timerAt = deadline;
    this.#timer = setTimeout(
      this.#sweep,
      Math.min(longestDelayMs, Math.max(0, deadline - performance.now())),
    );
  }

  #sweep = (): void => {
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const now = performance.now();
    let next = Infinity;
    for (const [token, waiting] of this.#waiting) {
      if (waiting.deadline <= now) {
        this.#waiting.delete(token);
        waiting.reject(new errors.TimeoutError());
      } else {
        next = Math.min(next, waiting.deadline);
      }
    }
    if (next !== Infinity && !this.#ended) this.#schedule(next);
  };

  /**
   * The server refused a publish (`-ERR Permissions Violation for Publish to "<subject>"`, only a
   * status event in nats.js): the oldest request to that subject fails with a `RequestError`
   * caused by it, as nc.request matches and wraps it.
   */
  #watchDenials(): void {
    const events = this.#nc.status?.();
    if (events === undefined) return;
    void (async () => {
      for await (const event of events) {
        const error = event.error as {
          name?: unknown;
          message?: unknown;
          operation?: unknown;
          subject?: unknown;
        };
        if (
          event.type !== "error" || error?.name !== "PermissionViolationError" ||
          error.operation !== "publish"
        ) continue;
        for (const [token, waiting] of this.#waiting) {
          if (waiting.subject !== error.subject) continue;
          this.#waiting.delete(token);
          this.#idle();
          // As nc.request rejects it: a RequestError with the violation as its cause.
          waiting.reject(new errors.RequestError(String(error.message ?? ""), { cause: error }));
          break;
        }
      }
    })().catch(() => {});
  }

  #end(): void {
    this.#ended = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
    this.#subscription = undefined;
    this.#failAll(connectionClosed());
  }

  #failAll(error: unknown): void {
    const failed = [...this.#waiting.values()];
    this.#waiting.clear();
    this.#idle();
    for (const waiting of failed) waiting.reject(error);
  }
}

/** What nats.js rejects the requests in flight with when the connection closes. */
function connectionClosed(): Error {
  const cause = new errors.RequestError("connection closed");
  return new errors.RequestError("connection closed", { cause });
}

const muxes = new WeakMap<ReplyMuxConnection, ReplyMux>();

/** The connection's shared {@linkcode ReplyMux}, created on first use. */
export function replyMuxFor(nc: ReplyMuxConnection): ReplyMux {
  let mux = muxes.get(nc);
  if (mux === undefined) {
    // The same reply prefix as nc.request's (permissions may allow only that one).
    const prefix = (nc as { options?: { inboxPrefix?: unknown } }).options?.inboxPrefix;
    mux = new ReplyMux(nc, typeof prefix === "string" && prefix !== "" ? prefix : undefined);
    muxes.set(nc, mux);
  }
  return mux;
}
