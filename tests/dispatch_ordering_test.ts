/**
 * The dispatcher's per-key discipline: inside a batch, messages of different ordering keys are
 * published concurrently and messages of one key one at a time; with real JetStream and random
 * publish failures, every key's messages land in the stream in enqueue order.
 */

import assert from "node:assert/strict";
import { jetstream } from "@nats-io/jetstream";
import {
  createJetStreamRuntime,
  dispatchOutbox,
  MemoryOutboxRepository,
  OutboxDispatcher,
  type OutboxMark,
  type OutboxMessage,
  OutboxPublishError,
  type OutboxRecord,
  type OutboxRepository,
  type OutboxRuntime,
  type PreparedEvent,
} from "../mod.ts";
import { connectNats, createTestStream } from "./kit/mod.ts";
import { streamIds } from "./helpers/dispatch.ts";

function record(id: string, orderingKey: string | undefined, subject = "t.s"): OutboxRecord {
  const r: OutboxRecord = {
    id,
    kind: "event.publish",
    name: "t",
    subject,
    payload: "{}",
    headers: {},
  };
  if (orderingKey !== undefined) r.orderingKey = orderingKey;
  return r;
}

/**
 * A store whose claim hands out everything at once, several messages of one key included (as a
 * store without ordering keys would): the dispatcher alone must keep the key's order.
 */
class EverythingAtOnce implements OutboxRepository {
  marks: OutboxMark[] = [];
  #messages: OutboxMessage[];
  constructor(records: OutboxRecord[]) {
    const now = new Date().toISOString();
    this.#messages = records.map((r) => ({
      ...r,
      state: "claimed",
      attempts: 1,
      createdAt: now,
      updatedAt: now,
      nextAttemptAt: new Date(Date.now() + 30_000).toISOString(),
    }));
  }
  enqueue(): Promise<OutboxMessage> {
    throw new Error("not used");
  }
  enqueueMany(): Promise<OutboxMessage[]> {
    throw new Error("not used");
  }
  get(): Promise<OutboxMessage | undefined> {
    return Promise.resolve(undefined);
  }
  claimDue(): Promise<OutboxMessage[]> {
    const claimed = this.#messages;
    this.#messages = [];
    return Promise.resolve(claimed);
  }
  markDispatched(): Promise<boolean> {
    throw new Error("markMany is used");
  }
  markFailed(): Promise<boolean> {
    throw new Error("markMany is used");
  }
  markDead(): Promise<boolean> {
    throw new Error("markMany is used");
  }
  markMany(marks: readonly OutboxMark[]): Promise<boolean[]> {
    this.marks.push(...marks);
    return Promise.resolve(marks.map(() => true));
  }
}

Deno.test("dispatchOutbox: one key's messages one at a time, different keys concurrently, none after a failure of its key", async () => {
  const records = [
    record("a1", "A"),
    record("b1", "B"),
    record("a2", "A"),
    record("u1", undefined),
    record("b2", "B"),
    record("a3", "A"),
    record("b3", "B"),
    record("b4", "B"),
  ];
  const store = new EverythingAtOnce(records);
  const events: string[] = [];
  let running = 0;
  let concurrency = 0;
  const runtime: OutboxRuntime = {
    async publishPreparedEvent(event: PreparedEvent) {
      const id = event.header.id;
      events.push(`start ${id}`);
      running += 1;
      concurrency = Math.max(concurrency, running);
      await new Promise((resolve) => setTimeout(resolve, 10));
      running -= 1;
      events.push(`end ${id}`);
      if (id === "b2") throw new OutboxPublishError("retryable", "boom", { code: "test" });
    },
  };
  const result = await dispatchOutbox(store, runtime, { limit: 100, maxInFlight: 10 });
  assert.ok(concurrency >= 3, `different keys publish concurrently (saw ${concurrency})`);
  const order = (id: string, what: "start" | "end") => events.indexOf(`${what} ${id}`);
  assert.ok(order("a1", "end") < order("a2", "start"));
  assert.ok(order("a2", "end") < order("a3", "start"));
  assert.ok(order("b1", "end") < order("b2", "start"));
  assert.equal(order("b3", "start"), -1, "b3 waits: b2 failed");
  assert.equal(order("b4", "start"), -1);
  const byId = new Map(store.marks.map((mark) => [mark.claim.id, mark]));
  assert.equal(byId.get("b2")?.state, "failed");
  for (const id of ["b3", "b4"]) {
    const mark = byId.get(id);
    assert.equal(mark?.state, "failed");
    assert.match((mark as { error: string }).error, /^key_order: not attempted/);
  }
  assert.deepEqual(
    ["a1", "a2", "a3", "b1", "u1"].map((id) => byId.get(id)?.state),
    Array(5).fill("dispatched"),
  );
  assert.equal(result.dispatched, 5);
  assert.equal(result.failed, 3);
});

