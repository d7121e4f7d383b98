/**
 * The broker-side key fence on JetStream: the expectation header, and what a refusal means.
 *
 * A keyed message is published with `Nats-Expected-Last-Subject-Sequence` = the stream sequence
 * of its key's previous message. The server refuses it with API error 10071 ("wrong last
 * sequence") when another message is last on the subject. That happens in two very different
 * cases, told apart by reading the last message on the subject:
 *
 * - it is THIS message (same `Nats-Msg-Id`): an earlier attempt was stored and its PubAck lost,
 *   and this retry was checked against the sequence before the duplicate window (nats-server
 *   2.12+ standalone checks the sequence first; 2.9 to 2.11 answer such a retry with a duplicate
 *   PubAck instead). It is a success, with the stored sequence;
 * - it is another message: something else published to the key's subject (another publisher,
 *   another key mapped to the same subject, a purge). Retrying cannot help: `permanent`,
 *   `key_fence`.
 *
 * @module
 */

import { errorMessage, OutboxPublishError } from "../core/errors.ts";
import { outboxHeaders } from "../core/events.ts";
import { causeChain } from "./jetstream_errors.ts";
import type { JetStreamManagerLike } from "./jetstream_scope.ts";

/** The header that carries the fence's expectation. */
export const expectedLastSubjectSequenceHeader = "Nats-Expected-Last-Subject-Sequence";

/** JetStream API error code: the expected last (subject) sequence did not match. */
const wrongLastSequence = 10071;

/** Whether a publish failure is the fence's refusal (API error 10071). Internal. */
export function isFenceRefusal(error: unknown): boolean {
  return causeChain(error).some((item) =>
    item.name === "JetStreamApiError" &&
    (item as unknown as { code?: unknown }).code === wrongLastSequence
  );
}

/**
 * After a fence refusal: the receipt of this message if it is the last one on `subject` (an
 * earlier attempt was stored), else a `permanent` `key_fence` error; a lookup that fails is a
 * `retryable` `key_fence_unverified` error (the next attempt publishes with the same
 * expectation and checks again). Internal.
 */
export async function recogniseFenceRefusal(
  manager: () => Promise<JetStreamManagerLike>,
  subject: string,
  id: string,
  expected: number,
  refusal: unknown,
): Promise<{ stream: string; seq: number; duplicate: true }> {
  let stream: string;
  let last;
  try {
    const streams = (await manager()).streams;
    if (!streams?.getMessage) throw new Error("the JetStream manager cannot read messages");
    stream = await streams.find(subject);
    last = await streams.getMessage(stream, { last_by_subj: subject });
  } catch (error) {
    throw new OutboxPublishError(
      "retryable",
      `the key fence refused the publish to ${subject} (expected last sequence ${expected}) and the last message on the subject could not be read to tell a stored earlier attempt from a conflict: ${
        errorMessage(error)
      }`,
      { code: "key_fence_unverified", cause: error },
    );
  }
  const lastId = last?.header?.get(outboxHeaders.messageId) || undefined;
  if (last && lastId === id && Number.isSafeInteger(last.seq) && last.seq > 0) {
    return { stream, seq: last.seq, duplicate: true };
  }
  const found = last
    ? `is sequence ${last.seq} (${
      lastId === undefined ? "without Nats-Msg-Id" : `Nats-Msg-Id ${JSON.stringify(lastId)}`
    })`
    : "does not exist (no message on the subject)";
  throw new OutboxPublishError(
    "permanent",
    `the key fence refused the publish to ${subject}: it expected the key's previous message at stream sequence ${expected}, but the last message on the subject ${found}. Something else published to the key's subject (another publisher, or another ordering key mapped to the same subject), or the stream was purged or recreated. The key is blocked behind this message; retry or skip it (unblockKey) to publish the key's next message without a fence`,
    { code: "key_fence", cause: refusal },
  );
}
