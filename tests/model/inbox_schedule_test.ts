/**
 * Scheduler tests of the inbox consumer (`consumeWithInbox`, `fc.scheduler()`): deliveries,
 * redeliveries after a nak, handler results and the inbox's `has` / `record` replies (some
 * failing) arrive in an order fast-check chooses, with duplicates of one `Nats-Msg-Id` and
 * `stop()` at a chosen point. The consumer is a small in-test broker with JetStream's delivery
 * rules (a nak redelivers with `deliveryCount + 1`, a term ends the message). Invariants:
 *
 * - every delivery handed to the loop is settled exactly once (ack, nak or term), and its
 *   outcome (`around()`) matches: processed / duplicate = ack, failed = nak, poisoned = term;
 * - onDuplicate and onPoison fire once per such outcome; `stats` count the outcomes;
 * - a message acked as processed ran its handler to success; one acked as a duplicate had
 *   been recorded by a successful handler before;
 * - after `stop()` was called no delivery starts processing; after it resolved nothing
 *   happens at all (no handler, no inbox call, no settlement);
 * - no unhandled rejection.
 *
 * @module
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import {
  consumeWithInbox,
  type InboxOutcome,
  type InboxRepository,
  type JetStreamMessageLike,
  MemoryInboxRepository,
  type PullConsumerLike,
} from "../../mod.ts";
import { budget } from "./budget.ts";
import { InjectedFaultError } from "./faulty_handle.ts";

type Reply = "ok" | "fail";

interface Plan {
  /** Message ids of the published messages (repeats are duplicates with new sequences). */
  published: number[];
  handler: Reply[];
  has: Reply[];
  record: Reply[];
  concurrency: number;
  stopAfter: number;
}

const plan: fc.Arbitrary<Plan> = fc.record({
  published: fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 6 }),
  handler: fc.array(fc.constantFrom<Reply>("ok", "ok", "fail"), { maxLength: 10 }),
  has: fc.array(fc.constantFrom<Reply>("ok", "ok", "ok", "fail"), { maxLength: 10 }),
  record: fc.array(fc.constantFrom<Reply>("ok", "ok", "ok", "fail"), { maxLength: 10 }),
  concurrency: fc.integer({ min: 1, max: 3 }),
  stopAfter: fc.integer({ min: 0, max: 40 }),
});

interface Delivery extends JetStreamMessageLike {
  readonly id: string;
  readonly settlements: string[];
}

const maxDeliver = 3;

