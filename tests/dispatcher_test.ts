/**
 * OutboxDispatcher against real NATS JetStream (memory store): wake-ups, coalescing, pipelining,
 * retries, stop and recovery.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  createJetStreamRuntime,
  type DispatchOutboxResult,
  OutboxDispatcher,
  OutboxPublishError,
} from "../mod.ts";
import { connectNats, createTestStream, sleep, uniqueName } from "./kit/mod.ts";
import {
  countingRuntime,
  duplicatesOf,
  events,
  InstrumentedOutbox,
  signal,
  streamIds,
} from "./helpers/dispatch.ts";

/** Resolves once `count` messages were dispatched (through the onDispatched hook). */
function dispatchedCounter(count: number) {
  const done = signal();
  const ids: string[] = [];
  return {
    ids,
    done: done.promise,
    onDispatched(message: { id: string }) {
      ids.push(message.id);
      if (ids.length === count) done.resolve();
    },
  };
}

Deno.test("dispatcher: drains at start and recovers rows a crashed process left claimed, without notify", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const pending = events(stream.prefix, 5);
    const orphaned = events(stream.prefix, 3);
    await outbox.enqueueMany([...orphaned, ...pending]);
    // A process claimed three rows with a short lease and died before publishing them.
    const claimed = await outbox.store.claimDue(3, new Date(), { leaseMs: 100 });
    assert.equal(claimed.length, 3);
    const counter = dispatchedCounter(8);
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      idleRetryMs: 25,
      onDispatched: counter.onDispatched,
    });
    await counter.done;
    await dispatcher.stop();
    assert.deepEqual(counter.ids.slice(0, 5).sort(), pending.map((r) => r.id).sort());
    assert.deepEqual(counter.ids.slice(5).sort(), orphaned.map((r) => r.id).sort());
    for (const id of orphaned.map((r) => r.id)) {
      assert.equal((await outbox.get(id))?.attempts, 2, "recovered on the second claim");
    }
    const ids = await streamIds(nc, stream.name);
    assert.equal(ids.length, 8);
    assert.deepEqual(duplicatesOf(ids), []);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: notify() calls coalesce; a notify during a drain causes one follow-up pass, never a concurrent one", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const first = events(stream.prefix, 5);
    const second = events(stream.prefix, 4);
    await outbox.enqueueMany(first);
    const counter = dispatchedCounter(9);
    let injected = false;
    const late: { dispatcher?: OutboxDispatcher } = {};
    outbox.onClaim = () => {
      if (injected) return;
      injected = true;
      // New rows commit while the first claim is running.
      void outbox.enqueueMany(second).then(() => {
        for (let i = 0; i < 50; i++) late.dispatcher?.notify();
      });
    };
    const dispatcher = late.dispatcher = new OutboxDispatcher(
      outbox,
      createJetStreamRuntime(jetstream(nc)),
      {
        idleRetryMs: false,
        onDispatched: counter.onDispatched,
      },
    );
    for (let i = 0; i < 100; i++) dispatcher.notify();
    await counter.done;
    await dispatcher.stop();
    assert.equal(outbox.maxClaimsInFlight, 1, "drains never run concurrently");
    assert.equal(
      outbox.claimCalls,
      2,
      "start + 100 notifies: one pass; 50 notifies during it: one more",
    );
    assert.equal((await streamIds(nc, stream.name)).length, 9);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: one notify drains many batches; the next claim overlaps the current publishes, within the window", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const records = events(stream.prefix, 50);
    await outbox.enqueueMany(records);
    const runtime = countingRuntime(createJetStreamRuntime(jetstream(nc)));
    let overlapped = 0;
    outbox.onClaim = () => {
      if (runtime.inFlight > 0) overlapped += 1;
    };
    const counter = dispatchedCounter(50);
    const batches: DispatchOutboxResult[] = [];
    const dispatcher = new OutboxDispatcher(outbox, runtime, {
      limit: 7,
      maxInFlight: 4,
      idleRetryMs: false,
      onDispatched: counter.onDispatched,
      onBatch: (result) => batches.push(result),
    });
    await counter.done;
    await dispatcher.whenIdle();
    await dispatcher.stop();
    assert.equal(batches.length, 8, "7 full batches of 7 and one of 1");
    assert.equal(batches.reduce((sum, b) => sum + b.dispatched, 0), 50);
    assert.ok(overlapped > 0, "claims were issued while publishes were in flight");
    assert.equal(runtime.maxInFlight, 4, "pipelined batches share the in-flight window");
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(ids, records.map((r) => r.id), "FIFO across pipelined batches");
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: a failed message wakes the dispatcher again at its retry time (no notify, no polling)", async () => {
  const nc = await connectNats();
  try {
    const prefix = uniqueName("later");
    const outbox = new InstrumentedOutbox();
    const [record] = events(prefix, 1);
    await outbox.enqueue(record);
    const jsm = await jetstreamManager(nc);
    const streamName = uniqueName("stream");
    const failed = signal<string>();
    const counter = dispatchedCounter(1);
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      idleRetryMs: false,
      retry: { baseMs: 50, capMs: 50 },
      onFailed: (_message, info) => failed.resolve(info.error.code),
      onDispatched: counter.onDispatched,
    });
    try {
      assert.equal(await failed.promise, "no_stream");
      await jsm.streams.add({ name: streamName, subjects: [`${prefix}.>`] });
      await counter.done;
      await dispatcher.stop();
      const stored = await outbox.get(record.id);
      assert.equal(stored?.state, "dispatched");
      assert.equal(stored?.attempts, 2);
      assert.equal(outbox.claimCalls >= 2, true);
    } finally {
      await dispatcher.stop();
      await jsm.streams.delete(streamName).catch(() => {});
    }
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: stop() waits for the claimed batch, then cancels all future work", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    await outbox.enqueueMany(events(stream.prefix, 40));
    const late: { dispatcher?: OutboxDispatcher } = {};
    let stopping: Promise<void> | undefined;
    outbox.onClaim = () => {
      stopping ??= late.dispatcher?.stop();
    };
    const dispatcher = late.dispatcher = new OutboxDispatcher(
      outbox,
      createJetStreamRuntime(jetstream(nc)),
      {
        limit: 10,
        idleRetryMs: 10,
      },
    );
    await sleep(0);
    await dispatcher.stop();
    assert.ok(stopping, "stop was called during the first claim");
    const states = outbox.all().map((message) => message.state);
    assert.equal(
      states.filter((state) => state === "dispatched").length,
      10,
      "claimed batch settled",
    );
    assert.equal(states.filter((state) => state === "pending").length, 30, "nothing else claimed");
    assert.equal(outbox.claimCalls, 1);
    // After stop: notify, whenIdle and polling do nothing (and no timer is left: the sanitizers
    // would fail this test).
    await outbox.enqueueMany(events(stream.prefix, 1));
    dispatcher.notify();
    await dispatcher.whenIdle();
    assert.equal(outbox.claimCalls, 1);
    assert.equal((await streamIds(nc, stream.name)).length, 10);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: store errors and throwing hooks go to onError (whose own throws are ignored) and dispatching recovers", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    outbox.failClaims = 2;
    await outbox.enqueueMany(events(stream.prefix, 3));
    const errors: string[] = [];
    const counter = dispatchedCounter(3);
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      idleRetryMs: false,
      probeIntervalMs: 10,
      onError: (error) => {
        errors.push(error instanceof Error ? error.message : String(error));
        throw new Error("the error handler itself fails");
      },
      onDispatched: (message) => {
        counter.onDispatched(message);
        throw new Error("hook failure");
      },
    });
    await counter.done;
    await dispatcher.whenIdle();
    await dispatcher.stop();
    assert.deepEqual(errors, [
      "injected claim failure",
      "injected claim failure",
      "hook failure",
      "hook failure",
      "hook failure",
    ]);
    assert.ok(outbox.all().every((message) => message.state === "dispatched"));
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: a steady stream of notifies cannot postpone dispatch (max-delay coalescing, not a trailing debounce)", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      debounceMs: 50,
      idleRetryMs: false,
    });
    try {
      await dispatcher.whenIdle();
      const [record] = events(stream.prefix, 1);
      await outbox.enqueue(record);
      let notifying = true;
      let dispatchedWhileNotifying = false;
      const watcher = (async () => {
        // Notify every 5 ms for ~2 s: a trailing 50 ms debounce would never fire meanwhile.
        for (let i = 0; i < 400; i++) {
          dispatcher.notify();
          if ((await outbox.get(record.id))?.state === "dispatched") {
            dispatchedWhileNotifying = true;
            break;
          }
          await sleep(5);
        }
        notifying = false;
      })();
      await watcher;
      assert.equal(notifying, false);
      assert.ok(dispatchedWhileNotifying, "dispatched while notifies kept coming");
    } finally {
      await dispatcher.stop();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: whenIdle() resolves once nothing is due; permanent failures are isolated", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      idleRetryMs: false,
      limit: 4,
    });
    try {
      for (let round = 0; round < 3; round++) {
        const records = events(stream.prefix, 10);
        outbox.corruptPayloads.add(records[3].id);
        await outbox.enqueueMany(records);
        await dispatcher.whenIdle();
        const states = await Promise.all(records.map((r) => outbox.get(r.id)));
        assert.deepEqual(
          states.map((m) => m?.state),
          records.map((_, i) => (i === 3 ? "dead" : "dispatched")),
        );
      }
    } finally {
      await dispatcher.stop();
    }
    assert.equal((await streamIds(nc, stream.name)).length, 27);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatcher: with polling off, every scheduled retry wakes it, not only the earliest", async () => {
  const outbox = new InstrumentedOutbox();
  const [a, b] = events(uniqueName("retries"), 2);
  await outbox.enqueueMany([a, b]);
  const attempts = new Map<string, number>();
  const runtime = {
    publishPreparedEvent(event: { header: { id: string } }) {
      const n = (attempts.get(event.header.id) ?? 0) + 1;
      attempts.set(event.header.id, n);
      return n === 1
        ? Promise.reject(new OutboxPublishError("retryable", "not yet", { code: "no_stream" }))
        : Promise.resolve();
    },
  };
  // a retries after ~20 ms, b after ~300 ms: two different retry times.
  const delays = [0.04, 0.6];
  const counter = dispatchedCounter(2);
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    idleRetryMs: false,
    retry: { baseMs: 500, capMs: 500, random: () => delays.shift() ?? 0 },
    onDispatched: counter.onDispatched,
  });
  try {
    await counter.done; // without a wake-up for b's retry this never resolves
    assert.deepEqual(counter.ids.sort(), [a.id, b.id].sort());
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("dispatcher: after stop() it claims nothing more, even while batches are being recorded", async () => {
  const outbox = new InstrumentedOutbox();
  await outbox.enqueueMany(events(uniqueName("stopping"), 200));
  const markMany = outbox.markMany.bind(outbox);
  // Recording is slower than publishing, so batches pile up waiting to be recorded.
  outbox.markMany = async (marks, now) => {
    await sleep(100);
    return await markMany(marks, now);
  };
  let claimsAtStop: number | undefined;
  let stopping: Promise<void> | undefined;
  const late: { dispatcher?: OutboxDispatcher } = {};
  const dispatcher = late.dispatcher = new OutboxDispatcher(
    outbox,
    { publishPreparedEvent: () => Promise.resolve() },
    {
      limit: 10,
      idleRetryMs: false,
      onDispatched: () => {
        if (stopping) return;
        claimsAtStop = outbox.claimCalls;
        stopping = late.dispatcher!.stop();
      },
    },
  );
  await sleep(0);
  await eventuallyStopped();
  await dispatcher.stop();
  assert.equal(outbox.claimCalls, claimsAtStop, "no claim after stop()");
  const claimedOrSettled = outbox.all().filter((m) => m.state !== "pending").length;
  assert.equal(claimedOrSettled, 10 * claimsAtStop!, "only what was claimed before stop()");
  assert.ok(outbox.all().every((m) => m.state !== "claimed"), "everything claimed was settled");

  async function eventuallyStopped(): Promise<void> {
    while (!stopping) await sleep(5);
    await stopping;
  }
});

Deno.test("dispatcher: a notify() while a short batch is being recorded claims at once, without waiting for its marks", async () => {
  // The commit -> PubAck latency of the in-process wake-up: a message committed while the
  // previous (short) batch was still being recorded waited for those marks before it was even
  // claimed. Here the first batch's marks take 1.5 s.
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const markMany = outbox.markMany.bind(outbox);
    let slowMarks = 1;
    outbox.markMany = async (marks, now) => {
      if (slowMarks-- > 0) await sleep(1_500);
      return markMany(marks, now);
    };
    const [first, second] = events(stream.prefix, 2);
    const acked = new Map<string, number>();
    const counter = dispatchedCounter(2);
    const dispatcher = new OutboxDispatcher(
      outbox,
      createJetStreamRuntime(jetstream(nc), {
        onPublished: (event) => acked.set(event.header.id, performance.now()),
      }),
      { idleRetryMs: false, onDispatched: counter.onDispatched },
    );
    await outbox.enqueue(first);
    dispatcher.notify();
    while (!acked.has(first.id)) await sleep(5);
    await sleep(50); // the first batch is now being recorded (1.5 s)
    const committed = performance.now();
    await outbox.enqueue(second);
    dispatcher.notify();
    await counter.done;
    await dispatcher.stop();
    const waited = acked.get(second.id)! - committed;
    assert.ok(
      waited < 1_000,
      `the second message was published ${waited.toFixed(0)} ms after commit`,
    );
    assert.deepEqual(counter.ids.sort(), [first.id, second.id].sort());
    assert.equal((await streamIds(nc, stream.name)).length, 2);
  } finally {
    await nc.close();
  }
});
