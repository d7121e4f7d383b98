/**
 * Broker trouble has a scope (issue #15 item 2, #19 item 1, #20's two-nodes-down dispatcher
 * side): with a fake runtime, one stream that fails `unavailable` waits alone while the rest
 * flows, a failing half-open trial is not retried head-of-line, and `unavailable` retries of
 * one message are bounded. The real-server cases are further down.
 */

import assert from "node:assert/strict";
import {
  createJetStreamRuntime,
  MemoryOutboxRepository,
  OutboxDispatcher,
  type OutboxFailureScope,
  OutboxPublishError,
  type OutboxRuntime,
  type PreparedEvent,
  type PubAckConnection,
} from "../mod.ts";
import { eventually } from "./kit/mod.ts";
import { events, signal } from "./helpers/dispatch.ts";

/** A runtime whose `stuck.*` subjects belong to a stream that answers like one without leader. */
function stuckStreamRuntime(options: { scoped: boolean }) {
  let stuck = true;
  const published: string[] = [];
  const attemptsOnStuck = { count: 0 };
  const probes: OutboxFailureScope[] = [];
  const runtime: OutboxRuntime = {
    publishPreparedEvent(event: PreparedEvent) {
      if (event.subject.startsWith("stuck.") && stuck) {
        attemptsOnStuck.count += 1;
        return Promise.reject(
          new OutboxPublishError("unavailable", "stream 'STUCK' has no leader", {
            code: "stream_unavailable",
            ...(options.scoped ? { scope: { kind: "stream" as const, stream: "STUCK" } } : {}),
          }),
        );
      }
      published.push(event.header.id);
      return Promise.resolve({ stream: "OK", seq: published.length, duplicate: false });
    },
    // The account-info probe answers: the broker as a whole is fine.
    probe: () => Promise.resolve(true),
    probeScope(scope) {
      probes.push(scope);
      return Promise.resolve(!stuck);
    },
  };
  return {
    runtime,
    published,
    attemptsOnStuck,
    probes,
    heal() {
      stuck = false;
    },
  };
}

