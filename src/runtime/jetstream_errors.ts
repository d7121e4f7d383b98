/**
 * Classifying nats.js (v3) publish failures into {@linkcode OutboxPublishError} kinds.
 *
 * nats.js signals failures with named Error classes, often wrapped (a `RequestError` whose
 * `cause` is a `NoRespondersError`, a `JetStreamNotEnabled` whose cause is that `RequestError`).
 * We walk the `cause` chain and decide by class name and API error code, which survives
 * duplicated copies of the nats.js packages where `instanceof` would not.
 *
 * @module
 */

import { errorMessage, OutboxPublishError } from "../core/errors.ts";
import type { OutboxFailureScope } from "../core/types.ts";

/** JetStream API error code: the message is larger than the stream's `max_msg_size`. */
const streamMessageExceedsMaximum = 10054;

/**
 * Turns anything a JetStream publish rejected with into an {@linkcode OutboxPublishError}:
 *
 * | nats.js error (anywhere in the `cause` chain) | kind | code |
 * | --- | --- | --- |
 * | `NoRespondersError` (nothing answered: no stream, a stream without leader, or no JetStream) | `retryable` | `no_stream` |
 * | `TimeoutError` (no PubAck in time; also while disconnected) | `unavailable` | `timeout` |
 * | `ClosedConnectionError`; a `RequestError` "connection closed" (js.publish in flight at close) | `unavailable`, scope `connection` | `connection_closed` |
 * | `DrainingConnectionError` | `unavailable`, scope `connection` | `connection_draining` |
 * | `ConnectionError` | `unavailable`, scope `connection` | `connection` |
 * | `JetStreamApiError` with status 503 (e.g. 10077, a full stream with `discard: new`) | `unavailable` | `api_<err_code>` |
 * | `InvalidSubjectError` | `permanent` | `invalid_subject` |
 * | `InvalidArgumentError` about `max_payload` | `permanent` | `max_payload` |
 * | other `InvalidArgumentError` | `permanent` | `invalid_argument` |
 * | `JetStreamApiError` 10054 (over the stream's `max_msg_size`) | `permanent` | `max_msg_size` |
 * | other `JetStreamApiError` | `retryable` | `api_<err_code>` |
 * | `JetStreamNotEnabled` (not caused by no responders) | `retryable` | `jetstream_not_enabled` |
 * | anything else | `retryable` | `publish_failed` |
 *
 * An `OutboxPublishError` is returned unchanged. nats.js uses one class for every bad argument,
 * so only the `max_payload` sub-case looks at the message text.
 *
 * "No responders" is ambiguous on its own (nats.js reports it as `JetStreamNotEnabled` whatever
 * the reason): {@linkcode createJetStreamRuntime} asks the JetStream API which case it is and
 * throws a precise error (`no_stream` for the subject, `stream_unavailable` for one stream,
 * `jetstream_not_enabled` for the whole server), with its {@linkcode OutboxFailureScope}.
 *
 * @example
 * ```ts
 * import { classifyJetStreamError } from "@outbox/nats";
 * const error = classifyJetStreamError(new Error("boom"));
 * console.log(error.kind, error.code); // "retryable" "publish_failed"
 * ```
 */
