/**
 * The dispatcher under broker faults, on private nats-server instances: kill -9 and restart,
 * a frozen broker (SIGSTOP) outliving claim leases, and a server-side max_payload.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  dispatchOutbox,
  type DispatchOutboxResult,
  OutboxDispatcher,
  type PausedInfo,
  type ResumedInfo,
} from "../mod.ts";
import { connectNats, eventually, NatsServer, uniqueName } from "./kit/mod.ts";
import {
  duplicatesOf,
  events,
  InstrumentedOutbox,
  signal,
  streamCount,
  streamIds,
} from "./helpers/dispatch.ts";

const reconnecting = { reconnect: true, maxReconnectAttempts: -1, reconnectTimeWait: 50 };

async function addStream(nc: NatsConnection): Promise<{ name: string; prefix: string }> {
  const name = uniqueName("stream");
  const prefix = uniqueName("subj");
  await (await jetstreamManager(nc)).streams.add({ name, subjects: [`${prefix}.>`] });
  return { name, prefix };
}

function sum(results: DispatchOutboxResult[], key: keyof DispatchOutboxResult): number {
  return results.reduce((total, result) => total + result[key], 0);
}

Deno.test("faults: broker killed (-9) mid-run and restarted: dispatcher pauses, resumes on its own, every message lands exactly once", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url, reconnecting);
  try {
    const stream = await addStream(nc);
    const outbox = new InstrumentedOutbox();
    const total = 3_000;
    await outbox.enqueueMany(events(stream.prefix, total));
    const paused = signal<PausedInfo>();
    const resumed = signal<ResumedInfo>();
    let killed: Promise<void> | undefined;
    let dispatched = 0;
    const batches: DispatchOutboxResult[] = [];
    const runtime = createJetStreamRuntime(jetstream(nc, { timeout: 1_000 }), { timeoutMs: 1_000 });
    const dispatcher = new OutboxDispatcher(outbox, runtime, {
      limit: 50,
      maxInFlight: 50,
      idleRetryMs: false,
      probeIntervalMs: 50,
      probeMaxIntervalMs: 500,
      onDispatched: () => {
        if (++dispatched === 300) killed = server.kill("SIGKILL");
      },
      onBatch: (result) => batches.push(result),
      onPaused: (info) => paused.resolve(info),
      onResumed: (info) => resumed.resolve(info),
    });
    try {
      const pause = await paused.promise;
      assert.equal(pause.error.kind, "unavailable");
      await killed;
      assert.notEqual(dispatcher.state, "closed", "still paused while the broker is down");
      const settledWhileDown = outbox.all().filter((m) => m.state === "dispatched").length;
      assert.ok(settledWhileDown < total, "the outage happened mid-run");
      const claimsWhileDown = outbox.claimCalls;
      await server.restart();
      await resumed.promise;
      assert.equal(
        outbox.claimLimits[claimsWhileDown],
        1,
        "no claim while paused; the first one after a successful probe is a one-message trial",
      );
      await dispatcher.whenIdle();
    } finally {
      await dispatcher.stop();
    }
    const messages = outbox.all();
    assert.ok(messages.every((m) => m.state === "dispatched"), "everything dispatched");
    const maxAttempts = Math.max(...messages.map((m) => m.attempts));
    console.log(
      `  kill -9 run: ${
        sum(batches, "unavailable")
      } deliveries failed or held back as unavailable,` +
        ` max attempts per message ${maxAttempts}, ${sum(batches, "duplicates")} duplicate PubAcks`,
    );
    assert.ok(
      maxAttempts <= 3,
      `an outage costs at most one attempt (+1 for a trial), got ${maxAttempts}`,
    );
    assert.equal(sum(batches, "dead"), 0);
    const jsm = await jetstreamManager(nc);
    assert.equal(await streamCount(jsm, stream.name), total, "exactly once in the stream");
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(duplicatesOf(ids), []);
    assert.equal(new Set(ids).size, total);
  } finally {
    await nc.close();
  }
});

Deno.test("faults: publishes outliving their lease on a frozen broker are not duplicated by a second dispatcher", async () => {
  await using server = await NatsServer.start();
  const ncA = await connectNats(server.url, reconnecting);
  const ncB = await connectNats(server.url, reconnecting);
  try {
    const stream = await addStream(ncA);
    const outbox = new InstrumentedOutbox();
    const total = 20;
    const records = events(stream.prefix, total);
    await outbox.enqueueMany(records);
    const leaseMs = 1_000;
    const batches: DispatchOutboxResult[] = [];
    const options = (paused: (info: PausedInfo) => void) => ({
      leaseMs,
      idleRetryMs: 50,
      probeIntervalMs: 50,
      probeMaxIntervalMs: 200,
      onPaused: paused,
      onBatch: (result: DispatchOutboxResult) => batches.push(result),
    });
    // The runtimes keep their default 5 s PubAck timeout (the 500 ms is the API timeout their
    // probes use): the dispatcher bounds each publish to what is left of the lease (0.8 s of
    // 1 s here), so no dispatcher is still waiting on a publish when its lease expires.
    const runtimeA = createJetStreamRuntime(jetstream(ncA, { timeout: 500 }));
    const runtimeB = createJetStreamRuntime(jetstream(ncB, { timeout: 500 }));
    const pausedA = signal<PausedInfo>();
    const pausedB = signal<PausedInfo>();
    let a: OutboxDispatcher | undefined;
    let b: OutboxDispatcher | undefined;
    server.pause();
    try {
      a = new OutboxDispatcher(outbox, runtimeA, options(pausedA.resolve));
      const errorA = (await pausedA.promise).error;
      assert.equal(errorA.code, "timeout");
      // A's breaker opens while its deliveries fail, before it has recorded their outcomes: wait
      // for those, so B's first claim (which starts at once) finds every message due.
      await eventually(() => {
        for (const message of outbox.all()) {
          assert.equal(message.state, "failed");
          assert.equal(message.attempts, 1);
        }
        return Promise.resolve();
      });
      b = new OutboxDispatcher(outbox, runtimeB, options(pausedB.resolve));
      await pausedB.promise;
      // Wait until B's claims settled too: every message has now been published twice into the
      // frozen server (attempt 1 by A, attempt 2 by B), and A's publishes are older than the lease.
      await eventually(() => {
        for (const message of outbox.all()) {
          assert.equal(message.state, "failed");
          assert.equal(message.attempts, 2);
          assert.match(message.lastError ?? "", /^(timeout|paused): /);
        }
        return Promise.resolve();
      });
    } finally {
      server.resume();
    }
    try {
      await Promise.all([a.whenIdle(), b.whenIdle()]);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
    assert.ok(outbox.all().every((m) => m.state === "dispatched"));
    assert.equal(sum(batches, "dispatched"), total);
    assert.equal(
      sum(batches, "duplicates"),
      total,
      "the stale publishes landed first; every later publish was absorbed as a duplicate",
    );
    const ids = await streamIds(ncA, stream.name);
    assert.equal(ids.length, total, "each message stored once");
    assert.deepEqual(duplicatesOf(ids), []);
  } finally {
    await ncA.close();
    await ncB.close();
  }
});

Deno.test("faults: a payload over the server's max_payload goes dead at once, its neighbours are delivered", async () => {
  await using server = await NatsServer.start({ maxPayload: 2_048 });
  const nc = await connectNats(server.url);
  try {
    const stream = await addStream(nc);
    const outbox = new InstrumentedOutbox();
    const records = events(stream.prefix, 5);
    records[2] = { ...records[2], payload: JSON.stringify({ blob: "x".repeat(4_000) }) };
    await outbox.enqueueMany(records);
    const result = await dispatchOutbox(outbox, createJetStreamRuntime(jetstream(nc)));
    assert.equal(result.dispatched, 4);
    assert.equal(result.dead, 1);
    const big = await outbox.get(records[2].id);
    assert.equal(big?.state, "dead");
    assert.equal(big?.attempts, 1, "no retries for a permanent failure");
    assert.match(big?.lastError ?? "", /^max_payload: /);
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(ids, records.filter((_, i) => i !== 2).map((r) => r.id));
  } finally {
    await nc.close();
  }
});
