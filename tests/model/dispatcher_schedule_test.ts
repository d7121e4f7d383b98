/**
 * Scheduler tests of the dispatcher (`fc.scheduler()`): publish acks, claim and mark replies
 * arrive in an order fast-check chooses; claim and mark replies may be lost after they applied or fail
 * before, and so may claim replies; publishes succeed, fail (retryable, permanent) or report the broker unavailable
 * (breaker); `notify()` and `stop()` come at chosen points. Invariants:
 *
 * - every hook fires exactly once per applied outcome (onDispatched / onFailed / onDead for
 *   each mark the store applied, by message and attempt);
 * - nothing is claimed after `stop()` resolved;
 * - no message is left claimed after a clean stop (no store faults);
 * - no unhandled rejection.
 *
 * @module
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import {
  MemoryOutboxRepository,
  OutboxDispatcher,
  type OutboxMark,
  type OutboxMessage,
  OutboxPublishError,
  type OutboxRepository,
  type OutboxRuntime,
} from "../../mod.ts";
import { budget } from "./budget.ts";
import { InjectedFaultError } from "./faulty_handle.ts";

type Publish = "ack" | "retryable" | "permanent" | "unavailable";
type StoreReply = "ok" | "lost" | "fail";

interface Scenario {
  messages: number;
  publishes: Publish[];
  markReplies: StoreReply[];
  claimReplies: StoreReply[];
  notifies: number;
  stopAfter: number;
}

const scenario: fc.Arbitrary<Scenario> = fc.record({
  messages: fc.integer({ min: 1, max: 5 }),
  publishes: fc.array(
    fc.constantFrom<Publish>("ack", "ack", "ack", "retryable", "permanent", "unavailable"),
    { maxLength: 12 },
  ),
  markReplies: fc.array(fc.constantFrom<StoreReply>("ok", "ok", "lost", "fail"), { maxLength: 6 }),
  claimReplies: fc.array(fc.constantFrom<StoreReply>("ok", "ok", "ok", "lost", "fail"), {
    maxLength: 4,
  }),
  notifies: fc.integer({ min: 0, max: 3 }),
  stopAfter: fc.integer({ min: 0, max: 30 }),
});

interface Settings {
  /** Store faults (lost and failed claim and mark replies). */
  faults: boolean;
  /** The dispatcher's retry delay after a failed publish. */
  retryDelayMs: number;
  ignore?: boolean;
}

