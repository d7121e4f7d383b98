/**
 * The pipelined publisher (`PubAckPipeline`, the runtime's default) against real nats-server:
 * acks and duplicates, the same classification as `js.publish`, timeouts with late replies,
 * close and drain mid-flight, reconnects, and window back-pressure.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/nats-core";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  classifyJetStreamError,
  createJetStreamRuntime,
  type OutboxPublishError,
  type PreparedEvent,
  PubAckPipeline,
  pubAckPipelineFor,
} from "../mod.ts";
import {
  connectNats,
  createTestStream,
  eventually,
  NatsServer,
  sleep,
  uniqueName,
} from "./kit/mod.ts";

function event(subject: string, id = uniqueName("id"), headers: Record<string, string> = {}) {
  return {
    header: { id, name: "test.event", source: "test", time: new Date().toISOString() },
    subject,
    headers,
    encodedPayload: JSON.stringify({ id }),
  } as unknown as PreparedEvent;
}

function msgId(id: string) {
  const h = natsHeaders();
  h.set("Nats-Msg-Id", id);
  return h;
}

async function failure(promise: Promise<unknown>): Promise<OutboxPublishError> {
  const error = await promise.then(() => undefined, (e) => e);
  assert.ok(error !== undefined, "expected a rejection");
  return classifyJetStreamError(error);
}

/** Freezes the server: its socket still accepts bytes, nothing is answered. */
async function frozen(server: NatsServer, nc: NatsConnection): Promise<void> {
  await nc.flush();
  server.pause();
  await sleep(100); // SIGSTOP takes effect asynchronously
}

const modes = ["pipeline", "js.publish"] as const;

Deno.test("PubAckPipeline: ack, duplicate, 503 no stream and API errors classified as with js.publish", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    await using small = await createTestStream(nc, { max_msg_size: 100 });
    for (const publisher of modes) {
      const runtime = createJetStreamRuntime(jetstream(nc), { publisher });
      const first = event(`${stream.prefix}.${publisher}`);
      const ack = await runtime.publishPreparedEvent(first);
      assert.equal(ack.stream, stream.name);
      assert.equal(ack.duplicate, false);
      const again = await runtime.publishPreparedEvent(first);
      assert.deepEqual(again, { ...ack, duplicate: true }, `${publisher}: duplicate is success`);

      const noStream = await failure(runtime.publishPreparedEvent(event(uniqueName("nostream"))));
      assert.deepEqual([noStream.kind, noStream.code], ["retryable", "no_stream"], publisher);

      // A JetStream API error in the reply, with its code: the expected stream does not match.
      const wrong = await failure(runtime.publishPreparedEvent(
        event(`${stream.prefix}.x`, uniqueName("id"), { "Nats-Expected-Stream": "other" }),
      ));
      assert.deepEqual([wrong.kind, wrong.code], ["retryable", "api_10060"], publisher);
      const tooBig = await failure(runtime.publishPreparedEvent({
        ...event(`${small.prefix}.a`),
        encodedPayload: JSON.stringify("x".repeat(500)),
      }));
      assert.deepEqual([tooBig.kind, tooBig.code], ["permanent", "max_msg_size"], publisher);
      const badSubject = await failure(runtime.publishPreparedEvent(event("has space")));
      assert.deepEqual([badSubject.kind, badSubject.code], ["permanent", "invalid_subject"]);
    }
    const info = await (await jetstreamManager(nc)).streams.info(stream.name);
    assert.equal(info.state.messages, 2, "one message per mode, duplicates absorbed");
  } finally {
    await nc.close();
  }
  for (const publisher of modes) {
    const runtime = createJetStreamRuntime(jetstream(nc), { publisher });
    const closed = await failure(runtime.publishPreparedEvent(event("any.subject")));
    assert.deepEqual([closed.kind, closed.code], ["unavailable", "connection_closed"], publisher);
  }
});

Deno.test("PubAckPipeline: one reply subscription per connection, shared by runtimes", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const pipeline = pubAckPipelineFor(nc);
    assert.equal(pubAckPipelineFor(nc, { window: 4096 }), pipeline);
    assert.equal(pipeline.window, 4096, "the largest window asked for");
    const before = nc.stats().outMsgs;
    const runtimes = [createJetStreamRuntime(jetstream(nc)), createJetStreamRuntime(jetstream(nc))];
    const acks = await Promise.all(
      Array.from(
        { length: 200 },
        (_, i) => runtimes[i % 2].publishPreparedEvent(event(`${stream.prefix}.${i % 7}`)),
      ),
    );
    assert.deepEqual(
      acks.map((ack) => ack.seq).sort((a, b) => a - b),
      Array.from({ length: 200 }, (_, i) => i + 1),
    );
    assert.equal(nc.stats().outMsgs - before, 200, "one message per publish, no API requests");
    assert.equal(pipeline.pending, 0);
  } finally {
    await nc.close();
  }
});

Deno.test("PubAckPipeline: a timeout fails as unavailable; the late PubAck is ignored", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url);
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "late", subjects: ["late.>"] });
    const pipeline = new PubAckPipeline(nc);
    await pipeline.publish("late.warmup", "w", msgId("warm"), 5_000);
    await frozen(server, nc);
    const received = nc.stats().inMsgs;
    const started = performance.now();
    const timedOut = await failure(pipeline.publish("late.a", "one", msgId("late-1"), 200));
    const waited = performance.now() - started;
    assert.deepEqual([timedOut.kind, timedOut.code], ["unavailable", "timeout"]);
    assert.ok(waited >= 190 && waited < 1_500, `timed out after ${waited} ms`);
    assert.equal(pipeline.pending, 0);
    server.resume();
    // The stream stored it and its PubAck arrives late: ignored, and nothing else is settled by it.
    await eventually(() => {
      if (nc.stats().inMsgs === received) throw new Error("no late reply yet");
    });
    const next = await pipeline.publish("late.a", "two", msgId("late-2"), 5_000);
    assert.deepEqual([next.seq, next.duplicate], [3, false]);
    const retried = await pipeline.publish("late.a", "one", msgId("late-1"), 5_000);
    assert.deepEqual([retried.seq, retried.duplicate], [2, true], "the timed-out one was stored");
  } finally {
    server.resume();
    await nc.close();
  }
});