export function classifyJetStreamError(error: unknown): OutboxPublishError {
  if (error instanceof OutboxPublishError) return error;
  const chain = causeChain(error);
  const named = (name: string) => chain.find((item) => item.name === name);
  const make = (
    kind: "permanent" | "retryable" | "unavailable",
    code: string,
    text: string,
    scope?: OutboxFailureScope,
    detail: Error = error as Error,
  ) =>
    new OutboxPublishError(kind, `${text}: ${errorMessage(detail)}`, {
      code,
      cause: error,
      ...(scope ? { scope } : {}),
    });

  const noResponders = named("NoResponders") ?? named("NoRespondersError");
  if (noResponders) {
    // Quote the no-responders error itself, not nats.js's misleading "jetstream is not enabled".
    return make(
      "retryable",
      "no_stream",
      "no JetStream stream answered (none captures the subject, its stream has no leader, or JetStream is not enabled)",
      undefined,
      noResponders,
    );
  }
  if (named("InvalidSubjectError")) {
    return make("permanent", "invalid_subject", "the subject cannot be published to");
  }
  const invalid = named("InvalidArgumentError");
  if (invalid) {
    return invalid.message.includes("max_payload")
      ? make("permanent", "max_payload", "the message is larger than the server's max_payload")
      : make("permanent", "invalid_argument", "nats.js rejected the publish arguments");
  }
  if (named("TimeoutError")) {
    return make("unavailable", "timeout", "no PubAck in time");
  }
  // nats.js fails the requests in flight at close with a bare RequestError("connection closed")
  // (its request multiplexer's close), no ClosedConnectionError in the chain.
  if (
    named("ClosedConnectionError") ||
    chain.some((item) => item.name === "RequestError" && item.message === "connection closed")
  ) {
    return make("unavailable", "connection_closed", "the NATS connection is closed", connection);
  }
  if (named("DrainingConnectionError")) {
    return make(
      "unavailable",
      "connection_draining",
      "the NATS connection is draining",
      connection,
    );
  }
  if (named("ConnectionError")) {
    return make("unavailable", "connection", "the NATS connection failed", connection);
  }
  const api = chain.find((item) =>
    item.name === "JetStreamApiError" || item.name === "StreamNotFoundError"
  );
  if (api) {
    const code = numberField(api, "code");
    const status = numberField(api, "status");
    if (code === streamMessageExceedsMaximum) {
      return make("permanent", "max_msg_size", "the message is larger than the stream allows");
    }
    const label = `api_${code ?? "unknown"}`;
    return status === 503
      ? make("unavailable", label, "JetStream is temporarily unavailable")
      : make("retryable", label, "JetStream rejected the publish");
  }
  if (named("JetStreamNotEnabled")) {
    return make("retryable", "jetstream_not_enabled", "JetStream is not enabled");
  }
  return make("retryable", "publish_failed", "the publish failed");
}

/**
 * The error for a JetStream API error carried in a PubAck reply (`{"error": {...}}`), with the
 * name and fields of nats.js's `JetStreamApiError` (`code` = `err_code`, `status` = `code`), so
 * {@linkcode classifyJetStreamError} treats it like one. Internal: the pipelined publisher's.
 */
export function pubAckApiError(
  apiError: { code?: number; err_code?: number; description?: string },
): Error {
  const error = new Error(apiError.description ?? "JetStream API error");
  error.name = "JetStreamApiError";
  Object.defineProperties(error, {
    code: { value: apiError.err_code, enumerable: true },
    status: { value: apiError.code, enumerable: true },
  });
  return error;
}

/**
 * The error for a reply that is not a PubAck (classified `retryable`, `publish_failed`, like
 * nats.js's "invalid ack response"). Internal: the pipelined publisher's.
 */
export function pubAckInvalidError(what: string, cause?: unknown): Error {
  const error = new Error(`invalid PubAck: ${what}`, cause === undefined ? {} : { cause });
  error.name = "JetStreamError";
  return error;
}

const connection: OutboxFailureScope = Object.freeze({ kind: "connection" });

/** The error and its `cause`s, outermost first (at most 8). Internal. */
export function causeChain(error: unknown): Error[] {
  const chain: Error[] = [];
  let current: unknown = error;
  while (current instanceof Error && chain.length < 8 && !chain.includes(current)) {
    chain.push(current);
    current = current.cause;
  }
  return chain;
}

function numberField(error: Error, field: string): number | undefined {
  try {
    const value = (error as unknown as Record<string, unknown>)[field];
    return typeof value === "number" ? value : undefined;
  } catch {
    return undefined;
  }
}
