/** The installed package dispatches to real JetStream on Node. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { headers } from "@nats-io/nats-core";
import {
  classifyJetStreamError,
  createJetStreamRuntime,
  MemoryOutboxRepository,
  OutboxDispatcher,
  pubAckPipelineFor,
} from "@outbox/nats";
import { natsUrl, uniqueName } from "./servers.ts";

test("node: OutboxDispatcher publishes to JetStream and settles every message", async () => {
  const nc = await connect({ servers: natsUrl() });
  const name = uniqueName("node_dispatch");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name, subjects: [`${name}.>`] });
  try {
    const outbox = new MemoryOutboxRepository();
    await outbox.enqueueMany(Array.from({ length: 50 }, (_, i) => ({
      id: `${name}-${i}`,
      kind: "event.publish" as const,
      name: "node.test",
      subject: `${name}.e`,
      payload: JSON.stringify({ i }),
      headers: { "X-Node": "yes" },
    })));
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      limit: 20,
    });
    await dispatcher.whenIdle();
    await dispatcher.stop();
    assert.equal((await outbox.stats()).dispatched, 50);
    assert.equal((await jsm.streams.info(name)).state.messages, 50);
  } finally {
    await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
});

test("node: the pipelined publisher acks, absorbs duplicates and classifies 503 on the Node transport", async () => {
  const nc = await connect({ servers: natsUrl() });
  const name = uniqueName("node_pipeline");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name, subjects: [`${name}.>`] });
  try {
    const pipeline = pubAckPipelineFor(nc);
    const sent = nc.stats().outMsgs;
    const acks = await Promise.all(Array.from({ length: 100 }, (_, i) => {
      const h = headers();
      h.set("Nats-Msg-Id", `${name}-${i % 50}`);
      return pipeline.publish(`${name}.e`, JSON.stringify({ i }), h, 5_000);
    }));
    assert.equal(nc.stats().outMsgs - sent, 100, "one message per publish, no requests");
    assert.equal(acks.filter((ack) => ack.duplicate).length, 50);
    assert.equal((await jsm.streams.info(name)).state.messages, 50);
    // No stream for the subject: JetStream's 503 arrives on the reply subscription.
    const failure = await pipeline.publish(`${name}_none.e`, "x", headers(), 5_000).then(
      () => undefined,
      (error) => error,
    );
    assert.equal(classifyJetStreamError(failure).code, "no_stream");
    assert.equal(pipeline.pending, 0);
  } finally {
    await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
});