Deno.test("PubAckPipeline: close mid-flight fails every pending publish as connection_closed", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url);
  await (await jetstreamManager(nc)).streams.add({ name: "closing", subjects: ["closing.>"] });
  const pipeline = new PubAckPipeline(nc, { window: 2 });
  await frozen(server, nc);
  const inFlight = Array.from(
    { length: 5 },
    (_, i) => failure(pipeline.publish("closing.a", "x", msgId(`c-${i}`), 30_000)),
  );
  assert.equal(pipeline.pending, 5, "2 in flight, 3 waiting for the window");
  const started = performance.now();
  await nc.close();
  const errors = await Promise.all(inFlight);
  assert.ok(performance.now() - started < 5_000, "nothing waited for its timeout");
  for (const error of errors) {
    assert.deepEqual([error.kind, error.code], ["unavailable", "connection_closed"]);
  }
  assert.equal(pipeline.pending, 0);
  server.resume();
});

Deno.test("PubAckPipeline: drain mid-flight settles every publish; publishes after it fail as draining", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url);
  try {
    await (await jetstreamManager(nc)).streams.add({ name: "drain", subjects: ["drain.>"] });
    const pipeline = new PubAckPipeline(nc);
    await frozen(server, nc);
    const inFlight = Array.from(
      { length: 20 },
      (_, i) =>
        pipeline.publish("drain.a", "x", msgId(`d-${i}`), 30_000).then(
          (ack) => ack.stream,
          (error) => classifyJetStreamError(error).code,
        ),
    );
    const started = performance.now();
    const drained = nc.drain();
    const after = await failure(pipeline.publish("drain.a", "x", msgId("d-late"), 30_000));
    assert.deepEqual([after.kind, after.code], ["unavailable", "connection_draining"]);
    server.resume();
    await drained;
    const outcomes = await Promise.all(inFlight);
    assert.ok(performance.now() - started < 10_000, "nothing waited for its 30 s timeout");
    for (const outcome of outcomes) {
      assert.ok(
        ["drain", "connection_draining", "connection_closed"].includes(outcome),
        `acknowledged or failed as the connection going away: ${outcome}`,
      );
    }
    assert.equal(pipeline.pending, 0);
  } finally {
    server.resume();
    if (!nc.isClosed()) await nc.close();
  }
});

Deno.test("PubAckPipeline: the reply subscription survives a server restart", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url, {
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
  try {
    await (await jetstreamManager(nc)).streams.add({ name: "restart", subjects: ["restart.>"] });
    const runtime = createJetStreamRuntime(jetstream(nc));
    const first = await runtime.publishPreparedEvent(event("restart.a", "r-1"));
    assert.equal(first.seq, 1);
    await server.kill("SIGKILL");
    // Sent while the server is down: nats.js drops its buffer when it reconnects, so it fails by
    // its timeout as unavailable (and a dispatcher would send it again).
    const down = await failure(
      runtime.publishPreparedEvent(event("restart.a", "r-2"), { timeoutMs: 300 }),
    );
    assert.deepEqual([down.kind, down.code], ["unavailable", "timeout"]);
    await server.restart();
    const ack = await eventually(
      () => runtime.publishPreparedEvent(event("restart.a", "r-2"), { timeoutMs: 500 }),
      { timeoutMs: 20_000 },
    );
    assert.equal(ack.stream, "restart");
    const again = await runtime.publishPreparedEvent(event("restart.a", "r-1"));
    assert.deepEqual([again.seq, again.duplicate], [1, true], "the store and the dedup survived");
    assert.equal(pubAckPipelineFor(nc).pending, 0);
  } finally {
    await nc.close();
  }
});

Deno.test("PubAckPipeline: the window holds back publishes until PubAcks free slots; queued ones time out too", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url);
  try {
    await (await jetstreamManager(nc)).streams.add({ name: "window", subjects: ["window.>"] });
    const pipeline = new PubAckPipeline(nc, { window: 3 });
    await frozen(server, nc);
    const sentBefore = nc.stats().outMsgs;
    const acks = Array.from(
      { length: 10 },
      (_, i) => pipeline.publish("window.a", "x", msgId(`w-${i}`), 30_000),
    );
    assert.equal(nc.stats().outMsgs - sentBefore, 3, "only the window is sent");
    assert.equal(pipeline.pending, 10);
    server.resume();
    const seqs = (await Promise.all(acks)).map((ack) => ack.seq);
    assert.deepEqual(seqs, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "sent in order as slots freed");
    assert.equal(nc.stats().outMsgs - sentBefore, 10);

    await frozen(server, nc);
    const started = performance.now();
    const held = Array.from(
      { length: 5 },
      (_, i) => failure(pipeline.publish("window.a", "x", msgId(`t-${i}`), 300)),
    );
    const errors = await Promise.all(held);
    assert.ok(performance.now() - started < 2_000);
    for (const error of errors) {
      assert.deepEqual([error.kind, error.code], ["unavailable", "timeout"]);
    }
    assert.equal(pipeline.pending, 0);
    server.resume();
  } finally {
    server.resume();
    await nc.close();
  }
});
