/**
 * Inbox ids of messages without `Nats-Msg-Id`: a deleted and recreated stream restarts its
 * sequences, and its new messages must not be taken for duplicates of the old ones still in the
 * inbox; a redelivery of one stored message keeps its id.
 */

import assert from "node:assert/strict";
import { AckPolicy, jetstream, jetstreamManager, type JsMsg } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  InboxMessageIdError,
  MemoryInboxRepository,
  messageIdOf,
} from "../mod.ts";
import { connectNats, eventually, uniqueName } from "./kit/mod.ts";

Deno.test("a recreated stream's messages without Nats-Msg-Id are not duplicates of the old stream's", async () => {
  const nc = await connectNats();
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const name = uniqueName("stream");
  const subject = uniqueName("subj");
  const inbox = new MemoryInboxRepository(); // outlives the stream, as an inbox table would
  const handled: string[] = [];
  const run = async (expected: number) => {
    await jsm.streams.add({ name, subjects: [`${subject}.>`] });
    await jsm.consumers.add(name, { durable_name: "worker", ack_policy: AckPolicy.Explicit });
    await js.publish(`${subject}.a`, `body-${expected}`); // no msgID: the fallback id is used
    const running = await consumeWithInbox(await js.consumers.get(name, "worker"), {
      scope: "worker",
      inbox,
      handler: (message: JsMsg) => {
        handled.push(message.string());
        return Promise.resolve();
      },
    });
    try {
      await eventually(() => {
        assert.equal(running.stats.processed + running.stats.duplicates, 1);
      }, { timeoutMs: 10_000 });
    } finally {
      await running.stop();
    }
    await jsm.streams.delete(name);
    return running.stats;
  };
  try {
    assert.equal((await run(1)).processed, 1);
    const second = await run(2);
    assert.equal(second.duplicates, 0, "sequence 1 of the new stream is a new message");
    assert.equal(second.processed, 1);
    assert.deepEqual(handled, ["body-1", "body-2"]);
  } finally {
    await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
});

Deno.test("a redelivered message without Nats-Msg-Id keeps its inbox id", async () => {
  const nc = await connectNats();
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const name = uniqueName("stream");
  const subject = uniqueName("subj");
  try {
    await jsm.streams.add({ name, subjects: [`${subject}.>`] });
    await jsm.consumers.add(name, { durable_name: "worker", ack_policy: AckPolicy.Explicit });
    await js.publish(`${subject}.a`, "x");
    const consumer = await js.consumers.get(name, "worker");
    const ids: string[] = [];
    for (let delivery = 1; delivery <= 2; delivery++) {
      const message = await consumer.next({ expires: 5_000 });
      assert.ok(message);
      assert.equal(message.info.deliveryCount, delivery);
      ids.push(messageIdOf(message));
      if (delivery === 1) message.nak();
      else message.ack();
    }
    assert.equal(ids[0], ids[1]);
    assert.match(ids[0], new RegExp(`^${name}:1:\\d+$`));
  } finally {
    await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
});

Deno.test("messageIdOf: a hand-made message without Nats-Msg-Id or stored time is refused", () => {
  const message = { info: { stream: "ORDERS", streamSequence: 7 } };
  assert.throws(() => messageIdOf(message), InboxMessageIdError);
  assert.equal(
    messageIdOf({
      ...message,
      headers: { get: (key: string) => key === "Nats-Msg-Id" ? "e" : "" },
    }),
    "e",
  );
});
