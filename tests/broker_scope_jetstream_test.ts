/**
 * Broker trouble has a scope, on real servers: a subject without a stream, a server without
 * JetStream, and a stream that cannot take writes (full, `discard: new`: JetStream answers 503)
 * while another stream flows.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  createJetStreamRuntime,
  MemoryOutboxRepository,
  OutboxDispatcher,
  OutboxPublishError,
  type PreparedEvent,
} from "../mod.ts";
import { connectNats, createTestStream, eventually, NatsServer, uniqueName } from "./kit/mod.ts";
import { events, signal, streamIds } from "./helpers/dispatch.ts";

function event(subject: string, id = uniqueName("evt")): PreparedEvent {
  return {
    event: "test.event",
    subject,
    header: { id, time: new Date().toISOString() },
    payload: {},
    encodedPayload: "{}",
    headers: {},
  };
}

async function publishError(
  runtime: ReturnType<typeof createJetStreamRuntime>,
  subject: string,
): Promise<OutboxPublishError> {
  try {
    await runtime.publishPreparedEvent(event(subject));
  } catch (error) {
    assert.ok(error instanceof OutboxPublishError, String(error));
    return error;
  }
  throw new Error(`publishing to ${subject} succeeded`);
}

Deno.test("jetstream scopes: no stream for the subject is a clear per-subject, retryable error (not 'jetstream is not enabled')", async () => {
  const nc = await connectNats();
  try {
    const runtime = createJetStreamRuntime(jetstream(nc));
    const subject = `${uniqueName("nostream")}.created`;
    const error = await publishError(runtime, subject);
    assert.equal(error.kind, "retryable");
    assert.equal(error.code, "no_stream");
    assert.deepEqual(error.scope, { kind: "subject", subject });
    assert.equal(
      error.message,
      `no JetStream stream captures the subject '${subject}' (create a stream whose subjects include it)`,
    );
    assert.doesNotMatch(error.message, /not enabled/i);
    assert.equal(await runtime.probe(), true);
  } finally {
    await nc.close();
  }
});

Deno.test("jetstream scopes: a server without JetStream is unavailable for everything (scope jetstream), probes say no", async () => {
  await using server = await NatsServer.start({ jetstream: false });
  const nc = await connectNats(server.url);
  try {
    const runtime = createJetStreamRuntime(jetstream(nc));
    const error = await publishError(runtime, "orders.created");
    assert.equal(error.kind, "unavailable");
    assert.equal(error.code, "jetstream_not_enabled");
    assert.deepEqual(error.scope, { kind: "jetstream" });
    assert.match(error.message, /^JetStream is not enabled on the server/);
    assert.equal(await runtime.probe(), false);
    assert.equal(await runtime.probeScope({ kind: "jetstream" }), false);
  } finally {
    await nc.close();
  }
});

Deno.test("jetstream scopes: a full stream (discard new) is unavailable for that stream only; its probe answers once there is room", async () => {
  const nc = await connectNats();
  try {
    const jsm = await jetstreamManager(nc);
    await using full = await createTestStream(nc, { max_msgs: 1, discard: "new" as never });
    const runtime = createJetStreamRuntime(jetstream(nc));
    await runtime.publishPreparedEvent(event(`${full.prefix}.a`));
    const error = await publishError(runtime, `${full.prefix}.a`);
    assert.equal(error.kind, "unavailable");
    assert.equal(error.code, "api_10077");
    assert.deepEqual(error.scope, { kind: "stream", stream: full.name });
    // A subject of that stream never published to before: the stream is found by subject.
    const other = await publishError(runtime, `${full.prefix}.b`);
    assert.deepEqual(other.scope, { kind: "stream", stream: full.name });
    assert.equal(await runtime.probeScope({ kind: "stream", stream: full.name }), false);
    assert.equal(await runtime.probeScope({ kind: "subject", subject: `${full.prefix}.b` }), false);
    const info = await jsm.streams.info(full.name);
    await jsm.streams.update(full.name, { ...info.config, max_msgs: 100 });
    assert.equal(await runtime.probeScope({ kind: "stream", stream: full.name }), true);
    assert.equal(await runtime.probeScope({ kind: "subject", subject: `${full.prefix}.b` }), true);
  } finally {
    await nc.close();
  }
});

Deno.test("jetstream scopes: the dispatcher keeps one full stream waiting while another stream flows; delivered soon after it has room", async () => {
  const nc = await connectNats();
  try {
    const jsm = await jetstreamManager(nc);
    await using full = await createTestStream(nc, { max_msgs: 1, discard: "new" as never });
    await using flowing = await createTestStream(nc);
    // One message fills the stream before the dispatcher starts.
    await jetstream(nc).publish(`${full.prefix}.seed`, "{}");
    const outbox = new MemoryOutboxRepository();
    const stuck = events(full.prefix, 10);
    const fine = events(flowing.prefix, 100);
    await outbox.enqueueMany(stuck); // oldest first: the head of the line
    await outbox.enqueueMany(fine);
    const dead: string[] = [];
    const scopePaused = signal<string>();
    const scopeResumed = signal();
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      limit: 10,
      probeIntervalMs: 50,
      probeMaxIntervalMs: 200,
      idleRetryMs: false,
      retry: { maxAttempts: 2 },
      onError: () => {},
      onDead: (message, info) => dead.push(`${message.id}: ${info.lastError}`),
      onScopePaused: (info) => scopePaused.resolve(JSON.stringify(info.scope)),
      onScopeResumed: () => scopeResumed.resolve(),
    });
    try {
      assert.equal(
        await scopePaused.promise,
        JSON.stringify({ kind: "stream", stream: full.name }),
      );
      await eventually(
        async () => assert.equal((await streamIds(nc, flowing.name)).length, fine.length),
        { timeoutMs: 15_000 },
      );
      assert.equal(dispatcher.state, "closed", "the broker-wide breaker stayed closed");
      for (const record of stuck) {
        assert.equal((await outbox.get(record.id))?.state, "failed", record.id);
      }
      const info = await jsm.streams.info(full.name);
      const roomAt = Date.now();
      await jsm.streams.update(full.name, { ...info.config, max_msgs: 100 });
      await scopeResumed.promise;
      await eventually(
        async () => assert.equal((await streamIds(nc, full.name)).length, stuck.length + 1),
        { timeoutMs: 10_000 },
      );
      const afterMs = Date.now() - roomAt;
      assert.ok(afterMs < 3_000, `delivered ${afterMs} ms after the stream had room`);
      assert.deepEqual(dead, [], "nothing went dead, although maxAttempts is 2");
    } finally {
      await dispatcher.stop();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("jetstream scopes: against a server without JetStream the dispatcher pauses everything and spends no attempts", async () => {
  await using server = await NatsServer.start({ jetstream: false });
  const nc = await connectNats(server.url);
  try {
    const outbox = new MemoryOutboxRepository();
    const records = events("orders", 5);
    await outbox.enqueueMany(records);
    const paused = signal<string>();
    const dead: string[] = [];
    const runtime = createJetStreamRuntime(jetstream(nc));
    const probed = signal();
    let probes = 0;
    const counted = {
      publishPreparedEvent: runtime.publishPreparedEvent.bind(runtime),
      probe: async () => {
        const ok = await runtime.probe();
        if (++probes === 10) probed.resolve();
        return ok;
      },
    };
    const dispatcher = new OutboxDispatcher(outbox, counted, {
      probeIntervalMs: 20,
      probeMaxIntervalMs: 50,
      idleRetryMs: 20,
      retry: { maxAttempts: 1, maxUnavailableAttempts: 1 },
      onError: () => {},
      onDead: (message) => dead.push(message.id),
      onPaused: (info) => paused.resolve(info.error.code),
    });
    try {
      assert.equal(await paused.promise, "jetstream_not_enabled");
      // Ten probe rounds later: still paused, nothing dead, no message claimed again.
      await probed.promise;
      assert.equal(dispatcher.state, "open");
      assert.deepEqual(dead, []);
      const stats = await outbox.stats();
      assert.equal(stats.dead, 0);
      for (const record of records) {
        assert.ok(((await outbox.get(record.id))?.attempts ?? 0) <= 1, record.id);
      }
    } finally {
      await dispatcher.stop();
    }
  } finally {
    await nc.close();
  }
});