async function runPlan(s: fc.Scheduler, p: Plan): Promise<void> {
  let stopResolved = false;
  let stopCalled = false;
  const afterStop: string[] = [];
  const startedWhileStopping: string[] = [];
  const late = (what: string) => {
    if (stopResolved) afterStop.push(what);
  };
  const queue: Delivery[] = [];
  const handed: Delivery[] = [];
  let wake: (() => void) | undefined;
  let closed = false;
  const deliver = (id: string, seq: number, deliveryCount: number) => {
    const settlements: string[] = [];
    const settle = (how: string, redeliver: boolean) => {
      late(`${how} ${id}#${deliveryCount}`);
      settlements.push(how);
      if (redeliver && !closed && deliveryCount < maxDeliver) {
        deliver(id, seq, deliveryCount + 1);
      }
    };
    queue.push({
      id,
      settlements,
      headers: { get: (key: string) => key.toLowerCase() === "nats-msg-id" ? id : "" },
      info: { stream: "MODEL", streamSequence: seq, deliveryCount },
      ack: () => settle("ack", false),
      nak: () => settle("nak", true),
      term: () => settle("term", false),
      working: () => {},
    });
    wake?.();
  };
  p.published.forEach((n, i) => deliver(`x${n}`, i + 1, 1));
  const consumer: PullConsumerLike<Delivery> = {
    info: () => Promise.resolve({ config: { max_deliver: maxDeliver, ack_wait: 30e9 } }),
    consume: () =>
      Promise.resolve({
        async *[Symbol.asyncIterator]() {
          while (!closed) {
            if (queue.length === 0) {
              await new Promise<void>((resolve) => wake = resolve);
              continue;
            }
            // The next delivery arrives when the scheduler says so.
            const next = await s.schedule(Promise.resolve(queue.shift()!), "delivery");
            if (closed) {
              queue.unshift(next);
              return;
            }
            handed.push(next);
            yield next;
          }
        },
        close: () => {
          closed = true;
          wake?.();
          return Promise.resolve();
        },
      }),
  };
  const memory = new MemoryInboxRepository();
  const replies = { has: 0, record: 0, handler: 0 };
  const inbox: InboxRepository = {
    has: async (id, options) => {
      late(`has ${id}`);
      if (stopCalled) startedWhileStopping.push(`has ${id}`);
      const reply = p.has[replies.has++] ?? "ok";
      await s.schedule(Promise.resolve(), `has ${id} (${reply})`);
      if (reply === "fail") throw new InjectedFaultError("fail", "has");
      return await memory.has(id, options);
    },
    record: async (id, options) => {
      late(`record ${id}`);
      const reply = p.record[replies.record++] ?? "ok";
      await s.schedule(Promise.resolve(), `record ${id} (${reply})`);
      if (reply === "fail") throw new InjectedFaultError("fail", "record");
      return await memory.record(id, options);
    },
  };
  const handled = new Set<string>();
  const outcomes = new Map<Delivery, InboxOutcome[]>();
  const hooks = { duplicate: 0, poison: 0 };
  const running = await consumeWithInbox(consumer, {
    scope: "model",
    inbox,
    concurrency: p.concurrency,
    nakBackoff: { baseMs: 1, capMs: 1 },
    handler: async (message) => {
      late(`handler ${message.id}`);
      const reply = p.handler[replies.handler++] ?? "ok";
      await s.schedule(Promise.resolve(), `handler ${message.id} (${reply})`);
      if (reply === "fail") throw new Error(`handler of ${message.id} failed`);
      handled.add(message.id);
    },
    around: async (message, process) => {
      const result = await process();
      outcomes.set(message, [...outcomes.get(message) ?? [], result.outcome]);
      if (result.outcome === "duplicate") {
        assert.ok(handled.has(message.id), `${message.id} acked as a duplicate, never handled`);
      }
      if (result.outcome === "processed") {
        assert.ok(handled.has(message.id), `${message.id} acked as processed, handler failed`);
      }
    },
    onDuplicate: () => hooks.duplicate++,
    onPoison: () => {
      hooks.poison++;
    },
    onError: () => {},
  });
  let steps = 0;
  let stopping: Promise<void> | undefined;
  const deadline = Date.now() + 10_000;
  while (!stopResolved) {
    if (Date.now() > deadline) throw new Error("stop() did not resolve within 10 s");
    if (!stopping && steps >= p.stopAfter) {
      stopCalled = true;
      stopping = running.stop().then(() => {
        stopResolved = true;
      });
    }
    if (s.count() > 0) await s.waitOne();
    else await new Promise((resolve) => setTimeout(resolve, 1));
    steps += 1;
  }
  await s.waitAll();
  await new Promise((resolve) => setTimeout(resolve, 5));
  assert.deepEqual(afterStop, [], "work after stop() resolved");
  assert.deepEqual(startedWhileStopping, [], "a delivery started processing after stop()");
  const expected = { ack: 0, nak: 0, term: 0 };
  for (const delivery of handed) {
    const got = outcomes.get(delivery) ?? [];
    const label = `${delivery.id}#${delivery.info.deliveryCount}`;
    if (got.length === 0) {
      // Pulled while stopping: handed back without processing.
      assert.deepEqual(delivery.settlements, ["nak"], `${label} pulled during stop`);
      continue;
    }
    assert.equal(got.length, 1, `${label} processed ${got.length} times`);
    assert.equal(delivery.settlements.length, 1, `${label} settled ${delivery.settlements}`);
    const settlement = delivery.settlements[0];
    const want = got[0] === "failed" ? "nak" : got[0] === "poisoned" ? "term" : "ack";
    assert.equal(settlement, want, `${label}: outcome ${got[0]} settled by ${settlement}`);
    expected[want] += 1;
  }
  const all = [...outcomes.values()].flat();
  const n = (outcome: InboxOutcome) => all.filter((o) => o === outcome).length;
  assert.deepEqual(running.stats, {
    processed: n("processed"),
    duplicates: n("duplicate"),
    failed: n("failed") + n("poisoned"),
    poisoned: n("poisoned"),
  }, "stats count the outcomes");
  assert.equal(hooks.duplicate, n("duplicate"), "onDuplicate once per duplicate");
  assert.equal(hooks.poison, n("poisoned"), "onPoison once per poisoned delivery");
}

Deno.test("model: inbox consumer: deliveries, handler and inbox replies, stop in any order", async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (event: PromiseRejectionEvent) => {
    event.preventDefault();
    unhandled.push(event.reason);
  };
  globalThis.addEventListener("unhandledrejection", onUnhandled);
  try {
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), plan, async (s, p) => {
        await runPlan(s, p);
        assert.deepEqual(unhandled, [], "no unhandled rejection");
      }),
      budget(2),
    );
  } finally {
    globalThis.removeEventListener("unhandledrejection", onUnhandled);
  }
});