Deno.test("OutboxDispatcher on real JetStream: random publish failures never reorder a key", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new MemoryOutboxRepository();
    const keys = 20;
    const perKey = 15;
    const expected = new Map<string, string[]>();
    const records: OutboxRecord[] = [];
    for (let i = 0; i < perKey; i++) {
      for (let k = 0; k < keys; k++) {
        const key = `key-${k}`;
        const id = `${stream.prefix}-${key}-${i}`;
        records.push(record(id, key, `${stream.prefix}.k${k % 4}`));
        expected.set(key, [...(expected.get(key) ?? []), id]);
      }
      records.push(record(`${stream.prefix}-free-${i}`, undefined, `${stream.prefix}.free`));
    }
    await outbox.enqueueMany(records);
    const real = createJetStreamRuntime(jetstream(nc));
    let failures = 0;
    const flaky: OutboxRuntime = {
      publishPreparedEvent(event, options) {
        if (Math.random() < 0.1) {
          failures += 1;
          // Half of the failures happen after the broker stored the message (a lost PubAck).
          if (Math.random() < 0.5) {
            return real.publishPreparedEvent(event, options).then(() => {
              throw new OutboxPublishError("retryable", "lost ack", { code: "test" });
            });
          }
          return Promise.reject(new OutboxPublishError("retryable", "refused", { code: "test" }));
        }
        return real.publishPreparedEvent(event, options);
      },
    };
    const dispatcher = new OutboxDispatcher(outbox, flaky, {
      limit: 16,
      maxInFlight: 8,
      retry: { baseMs: 1, capMs: 5, maxAttempts: 1_000 },
      idleRetryMs: 5,
      onError: () => {},
    });
    const deadline = Date.now() + 30_000;
    while ((await outbox.stats()).dispatched < records.length) {
      assert.ok(Date.now() < deadline, "everything is dispatched in time");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await dispatcher.stop();
    assert.ok(failures > 0);
    const ids = await streamIds(nc, stream.name);
    assert.equal(new Set(ids).size, ids.length, "no duplicates in the stream");
    assert.equal(ids.length, records.length, "nothing lost");
    for (const [key, keyIds] of expected) {
      assert.deepEqual(ids.filter((id) => id.includes(`-${key}-`)), keyIds, key);
    }
  } finally {
    await nc.close();
  }
});

Deno.test("OutboxDispatcher: a dispatched keyed message makes it look again at once (one key drains without polling)", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new MemoryOutboxRepository();
    const ids = Array.from({ length: 30 }, (_, i) => `${stream.prefix}-one-${i}`);
    await outbox.enqueueMany(ids.map((id) => record(id, "only-key", `${stream.prefix}.one`)));
    const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(jetstream(nc)), {
      idleRetryMs: false,
    });
    await dispatcher.whenIdle();
    await dispatcher.stop();
    assert.equal((await outbox.stats()).dispatched, ids.length, "no poll needed");
    assert.deepEqual(await streamIds(nc, stream.name), ids);
  } finally {
    await nc.close();
  }
});
