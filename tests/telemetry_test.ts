/**
 * OpenTelemetry: one trace from an enqueue in a request span to the publish and to the inbox
 * handler, on real JetStream; metric values after a run with failures and a dead message. The
 * SDK (in-memory exporters) is a test-only dependency.
 */

import assert from "node:assert/strict";
import {
  context,
  propagation,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { MeterProvider } from "@opentelemetry/sdk-metrics";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { DatabaseSync } from "node:sqlite";
import {
  consumeWithInbox,
  createJetStreamRuntime,
  type JsonValue,
  MemoryInboxRepository,
  MemoryOutboxRepository,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  OutboxPublishError,
  type OutboxPublishReceipt,
  type OutboxRuntime,
  SqlOutboxRepository,
} from "../mod.ts";
import { injectTraceContext, OutboxTelemetry } from "../telemetry.ts";
import { connectNats, createTestStream } from "./kit/mod.ts";
import { metricPoints, sum, TestReader } from "./helpers/metrics.ts";

function withOtel(): {
  spans: InMemorySpanExporter;
  tracerProvider: BasicTracerProvider;
  reader: TestReader;
  meterProvider: MeterProvider;
} & AsyncDisposable {
  const manager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(manager);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const spans = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(spans)],
  });
  const reader = new TestReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  return {
    spans,
    tracerProvider,
    reader,
    meterProvider,
    async [Symbol.asyncDispose]() {
      // The in-memory exporter reports each export on a 0 ms timer: let those fire.
      await new Promise((resolve) => setTimeout(resolve, 1));
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
      context.disable();
      propagation.disable();
    },
  };
}

function byName(spans: ReadableSpan[], prefix: string): ReadableSpan {
  const span = spans.find((s) => s.name.startsWith(prefix));
  assert.ok(span, `a span named ${prefix}... among ${spans.map((s) => s.name).join(", ")}`);
  return span;
}

for (const mode of ["parent", "link"] as const) {
  Deno.test(`one trace from a request's enqueue to the inbox handler (publish span: ${mode})`, async () => {
    await using otel = withOtel();
    const nc = await connectNats();
    await using stream = await createTestStream(nc);
    try {
      const jsm = await jetstreamManager(nc);
      await jsm.consumers.add(stream.name, { durable_name: "c", ack_policy: AckPolicy.Explicit });
      const js = jetstream(nc);
      const telemetry = new OutboxTelemetry({
        tracerProvider: otel.tracerProvider,
        meterProvider: otel.meterProvider,
        publishContext: mode,
      });
      const tracer = otel.tracerProvider.getTracer("app");
      const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
      // The request: its span is active while the service enqueues.
      let requestSpan!: Span;
      await tracer.startActiveSpan("POST /orders", async (span) => {
        requestSpan = span;
        await outbox.enqueue({
          id: `order-${mode}`,
          kind: "event.publish",
          name: "order.created",
          subject: `${stream.prefix}.orders`,
          payload: "{}",
          headers: {},
        });
        span.end();
      });
      const stored = await outbox.get(`order-${mode}`);
      assert.match(stored?.headers.traceparent ?? "", /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);

      const dispatcher = new OutboxDispatcher(
        outbox,
        telemetry.instrumentRuntime(createJetStreamRuntime(js)),
        { ...telemetry.hooks, idleRetryMs: false },
      );
      await dispatcher.whenIdle();
      await dispatcher.stop();

      let handlerSpanId: string | undefined;
      let handled!: () => void;
      const done = new Promise<void>((r) => handled = r);
      const running = await consumeWithInbox(await js.consumers.get(stream.name, "c"), {
        scope: "c",
        inbox: new MemoryInboxRepository(),
        ...telemetry.inboxHooks(),
        handler: () => {
          handlerSpanId = trace.getActiveSpan()?.spanContext().spanId;
          handled();
          return Promise.resolve();
        },
      });
      await done;
      await running.stop();

      const spans = otel.spans.getFinishedSpans();
      const request = requestSpan.spanContext();
      const create = byName(spans, "create order.created");
      const publish = byName(spans, "publish order.created");
      const process = byName(spans, `process ${stream.prefix}.orders`);
      assert.equal(create.kind, SpanKind.PRODUCER);
      assert.equal(create.spanContext().traceId, request.traceId);
      assert.equal(create.parentSpanContext?.spanId, request.spanId);
      assert.equal(process.kind, SpanKind.CONSUMER);
      assert.equal(process.spanContext().traceId, request.traceId, "the consumer continues it");
      assert.equal(process.parentSpanContext?.spanId, create.spanContext().spanId);
      assert.equal(handlerSpanId, process.spanContext().spanId, "the handler runs in it");
      if (mode === "parent") {
        assert.equal(publish.spanContext().traceId, request.traceId);
        assert.equal(publish.parentSpanContext?.spanId, create.spanContext().spanId);
      } else {
        assert.notEqual(publish.spanContext().traceId, request.traceId);
        assert.equal(publish.links.length, 1);
        assert.equal(publish.links[0].context.spanId, create.spanContext().spanId);
      }
      assert.equal(publish.attributes["messaging.system"], "nats");
      assert.equal(publish.attributes["messaging.destination.name"], `${stream.prefix}.orders`);
    } finally {
      await nc.close();
    }
  });
}

