/**
 * Prepared events <-> outbox records, with the reference's header names. Reading accepts
 * lower-case header names too.
 *
 * @module
 */

import { OutboxCorruptRecordError } from "./errors.ts";
import type { OutboxMessage, OutboxRecord, PreparedEvent } from "./types.ts";

/**
 * Header names the outbox reads and writes.
 *
 * @example
 * ```ts
 * import { outboxHeaders } from "@outbox/nats";
 * console.log(outboxHeaders.messageId); // "Nats-Msg-Id"
 * ```
 */
export const outboxHeaders: {
  readonly messageId: "Nats-Msg-Id";
  readonly eventTime: "Trellis-Event-Time";
  readonly eventDescriptor: "Trellis-Event-Descriptor";
} = Object.freeze({
  messageId: "Nats-Msg-Id",
  eventTime: "Trellis-Event-Time",
  eventDescriptor: "Trellis-Event-Descriptor",
});

/**
 * Adapts a prepared event into an outbox record: `id` is the event id, and the headers gain
 * `Nats-Msg-Id`, `Trellis-Event-Time` and (when the event has one) `Trellis-Event-Descriptor`.
 *
 * @example
 * ```ts
 * import { preparedTrellisEventToOutboxRecord } from "@outbox/nats";
 * const record = preparedTrellisEventToOutboxRecord({
 *   event: "order.created",
 *   subject: "orders.created",
 *   header: { id: "evt-1", time: "2026-01-01T00:00:00.000Z" },
 *   payload: { orderId: 42 },
 *   encodedPayload: '{"orderId":42}',
 *   headers: {},
 * });
 * console.log(record.headers["Nats-Msg-Id"]); // "evt-1"
 * ```
 */
export function preparedTrellisEventToOutboxRecord(event: PreparedEvent): OutboxRecord {
  const headers: Record<string, string> = {
    ...event.headers,
    [outboxHeaders.messageId]: event.header.id,
    [outboxHeaders.eventTime]: event.header.time,
  };
  if (event.descriptorIdentity !== undefined) {
    headers[outboxHeaders.eventDescriptor] = event.descriptorIdentity;
  }
  return {
    id: event.header.id,
    kind: "event.publish",
    name: event.event,
    subject: event.subject,
    payload: event.encodedPayload,
    headers,
  };
}

/**
 * Rehydrates a stored `event.publish` message into a prepared event. The event id is the
 * `Nats-Msg-Id` header (any case) or else the message id; the time is `Trellis-Event-Time` or
 * else `createdAt`. Throws {@linkcode OutboxCorruptRecordError} for another kind or a payload
 * that is not JSON.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, outboxMessageToPreparedEvent } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * const message = await outbox.enqueue({
 *   id: "evt-1", kind: "event.publish", name: "demo", subject: "demo.a", payload: '{"a":1}', headers: {},
 * });
 * console.log(outboxMessageToPreparedEvent(message).payload); // { a: 1 }
 * ```
 */
export function outboxMessageToPreparedEvent(message: OutboxMessage): PreparedEvent {
  if (message.kind !== "event.publish") {
    throw new OutboxCorruptRecordError(
      message.id,
      `expected kind event.publish, got ${message.kind}`,
    );
  }
  let payload: unknown;
  try {
    payload = JSON.parse(message.payload);
  } catch (error) {
    throw new OutboxCorruptRecordError(message.id, "payload is not valid JSON", { cause: error });
  }
  const headers = message.headers;
  const id = readHeader(headers, outboxHeaders.messageId, lowerCase.messageId) ?? message.id;
  const time = readHeader(headers, outboxHeaders.eventTime, lowerCase.eventTime) ??
    message.createdAt;
  const descriptorIdentity = readHeader(
    headers,
    outboxHeaders.eventDescriptor,
    lowerCase.eventDescriptor,
  );
  const event: PreparedEvent = {
    event: message.name,
    subject: message.subject,
    header: Object.freeze({ id, time }),
    payload: Object.freeze(payload),
    encodedPayload: message.payload,
    headers: Object.freeze({ ...headers }),
  };
  if (descriptorIdentity !== undefined) event.descriptorIdentity = descriptorIdentity;
  return Object.freeze(event);
}

const lowerCase = {
  messageId: outboxHeaders.messageId.toLowerCase(),
  eventTime: outboxHeaders.eventTime.toLowerCase(),
  eventDescriptor: outboxHeaders.eventDescriptor.toLowerCase(),
};

function readHeader(
  headers: Record<string, string>,
  name: string,
  lower: string,
): string | undefined {
  return headers[name] ?? headers[lower];
}
