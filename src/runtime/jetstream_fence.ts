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
 * - it is an OLDER message than the expected one, or there is none: the key's previous message
 *   was removed from the stream (a limit such as `max_age` or `max_msgs`, work-queue or interest
 *   retention, a delete or purge) and nothing was published to the subject since. Removing
 *   messages cannot reorder the ones that remain, so the publish is sent again expecting that
 *   older message (or, with none, an empty subject: expectation 0);
 * - it is a newer message that is not ours: something else published to the key's subject
 *   (another publisher, another key mapped to the same subject). Retrying cannot help:
 *   `permanent`, `key_fence`.
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

/** What a fence refusal turned out to be, when it is not a conflict. Internal. */
export type FenceRefusal =
  /** An earlier attempt of this message is the last one on the subject. */
  | { kind: "stored"; receipt: { stream: string; seq: number; duplicate: true } }
  /** The key's previous message is gone; `last` is the subject's last sequence now (0: none). */
  | { kind: "removed"; last: number };

/**
 * After a fence refusal: `stored` with the receipt of this message if it is the last one on
 * `subject` (an earlier attempt was stored); `removed` when the subject's last message is older
 * than `expected` or there is none (the key's previous message was removed, and nothing newer
 * came: publish again expecting `last`); else a `permanent` `key_fence` error. A lookup that
 * fails is a `retryable` `key_fence_unverified` error (the next attempt publishes with the same
 * expectation and checks again). Internal.
 */
export async function recogniseFenceRefusal(
  manager: () => Promise<JetStreamManagerLike>,
  subject: string,
  id: string,
  expected: number,
  refusal: unknown,
): Promise<FenceRefusal> {
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
    return { kind: "stored", receipt: { stream, seq: last.seq, duplicate: true } };
  }
  if (!last) return { kind: "removed", last: 0 };
  if (Number.isSafeInteger(last.seq) && last.seq > 0 && last.seq < expected) {
    return { kind: "removed", last: last.seq };
  }
  const found = last
    ? `is sequence ${last.seq} (${
      lastId === undefined ? "without Nats-Msg-Id" : `Nats-Msg-Id ${JSON.stringify(lastId)}`
    })`
    : "does not exist (no message on the subject)";
  throw new OutboxPublishError(
    "permanent",
    `the key fence refused the publish to ${subject}: it expected the key's previous message at stream sequence ${expected}, but the last message on the subject ${found}. Something else published to the key's subject (another publisher, or another ordering key mapped to the same subject), or the stream was recreated. The key is blocked behind this message; retry or skip it (unblockKey) to publish the key's next message without a fence`,
    { code: "key_fence", cause: refusal },
  );
}
