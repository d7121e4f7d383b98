/**
 * The runtime encodes text payloads itself (into the shared slab); anything else still goes to
 * nats.js as it is (review7): a payload that is not text, which a custom store can hand back
 * behind the types' back, is refused and nothing is stored; bytes are published unchanged.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  type JetStreamOutboxRuntime,
  outboxMessageToPreparedEvent,
  type PreparedEvent,
} from "../mod.ts";
import { connectNats, createTestStream, type TestStream } from "./kit/mod.ts";

function eventWithPayload(subject: string, id: string, payload: unknown): PreparedEvent {
  const now = new Date().toISOString();
  return outboxMessageToPreparedEvent({
    id,
    kind: "event.publish",
    name: "demo",
    subject,
    // What a custom store's JSON column could hand back: JSON.parse accepts it.
    payload: payload as string,
    headers: {},
    state: "claimed",
    attempts: 1,
    createdAt: now,
    updatedAt: now,
  });
}

/** Runs `body` with a runtime on a fresh stream of the test server. */
async function withRuntime(
  body: (runtime: JetStreamOutboxRuntime, stream: TestStream, nc: NatsConnection) => Promise<void>,
): Promise<void> {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    await body(createJetStreamRuntime(jetstream(nc)), stream, nc);
  } finally {
    await nc.close();
  }
}

Deno.test("runtime: a payload that is not text is refused, never published empty", () =>
  withRuntime(async (runtime, stream, nc) => {
    for (const [id, payload] of [["num-1", 42], ["bool-1", true]] as const) {
      await assert.rejects(
        runtime.publishPreparedEvent(eventWithPayload(`${stream.prefix}.a`, id, payload)),
        /payload types can be strings or Uint8Array/,
      );
    }
    const info = await (await jetstreamManager(nc)).streams.info(stream.name);
    assert.equal(info.state.messages, 0);
  }));

Deno.test("runtime: a payload given as bytes is published unchanged", () =>
  withRuntime(async (runtime, stream, nc) => {
    const event = {
      ...eventWithPayload(`${stream.prefix}.a`, "bytes-1", '{"a":1}'),
      encodedPayload: new TextEncoder().encode('{"a":"bytes"}'),
    } as unknown as PreparedEvent;
    const receipt = await runtime.publishPreparedEvent(event);
    const stored = await (await jetstreamManager(nc)).streams.getMessage(stream.name, {
      seq: receipt.seq!,
    });
    assert.equal(new TextDecoder().decode(stored!.data), '{"a":"bytes"}');
  }));