async function runScenario(s: fc.Scheduler, plan: Scenario, settings: Settings): Promise<void> {
  const faults = settings.faults;
  const store = new MemoryOutboxRepository();
  for (let i = 0; i < plan.messages; i++) {
    await store.enqueue({
      id: `d${i}`,
      kind: "event.publish",
      name: "model.event",
      subject: "model.d",
      payload: "{}",
      headers: {},
    });
  }
  const applied = new Map<string, number>();
  const hooks = new Map<string, number>();
  const count = (map: Map<string, number>, key: string) => map.set(key, (map.get(key) ?? 0) + 1);
  let stopResolved = false;
  const claimsAfterStop: string[] = [];
  let markCalls = 0;
  let claimCalls = 0;
  let storeFaults = 0;
  const repository: OutboxRepository = {
    enqueue: (record) => store.enqueue(record),
    enqueueMany: (records) => store.enqueueMany(records),
    get: (id) => store.get(id),
    claimDue: async (limit, now, options) => {
      if (stopResolved) claimsAfterStop.push(`claim ${limit}`);
      const reply = faults ? plan.claimReplies[claimCalls++] ?? "ok" : "ok";
      if (reply === "fail") {
        storeFaults += 1;
        throw new InjectedFaultError("fail", "claimDue");
      }
      const claimed = await s.schedule(store.claimDue(limit, now, options), `claim (${reply})`);
      if (reply === "lost") {
        // Applied: these stay claimed until their lease expires (nobody holds the claims).
        storeFaults += 1;
        throw new InjectedFaultError("lost", "claimDue");
      }
      return claimed;
    },
    markDispatched: (claim, now, outcome) =>
      repository.markMany!([{ claim, state: "dispatched", outcome }], now).then(([r]) => r),
    markFailed: (claim, failure) =>
      repository.markMany!([{
        claim,
        state: "failed",
        error: failure.error,
        nextAttemptAt: failure.nextAttemptAt,
      }], failure.now).then(([r]) => r),
    markDead: (claim, dead) =>
      repository.markMany!([{ claim, state: "dead", error: dead.error }], dead.now).then((
        [r],
      ) => r),
    markMany: async (marks: readonly OutboxMark[], now: Date) => {
      const reply = faults ? plan.markReplies[markCalls++] ?? "ok" : "ok";
      if (reply === "fail") {
        storeFaults += 1;
        throw new InjectedFaultError("fail", "markMany");
      }
      // Applied = the store changed the message from claimed to the mark's state now (a retry
      // that finds its own earlier mark applied answers true but applies nothing).
      const before = await Promise.all(marks.map((mark) => store.get(mark.claim.id)));
      const results = await store.markMany(marks, now);
      const after = await Promise.all(marks.map((mark) => store.get(mark.claim.id)));
      marks.forEach((mark, i) => {
        if (results[i] && before[i]?.state === "claimed" && after[i]?.state === mark.state) {
          count(applied, `${mark.claim.id}/${mark.claim.attempts}/${mark.state}`);
        }
      });
      await s.schedule(Promise.resolve(), `mark reply (${reply})`);
      if (reply === "lost") {
        storeFaults += 1;
        throw new InjectedFaultError("lost", "markMany");
      }
      return results;
    },
  };
  let publishes = 0;
  const runtime: OutboxRuntime = {
    publishPreparedEvent: () => {
      const outcome = plan.publishes[publishes++] ?? "ack";
      return s.schedule(Promise.resolve(outcome), `publish ${outcome}`).then((result) => {
        if (result === "ack") return;
        throw new OutboxPublishError(result, `model ${result}`);
      });
    },
    probe: () => s.schedule(Promise.resolve(true), "probe"),
  };
  const hook = (state: string) => (message: OutboxMessage) =>
    count(hooks, `${message.id}/${message.attempts}/${state}`);
  const dispatcher = new OutboxDispatcher(repository, runtime, {
    limit: 3,
    leaseMs: 60_000,
    retryDelayMs: settings.retryDelayMs,
    debounceMs: 0,
    probeIntervalMs: 1,
    probeMaxIntervalMs: 2,
    idleRetryMs: false,
    onDispatched: hook("dispatched"),
    onFailed: hook("failed"),
    onDead: hook("dead"),
    onError: () => {},
  });
  let steps = 0;
  let notifies = plan.notifies;
  const deadline = Date.now() + 10_000;
  let stopping: Promise<void> | undefined;
  while (!stopResolved) {
    if (Date.now() > deadline) {
      throw new Error(`stop() did not resolve within 10 s (${s.report().length} tasks)`);
    }
    if (!stopping && steps >= plan.stopAfter) {
      stopping = dispatcher.stop().then(() => {
        stopResolved = true;
      });
    }
    if (notifies > 0 && steps % 3 === 0) {
      notifies -= 1;
      dispatcher.notify();
    }
    if (s.count() > 0) {
      await s.waitOne();
      steps += 1;
    } else {
      await new Promise((resolve) => setTimeout(resolve, 1));
      steps += 1;
    }
  }
  // Whatever was still scheduled after stop() (there should be nothing left to claim).
  await s.waitAll();
  assert.deepEqual(claimsAfterStop, [], "claimed after stop() resolved");
  assert.deepEqual(
    Object.fromEntries([...hooks].sort()),
    Object.fromEntries([...applied].sort()),
    "hooks fired once per applied outcome (key: id/attempts/state)",
  );
  if (storeFaults === 0) {
    const claimed = store.snapshot().filter((m) => m.state === "claimed").map((m) => m.id);
    assert.deepEqual(claimed, [], "messages left claimed after a clean stop");
  }
}

function dispatcherProperty(name: string, settings: Settings): Deno.TestDefinition {
  return {
    name: `model: dispatcher: ${name}`,
    ignore: settings.ignore,
    async fn() {
      const unhandled: unknown[] = [];
      const onUnhandled = (event: PromiseRejectionEvent) => {
        event.preventDefault();
        unhandled.push(event.reason);
      };
      globalThis.addEventListener("unhandledrejection", onUnhandled);
      try {
        await fc.assert(
          fc.asyncProperty(fc.scheduler(), scenario, async (s, plan) => {
            await runScenario(s, plan, settings);
            await new Promise((resolve) => setTimeout(resolve, 0));
            assert.deepEqual(unhandled, [], "no unhandled rejection");
          }),
          budget(2),
        );
      } finally {
        globalThis.removeEventListener("unhandledrejection", onUnhandled);
      }
    },
  };
}

Deno.test(dispatcherProperty("publish acks, breaker, retry timers, notify and stop in any order", {
  faults: false,
  retryDelayMs: 1,
}));

// Before the claim-token fix (#15 item 1) this found, in 8 runs, a retried markMany after a
// lost reply counting its own applied marks as "superseded": onDispatched/onFailed/onDead never
// fired for them. The retry delay is long here so a failed message is not due again before its
// lost mark is retried: that race is still open (next property).
Deno.test(dispatcherProperty("lost and failed claim and mark replies (#15 item 1)", {
  faults: true,
  retryDelayMs: 60_000,
}));

/** `OUTBOX_MODEL_KNOWN_BUGS=1` runs the property of an open bug. */
const runKnown = Deno.env.get("OUTBOX_MODEL_KNOWN_BUGS") === "1";

// Open: a markFailed whose reply is lost applies; if the retry delay is short the message is
// claimed (new token) and delivered again before the dispatcher retries the lost mark, the
// retry is then "superseded" and onFailed never fires for the applied failure (found on main
// after the #15 item 1 fix, seed 20261201, run 45; counterexample: one message, publish
// retryable, mark reply lost, notify).
Deno.test(dispatcherProperty(
  "a lost mark reply retried after the message was claimed again (open)",
  { faults: true, retryDelayMs: 1, ignore: !runKnown },
));