Deno.test("metrics after a run with failures, a duplicate and a dead message", async () => {
  await using otel = withOtel();
  const telemetry = new OutboxTelemetry({
    tracerProvider: otel.tracerProvider,
    meterProvider: otel.meterProvider,
  });
  const attempts = new Map<string, number>();
  const base: OutboxRuntime = {
    publishPreparedEvent(event) {
      const n = (attempts.get(event.header.id) ?? 0) + 1;
      attempts.set(event.header.id, n);
      if (event.header.id === "flaky" && n === 1) {
        return Promise.reject(
          new OutboxPublishError("retryable", "no stream", { code: "no_stream" }),
        );
      }
      if (event.header.id === "too-big") {
        return Promise.reject(
          new OutboxPublishError("permanent", "payload too large", { code: "max_payload" }),
        );
      }
      return Promise.resolve({ duplicate: event.header.id === "again", stream: "S", seq: n });
    },
  };
  const outbox = new MemoryOutboxRepository();
  for (const id of ["ok-1", "ok-2", "flaky", "too-big", "again"]) {
    await outbox.enqueue({
      id,
      kind: "event.publish",
      name: "e",
      subject: "a.b",
      payload: "{}",
      headers: {},
    });
  }
  let settled = 0;
  let allSettled!: () => void;
  const done = new Promise<void>((r) => allSettled = r);
  const count = () => {
    if (++settled === 5) allSettled();
  };
  const dispatcher = new OutboxDispatcher(outbox, telemetry.instrumentRuntime(base), {
    ...telemetry.hooks,
    onDispatched: (message, info) => {
      telemetry.hooks.onDispatched(message, info);
      count();
    },
    onDead: (message, info) => {
      telemetry.hooks.onDead(message, info);
      count();
    },
    retry: { baseMs: 1, capMs: 1 },
  });
  await done; // four dispatched (one after a retry) and one dead
  await dispatcher.stop();
  const observation = telemetry.observeBacklog(outbox, { store: "memory", intervalMs: 60_000 });
  await observation.refresh();
  const points = await metricPoints(otel.reader);
  await observation.stop();

  assert.equal(sum(points.get("outbox.messages.dispatched")), 4);
  assert.equal(sum(points.get("outbox.messages.failed"), { "error.type": "no_stream" }), 1);
  assert.equal(sum(points.get("outbox.messages.dead"), { "error.type": "max_payload" }), 1);
  assert.equal(sum(points.get("outbox.messages.duplicate_acks")), 1);
  assert.equal(
    sum(points.get("outbox.errors"), {
      phase: "publish",
      surface: "outbox",
      "error.type": "no_stream",
    }),
    1,
  );
  const publish = points.get("outbox.publish.duration") ?? [];
  const publishCount = publish.reduce((n, p) => n + (p.value as { count: number }).count, 0);
  assert.equal(publishCount, 6, "every publish attempt is timed");
  const inOutbox = points.get("outbox.message.time_in_outbox") ?? [];
  assert.equal(inOutbox.reduce((n, p) => n + (p.value as { count: number }).count, 0), 4);
  assert.equal(sum(points.get("outbox.messages.due"), { "outbox.store": "memory" }), 0);
  for (const [name, series] of points) {
    for (const point of series) {
      for (const value of Object.values(point.attributes)) {
        assert.ok(
          !["ok-1", "ok-2", "flaky", "too-big", "again"].includes(String(value)),
          `${name} has no message ids in its attributes`,
        );
      }
    }
  }
});

Deno.test("a caller-provided traceparent is kept; a retried enqueue from another trace is the same message", async () => {
  await using otel = withOtel();
  const telemetry = new OutboxTelemetry({ tracerProvider: otel.tracerProvider });
  const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
  const record = {
    id: "r-1",
    kind: "event.publish" as const,
    name: "e",
    subject: "a.b",
    payload: "{}",
    headers: {},
  };
  const tracer = otel.tracerProvider.getTracer("app");
  const first = await tracer.startActiveSpan("req-1", async (span) => {
    try {
      return await outbox.enqueue(record);
    } finally {
      span.end();
    }
  });
  const second = await tracer.startActiveSpan("req-2", async (span) => {
    try {
      return await outbox.enqueue(record);
    } finally {
      span.end();
    }
  });
  assert.equal(second.headers.traceparent, first.headers.traceparent);
  const chosen = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  assert.equal(injectTraceContext({ traceparent: chosen }).traceparent, chosen);
});