Deno.test("scopes: one stream without a leader waits alone; the other streams flow; nothing goes dead; released by its probe", async () => {
  const outbox = new MemoryOutboxRepository();
  const fake = stuckStreamRuntime({ scoped: true });
  const stuck = events("stuck", 20);
  const fine = events("fine", 200);
  // The stuck stream's messages are the OLDEST: a head-of-line breaker would never get past them.
  await outbox.enqueueMany(stuck);
  await outbox.enqueueMany(fine);
  const pausedScopes: string[] = [];
  const resumed = signal<number>();
  const dead: string[] = [];
  const dispatcher = new OutboxDispatcher(outbox, fake.runtime, {
    limit: 10,
    probeIntervalMs: 20,
    probeMaxIntervalMs: 100,
    idleRetryMs: false,
    onError: () => {},
    onDead: (message) => dead.push(message.id),
    onScopePaused: (info) => pausedScopes.push(JSON.stringify(info.scope)),
    onScopeResumed: (info) => resumed.resolve(info.pausedMs),
  });
  try {
    await eventually(() => assert.equal(fake.published.length, fine.length), { timeoutMs: 10_000 });
    assert.equal(dispatcher.state, "closed", "the broker-wide breaker never opened");
    assert.deepEqual(pausedScopes, [JSON.stringify({ kind: "stream", stream: "STUCK" })]);
    assert.deepEqual(dispatcher.pausedScopes.map((info) => info.scope), [
      { kind: "stream", stream: "STUCK" },
    ]);
    const before = fake.attemptsOnStuck.count;
    // While paused, the stuck stream's messages are not attempted again (held for the probe).
    await eventually(() => assert.ok(fake.probes.length >= 3), { timeoutMs: 5_000 });
    assert.equal(fake.attemptsOnStuck.count, before, "held messages are not published");
    for (const record of stuck) {
      const stored = await outbox.get(record.id);
      assert.equal(stored?.state, "failed");
      assert.match(stored?.lastError ?? "", /stream_unavailable/);
    }

    const healedAt = Date.now();
    fake.heal();
    await resumed.promise;
    await eventually(
      () => assert.equal(fake.published.length, fine.length + stuck.length),
      { timeoutMs: 5_000 },
    );
    // Within a probe delay (100 ms here) plus the hold margin: the backoff did not keep growing.
    const deliveredAfterMs = Date.now() - healedAt;
    assert.ok(deliveredAfterMs < 2_000, `delivered ${deliveredAfterMs} ms after the stream healed`);
    assert.deepEqual(dead, []);
    assert.deepEqual(dispatcher.pausedScopes, []);
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("scopes: a half-open trial that keeps failing while the broker answers probes does not block the rest (no head-of-line)", async () => {
  const outbox = new MemoryOutboxRepository();
  // No scope on the error: a runtime that cannot tell (e.g. a PubAck timeout on one stream).
  const fake = stuckStreamRuntime({ scoped: false });
  const stuck = events("stuck", 1);
  const fine = events("fine", 30);
  await outbox.enqueueMany(stuck);
  await outbox.enqueueMany(fine);
  const dead = signal<string>();
  const dispatcher = new OutboxDispatcher(outbox, fake.runtime, {
    limit: 10,
    probeIntervalMs: 10,
    probeMaxIntervalMs: 20,
    idleRetryMs: 50,
    retry: { baseMs: 10, maxUnavailableAttempts: 4 },
    onError: () => {},
    onDead: (message, info) => dead.resolve(`${message.id}: ${info.lastError}`),
  });
  try {
    await eventually(() => assert.equal(fake.published.length, fine.length), { timeoutMs: 10_000 });
    // Its unavailable retries are bounded: dead with the reason once the budget is spent.
    const reason = await dead.promise;
    const match = reason.match(
      /^stuck-.*: gave up after (\d+) attempts \(retry\.maxUnavailableAttempts\): stream_unavailable: /,
    );
    assert.ok(match, reason);
    // The budget is checked at each failure of its own (a trial's): at most one attempt past it.
    assert.ok(Number(match[1]) >= 4 && Number(match[1]) <= 5, reason);
    assert.equal(fake.attemptsOnStuck.count, Number(match[1]));
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("scopes: a paused stream's messages go dead with the reason once retry.maxUnavailableAttempts is spent", async () => {
  const outbox = new MemoryOutboxRepository();
  const fake = stuckStreamRuntime({ scoped: true });
  const [record] = events("stuck", 1);
  await outbox.enqueue(record);
  const dead = signal<string>();
  const dispatcher = new OutboxDispatcher(outbox, fake.runtime, {
    probeIntervalMs: 5,
    probeMaxIntervalMs: 20,
    idleRetryMs: false,
    retry: { maxUnavailableAttempts: 3 },
    onError: () => {},
    onDead: (_message, info) => dead.resolve(info.lastError),
  });
  try {
    assert.match(
      await dead.promise,
      /^gave up after 3 attempts \(retry\.maxUnavailableAttempts\): stream_unavailable: not attempted: stream 'STUCK' has no leader$/,
    );
    const stored = await outbox.get(record.id);
    assert.equal(stored?.state, "dead");
    assert.equal(stored?.attempts, 3);
    assert.equal(fake.attemptsOnStuck.count, 1, "attempted once; then held until the probe");
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("scopes: a connection-scoped failure opens the broker-wide breaker and spends no budget", async () => {
  const outbox = new MemoryOutboxRepository();
  let down = true;
  let published = 0;
  const runtime: OutboxRuntime = {
    publishPreparedEvent() {
      if (down) {
        return Promise.reject(
          new OutboxPublishError("unavailable", "the NATS connection is closed", {
            code: "connection_closed",
            scope: { kind: "connection" },
          }),
        );
      }
      published += 1;
      return Promise.resolve();
    },
    probe: () => Promise.resolve(!down),
  };
  await outbox.enqueueMany(events("any", 5));
  const paused = signal();
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    probeIntervalMs: 5,
    probeMaxIntervalMs: 10,
    idleRetryMs: false,
    retry: { maxUnavailableAttempts: 1, maxAttempts: 1 },
    onError: () => {},
    onPaused: () => paused.resolve(),
  });
  try {
    await paused.promise;
    assert.equal(dispatcher.state, "open");
    assert.deepEqual(dispatcher.pausedScopes, []);
    down = false;
    await dispatcher.whenIdle();
    assert.equal(published, 5);
    assert.equal((await outbox.stats()).dead, 0, "a broker-wide outage never makes a message dead");
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("scopes: while the JetStream API does not answer, a burst of new subjects costs one account-info request and at most 1 s; a known stream is named", async () => {
  let accountCalls = 0;
  const noResponders = () => {
    const cause = new Error("no responders: 'x'");
    cause.name = "NoResponders";
    const error = new Error("jetstream is not enabled", { cause });
    error.name = "JetStreamNotEnabled";
    return error;
  };
  let down = false;
  let answerAccount: (error: Error) => void = () => {};
  const runtime = createJetStreamRuntime({
    publish(subject) {
      return down
        ? Promise.reject(noResponders())
        : Promise.resolve({ stream: "ORDERS", seq: 1, duplicate: false, subject });
    },
    jetstreamManager: () =>
      Promise.resolve({
        getAccountInfo() {
          accountCalls += 1;
          // The API does not answer (no meta leader): pending until the end of the test.
          return new Promise((_, reject) => answerAccount = reject);
        },
      }),
  });
  const event = (subject: string): PreparedEvent => ({
    event: "e",
    subject,
    header: { id: `id-${subject}`, time: new Date().toISOString() },
    payload: {},
    encodedPayload: "{}",
    headers: {},
  });
  await runtime.publishPreparedEvent(event("orders.known"));
  down = true;
  const startedAt = Date.now();
  const errors = await Promise.all(
    ["orders.known", ...Array.from({ length: 50 }, (_, i) => `orders.${i}.created`)].map(
      (subject) =>
        runtime.publishPreparedEvent(event(subject)).then(
          () => assert.fail("published"),
          (error: OutboxPublishError) => error,
        ),
    ),
  );
  // Reported within the diagnosis bound (1 s), while the account-info request still waits.
  const tookMs = Date.now() - startedAt;
  assert.ok(tookMs < 2_000, `the failures took ${tookMs} ms`);
  assert.equal(accountCalls, 1, "one account-info request for the whole burst");
  const timeout = new Error("timeout");
  timeout.name = "TimeoutError";
  answerAccount(timeout);
  assert.deepEqual(
    errors[0].scope,
    { kind: "stream", stream: "ORDERS" },
    "learned from its PubAck",
  );
  for (const error of errors.slice(1)) {
    assert.equal(error.kind, "unavailable");
    assert.equal(error.code, "stream_unavailable");
    assert.equal(error.scope?.kind, "subject");
  }
});

/** A JetStream client for `createJetStreamRuntime`: `stuck.*` publishes time out, the JetStream API never answers (no meta leader), and the connection's round trip answers or not. */
function quorumLossClient(options: { serverAnswers: boolean }) {
  const published: string[] = [];
  const timeout = () => {
    const error = new Error("timeout");
    error.name = "TimeoutError";
    return error;
  };
  const client = {
    publish(subject: string) {
      if (subject.startsWith("stuck.")) return Promise.reject(timeout());
      published.push(subject);
      return Promise.resolve({ stream: "R1", seq: published.length, duplicate: false });
    },
    jetstreamManager: () =>
      Promise.resolve({
        getAccountInfo: () => Promise.reject(timeout()),
        streams: {
          find: () => Promise.reject(timeout()),
          info: () => Promise.reject(timeout()),
        },
      }),
    // Only `flush` is used: `publisher: "js.publish"` sends through `publish` above.
    getConnection: () =>
      ({
        flush: () => options.serverAnswers ? Promise.resolve() : new Promise<void>(() => {}),
      }) as unknown as PubAckConnection,
  };
  return { client, published };
}

Deno.test("scopes: a PubAck timeout while the server answers pauses that subject only, not the whole broker (two of three nodes down, the account-info probe cannot answer)", async () => {
  const { client, published } = quorumLossClient({ serverAnswers: true });
  const runtime = createJetStreamRuntime(client, { publisher: "js.publish", timeoutMs: 50 });
  const outbox = new MemoryOutboxRepository();
  await outbox.enqueueMany(events("stuck", 5));
  const fine = events("fine", 30);
  let paused = 0;
  const scoped: string[] = [];
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    limit: 10,
    probeIntervalMs: 10,
    probeMaxIntervalMs: 50,
    idleRetryMs: 50,
    onError: () => {},
    onPaused: () => paused++,
    onScopePaused: (info) => scoped.push(`${info.scope.kind}:${info.error.code}`),
  });
  try {
    // Enqueued after the stuck ones, which time out first.
    await eventually(() => assert.ok(scoped.length + paused > 0), { timeoutMs: 5_000 });
    await outbox.enqueueMany(fine);
    dispatcher.notify();
    await eventually(() => assert.equal(published.length, fine.length), { timeoutMs: 10_000 });
    assert.equal(paused, 0, "the broker-wide breaker never opened");
    assert.equal(dispatcher.state, "closed");
    assert.ok(scoped.every((s) => s === "subject:timeout"), scoped.join());
    assert.equal((await outbox.stats()).dead, 0);
  } finally {
    await dispatcher.stop();
  }
});

Deno.test("scopes: a PubAck timeout while the server does not answer a round trip stays broker-wide (within 1 s)", async () => {
  const { client } = quorumLossClient({ serverAnswers: false });
  const runtime = createJetStreamRuntime(client, { publisher: "js.publish", timeoutMs: 50 });
  const startedAt = Date.now();
  const event: PreparedEvent = {
    event: "e",
    subject: "stuck.e0",
    header: { id: "stuck-1", time: new Date().toISOString() },
    payload: {},
    encodedPayload: "{}",
    headers: {},
  };
  const error = await runtime.publishPreparedEvent(event).then(
    () => assert.fail("published"),
    (error: OutboxPublishError) => error,
  );
  assert.ok(Date.now() - startedAt < 2_000);
  assert.equal(error.kind, "unavailable");
  assert.equal(error.code, "timeout");
  assert.equal(error.scope, undefined);
});
