/**
 * The pipelined publisher (`PubAckPipeline`, the runtime's default) against real nats-server:
 * acks and duplicates, the same classification as `js.publish`, timeouts with late replies,
 * close and drain mid-flight, reconnects, and window back-pressure.
 */

import assert from "node:assert/strict";
import process from "node:process";
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
  // A status listener (as an application logging reconnects has) makes nats.js close the
  // subscriptions before it reports the connection closed: still `connection_closed`.
  const watching = (async () => {
    for await (const _ of nc.status()) { /* logged by an application */ }
  })();
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
  await watching;
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

Deno.test("PubAckPipeline: a publish the account may not make fails at once, classified as with js.publish", async () => {
  // nats-server answers a denied PUB with `-ERR 'Permissions Violation for Publish to "<subject>"'`
  // and no reply: js.publish fails at once (nats.js matches the error to the request); the
  // pipeline must too, not wait out its timeout as `unavailable` (which pauses the whole
  // dispatcher for one subject's permissions).
  await using server = await NatsServer.start({
    config: [
      `accounts { A { jetstream: enabled, users: [ { user: a, password: a, permissions: { publish: { allow: [">"], deny: ["denied.>"] } } } ] } }`,
    ],
  });
  const nc = await connectNats(server.url, { user: "a", pass: "a" });
  try {
    await (await jetstreamManager(nc)).streams.add({
      name: "perm",
      subjects: ["denied.>", "ok.>"],
    });
    for (const publisher of modes) {
      const runtime = createJetStreamRuntime(jetstream(nc), { publisher, timeoutMs: 10_000 });
      const started = performance.now();
      const denied = await Promise.all([
        failure(runtime.publishPreparedEvent(event("denied.a"))),
        failure(runtime.publishPreparedEvent(event("denied.b"))),
      ]);
      const waited = performance.now() - started;
      for (const error of denied) {
        assert.deepEqual([error.kind, error.code], ["retryable", "publish_failed"], publisher);
        assert.match(error.message, /Permissions Violation/, publisher);
      }
      assert.ok(waited < 5_000, `${publisher}: failed after ${waited} ms, not at once`);
      const ack = await runtime.publishPreparedEvent(event("ok.a"));
      assert.equal(ack.stream, "perm", `${publisher}: other subjects still publish`);
    }
    assert.equal(pubAckPipelineFor(nc).pending, 0);
  } finally {
    await nc.close();
  }
});

Deno.test("PubAckPipeline: a NaN budget or a timeout beyond the timer range neither hangs nor spins", async () => {
  await using server = await NatsServer.start();
  const warnings: string[] = [];
  const onWarning = (warning: Error) => warnings.push(warning.name);
  process.on("warning", onWarning);
  try {
    for (const publisher of modes) {
      const nc = await connectNats(server.url);
      try {
        await (await jetstreamManager(nc)).streams.add({ name: "range", subjects: ["range.>"] });
        await frozen(server, nc);
        // A NaN budget (a caller's arithmetic gone wrong) is ignored: the runtime's own timeout
        // applies. Before, the publish never settled (a deadline of NaN is never reached).
        const runtime = createJetStreamRuntime(jetstream(nc), { publisher, timeoutMs: 300 });
        const started = performance.now();
        let giveUp: ReturnType<typeof setTimeout> | undefined;
        const nan = await Promise.race([
          failure(runtime.publishPreparedEvent(event("range.a"), { timeoutMs: NaN })),
          new Promise<undefined>((resolve) => giveUp = setTimeout(() => resolve(undefined), 3_000)),
        ]).finally(() => clearTimeout(giveUp));
        assert.ok(nan !== undefined, `${publisher}: a NaN budget never settled`);
        assert.deepEqual([nan.kind, nan.code], ["unavailable", "timeout"], publisher);
        assert.ok(performance.now() - started >= 250, publisher);

        // 30 days: more than a timer holds (2^31-1 ms). Before, js.publish timed out at once and
        // the pipeline re-armed a 1 ms sweep (a TimeoutOverflowWarning each) until the deadline.
        const days = createJetStreamRuntime(jetstream(nc), {
          publisher,
          timeoutMs: 30 * 86_400_000,
        });
        let settled = false;
        const pending = days.publishPreparedEvent(event("range.b"));
        void pending.then(() => settled = true, () => settled = true);
        await sleep(300);
        assert.equal(settled, false, `${publisher}: a 30-day timeout ended within 300 ms`);
        // The pipeline on its own, with no runtime to cap the timeout.
        const direct = new PubAckPipeline(nc).publish(
          "range.c",
          "x",
          msgId(uniqueName("id")),
          30 * 86_400_000,
        );
        await sleep(50);
        server.resume();
        assert.equal((await pending).stream, "range", publisher);
        assert.equal((await direct).stream, "range", publisher);
      } finally {
        server.resume();
        if (!nc.isClosed()) await nc.close();
      }
      await (async () => {
        const admin = await connectNats(server.url);
        await (await jetstreamManager(admin)).streams.delete("range");
        await admin.close();
      })();
    }
  } finally {
    process.off("warning", onWarning);
  }
  assert.deepEqual(warnings.filter((name) => name === "TimeoutOverflowWarning"), []);
});

Deno.test("PubAckPipeline: a publish in flight when the connection closes is connection_closed with either publisher", async () => {
  // nats.js fails the requests in flight at close with a bare `RequestError("connection closed")`
  // (no typed cause): js.publish classified it `retryable` (`publish_failed`) while the pipeline
  // said `unavailable` (`connection_closed`).
  await using server = await NatsServer.start();
  for (const publisher of modes) {
    const nc = await connectNats(server.url);
    await (await jetstreamManager(nc)).streams.add({ name: "shut", subjects: ["shut.>"] });
    const runtime = createJetStreamRuntime(jetstream(nc), { publisher, timeoutMs: 30_000 });
    await frozen(server, nc);
    const inFlight = failure(runtime.publishPreparedEvent(event("shut.a")));
    await sleep(50);
    await nc.close();
    const error = await inFlight;
    assert.deepEqual([error.kind, error.code], ["unavailable", "connection_closed"], publisher);
    server.resume();
    const admin = await connectNats(server.url);
    await (await jetstreamManager(admin)).streams.delete("shut");
    await admin.close();
  }
});
