/** The installed package dispatches to real JetStream on Node. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
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