Deno.test("without an SDK the publish path adds nothing; a tracer provider registered later is used from then on", async () => {
  const published: string[] = [];
  const receipt = { duplicate: false, stream: "S", seq: 1 };
  const telemetry = new OutboxTelemetry(); // global providers: nothing registered yet
  const runtime = telemetry.instrumentRuntime({
    publishPreparedEvent: (event) => {
      published.push(event.header.id);
      // The no-SDK path hands the delivery over as is: no span is active around it.
      assert.equal(trace.getActiveSpan(), undefined);
      return Promise.resolve(receipt);
    },
  });
  const event = {
    event: "e",
    subject: "a.b",
    header: { id: "m-1", time: new Date().toISOString() },
    payload: {},
    encodedPayload: "{}",
    headers: {},
  };
  assert.deepEqual(await runtime.publishPreparedEvent(event), receipt);
  telemetry.hooks.onDispatched(
    { ...event, id: "m-1", kind: "event.publish", name: "e", payload: "{}" } as never,
    { duplicate: false },
  );

  const spans = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
  assert.ok(trace.setGlobalTracerProvider(provider));
  try {
    assert.deepEqual(
      await runtime.publishPreparedEvent({ ...event, header: { ...event.header, id: "m-2" } }),
      receipt,
    );
    assert.deepEqual(published, ["m-1", "m-2"]);
    await new Promise((resolve) => setTimeout(resolve, 1));
    assert.deepEqual(spans.getFinishedSpans().map((span) => span.name), ["publish e"]);
  } finally {
    trace.disable();
    await provider.shutdown();
  }
});

Deno.test("inbox process spans: a failed handler is an error span, only applied messages count", async () => {
  await using otel = withOtel();
  const nc = await connectNats();
  await using stream = await createTestStream(nc);
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.consumers.add(stream.name, { durable_name: "c", ack_policy: AckPolicy.Explicit });
    const js = jetstream(nc);
    const telemetry = new OutboxTelemetry({
      tracerProvider: otel.tracerProvider,
      meterProvider: otel.meterProvider,
    });
    const inbox = new MemoryInboxRepository();
    await inbox.record("seen-before", { consumer: "c" });
    let done!: () => void;
    const finished = new Promise<void>((resolve) => done = resolve);
    const running = await consumeWithInbox(await js.consumers.get(stream.name, "c"), {
      scope: "c",
      inbox,
      nakBackoff: { baseMs: 20, capMs: 20 },
      ...telemetry.inboxHooks(),
      handler: (_message, { deliveryCount, messageId }) => {
        if (messageId === "flaky" && deliveryCount === 1) {
          return Promise.reject(new Error("first try fails"));
        }
        if (messageId === "flaky") done();
        return Promise.resolve();
      },
    });
    await js.publish(`${stream.prefix}.a`, "x", { msgID: "seen-before" });
    await js.publish(`${stream.prefix}.a`, "y", { msgID: "flaky" });
    await finished;
    await running.stop();
    const spans = otel.spans.getFinishedSpans().filter((s) => s.name.startsWith("process "));
    const outcomes = spans.map((s) => [s.attributes["inbox.outcome"], s.status.code]);
    assert.deepEqual(outcomes, [
      ["duplicate", SpanStatusCode.UNSET],
      ["failed", SpanStatusCode.ERROR],
      ["processed", SpanStatusCode.UNSET],
    ]);
    const points = await metricPoints(otel.reader);
    assert.equal(sum(points.get("inbox.messages.processed")), 1);
    assert.equal(sum(points.get("inbox.messages.duplicates")), 1);
    assert.equal(sum(points.get("outbox.errors"), { surface: "inbox", phase: "process" }), 1);
  } finally {
    await nc.close();
  }
});

Deno.test("outbox.keys.blocked reports the ordering keys blocked by a dead head (SQLite store)", async () => {
  await using otel = withOtel();
  const telemetry = new OutboxTelemetry({ meterProvider: otel.meterProvider });
  const executor = nodeSqliteExecutor(new DatabaseSync(":memory:"));
  await migrate(executor, { dialect: "sqlite" });
  const outbox = new SqlOutboxRepository(executor, "sqlite");
  const base = { kind: "event.publish" as const, name: "n", subject: "s.a", payload: "{}" };
  await outbox.enqueueMany([
    { ...base, id: "a1", headers: {}, orderingKey: "a" },
    { ...base, id: "a2", headers: {}, orderingKey: "a" },
    { ...base, id: "b1", headers: {}, orderingKey: "b" },
  ]);
  const now = new Date();
  for (const claim of await outbox.claimDue(10, now)) {
    await outbox.markDead(claim, { error: "poison", now });
  }
  const observation = telemetry.observeBacklog(outbox, { store: "orders", intervalMs: 60_000 });
  await observation.refresh();
  let points = await metricPoints(otel.reader);
  assert.equal(sum(points.get("outbox.keys.blocked"), { "outbox.store": "orders" }), 2);
  await outbox.unblockKey("a", { action: "skip" });
  await observation.refresh();
  points = await metricPoints(otel.reader);
  assert.equal(sum(points.get("outbox.keys.blocked"), { "outbox.store": "orders" }), 1);
  await observation.stop();
});

