/**
 * The id a JetStream message is recorded under in the inbox.
 *
 * @module
 */

import { outboxHeaders } from "../core/events.ts";

/**
 * A message without a `Nats-Msg-Id` header did not tell when its stream stored it, so it has no
 * id that survives the stream being deleted and recreated (whose sequences restart at 1). The
 * message is not processed (the consumer loop naks it, as for a handler error). nats.js
 * messages always carry the time; only hand-made message objects lack it.
 *
 * @example
 * ```ts
 * import { InboxMessageIdError } from "@outbox/nats";
 * const error = new InboxMessageIdError("ORDERS", 42);
 * console.log(error.stream, error.streamSequence);
 * ```
 */
export class InboxMessageIdError extends Error {
  /** The stream the message came from. */
  readonly stream: string;
  /** Its stream sequence. */
  readonly streamSequence: number;
  /** Creates the error for the message at `streamSequence` of `stream`. */
  constructor(stream: string, streamSequence: number, options?: ErrorOptions) {
    super(
      `Message ${streamSequence} of stream '${stream}' has no Nats-Msg-Id header and no stored ` +
        `timestamp: it has no inbox id that survives the stream being recreated`,
      options,
    );
    this.name = "InboxMessageIdError";
    this.stream = stream;
    this.streamSequence = streamSequence;
  }
}

/**
 * The id a JetStream message is recorded under: its `Nats-Msg-Id` header (any case), else
 * `<stream>:<stream sequence>:<stored time in ns>`.
 *
 * The stored time is part of the fallback because a deleted and recreated stream restarts its
 * sequences: `<stream>:<sequence>` alone would make new messages duplicates of old ones still
 * in the inbox. The time a message was stored is the same on every redelivery (and in a
 * restored backup of the stream, whose messages are the same messages), and differs for the
 * new message at the same sequence of a recreated stream. Throws
 * {@linkcode InboxMessageIdError} for a message with neither (never a nats.js message).
 *
 * (Earlier releases recorded `<stream>:<sequence>`: a message without `Nats-Msg-Id` recorded
 * by such a release and redelivered after the upgrade is processed again.)
 *
 * @example
 * ```ts
 * import type { JsMsg } from "@nats-io/jetstream";
 * import { messageIdOf } from "@outbox/nats";
 * const idOf = (message: JsMsg): string => messageIdOf(message);
 * ```
 */
export function messageIdOf(message: {
  readonly headers?: { get(key: string): string } | undefined;
  readonly info: {
    readonly stream: string;
    readonly streamSequence: number;
    readonly timestampNanos?: number;
  };
  readonly timestampNanos?: bigint;
}): string {
  const headers = message.headers;
  const id = headers?.get(outboxHeaders.messageId) ||
    headers?.get(outboxHeaders.messageId.toLowerCase());
  if (id) return id;
  const { stream, streamSequence } = message.info;
  const stored = exactTimestamp(message) ?? message.info.timestampNanos;
  if (stored === undefined || stored === null || !(Number(stored) > 0)) {
    throw new InboxMessageIdError(stream, streamSequence);
  }
  return `${stream}:${streamSequence}:${stored}`;
}

/** nats.js `JsMsg#timestampNanos` (a getter that can throw on a hand-made reply subject). */
function exactTimestamp(message: { readonly timestampNanos?: bigint }): bigint | undefined {
  try {
    return message.timestampNanos;
  } catch {
    return undefined;
  }
}