Deno.test("failure texts reach spans bounded and clean; an error code that is not a short string is error.type other", async () => {
  await using otel = withOtel();
  const telemetry = new OutboxTelemetry({
    tracerProvider: otel.tracerProvider,
    meterProvider: otel.meterProvider,
  });
  const failures: Record<string, unknown> = {
    "m-nul": new Error("bad \u0000 byte \ud800"),
    "m-huge": new Error("z".repeat(100_000)),
    "m-code": new OutboxPublishError("retryable", "odd code", { code: "c".repeat(1_000) }),
  };
  const runtime = telemetry.instrumentRuntime({
    publishPreparedEvent: (event) => Promise.reject(failures[event.header.id]),
  });
  const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
  await outbox.enqueueMany(
    Object.keys(failures).map((id) => ({
      id,
      kind: "event.publish" as const,
      name: "e",
      subject: "a.b",
      payload: "{}",
      headers: {},
    })),
  );
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    ...telemetry.hooks,
    idleRetryMs: false,
  });
  await dispatcher.whenIdle();
  await dispatcher.stop();
  await new Promise((resolve) => setTimeout(resolve, 1));
  const publishes = otel.spans.getFinishedSpans().filter((span) => span.name.startsWith("publish"));
  assert.equal(publishes.length, 3);
  for (const span of publishes) {
    const message = span.status.message ?? "";
    assert.ok(message.length <= 8192 && !message.includes("\u0000") && message.isWellFormed());
    for (const event of span.events) {
      const text = String(event.attributes?.["exception.message"] ?? "");
      assert.ok(text.length <= 8192 && !text.includes("\u0000") && text.isWellFormed());
    }
  }
  const failed = (await metricPoints(otel.reader)).get("outbox.messages.failed") ?? [];
  const types = failed.map((point) => String(point.attributes["error.type"])).toSorted();
  assert.deepEqual(types, ["error", "other"]);
  assert.equal(sum(failed), 3);
});

Deno.test("with instrumentRuntime, a receipt or job outcome that throws when read settles dead (unreadable) as without telemetry", async () => {
  await using otel = withOtel();
  const telemetry = new OutboxTelemetry({
    tracerProvider: otel.tracerProvider,
    meterProvider: otel.meterProvider,
  });
  const throwing = (field: string) => {
    const value: Record<string, unknown> = {};
    Object.defineProperty(value, field, {
      enumerable: true,
      get() {
        throw new Error(`no ${field} for you`);
      },
    });
    return value;
  };
  const attempts = new Map<string, number>();
  const count = (id: string) => attempts.set(id, (attempts.get(id) ?? 0) + 1);
  const runtime = telemetry.instrumentRuntime({
    publishPreparedEvent: (event) => {
      count(event.header.id);
      return Promise.resolve(
        event.header.id === "fine"
          ? { duplicate: false, stream: "S", seq: 1 }
          : throwing("duplicate") as OutboxPublishReceipt,
      );
    },
    dispatchJobSubmission: (message) => {
      count(message.id);
      return Promise.resolve(throwing("duplicate") as JsonValue);
    },
  });
  const outbox = new MemoryOutboxRepository();
  await outbox.enqueueMany([
    { id: "fine", kind: "event.publish", name: "e", subject: "a.b", payload: "{}", headers: {} },
    { id: "receipt", kind: "event.publish", name: "e", subject: "a.b", payload: "{}", headers: {} },
    { id: "job", kind: "job.submit", name: "j", subject: "jobs.j", payload: "{}", headers: {} },
  ]);
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    ...telemetry.hooks,
    retry: { maxAttempts: 5, baseMs: 1, capMs: 1 },
    idleRetryMs: false,
  });
  await dispatcher.whenIdle();
  await dispatcher.stop();
  assert.equal((await outbox.get("fine"))?.state, "dispatched");
  const receipt = await outbox.get("receipt");
  assert.equal(receipt?.state, "dead");
  assert.match(receipt?.lastError ?? "", /^unreadable: /);
  assert.equal(attempts.get("receipt"), 1, "published once, not retried");
  const job = await outbox.get("job");
  assert.equal(job?.state, "dead");
  assert.equal(attempts.get("job"), 1, "the job ran once");
});
