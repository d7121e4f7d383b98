/**
 * Message identity vs trace headers: with a propagator other than W3C trace context (a B3-like
 * single header, plus W3C baggage), an idempotent re-enqueue from another trace returns the
 * stored message on every store; content differences still throw.
 */

import assert from "node:assert/strict";
import {
  type Context,
  context,
  propagation,
  type TextMapGetter,
  type TextMapPropagator,
  type TextMapSetter,
  trace,
} from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { CompositePropagator, W3CBaggagePropagator } from "@opentelemetry/core";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";
import { Kvm } from "@nats-io/kv";
import postgres from "postgres";
import {
  createOutboxBucket,
  MemoryOutboxRepository,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  OutboxDuplicateIdentityError,
  type OutboxRecord,
  type OutboxRepository,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { OutboxTelemetry, traceHeaderNames } from "../telemetry.ts";
import { connectNats, postgresUrl, uniqueName } from "./kit/mod.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

/** A B3-like propagator: one `x-trace` header `<trace id>-<span id>`. */
class SingleHeaderPropagator implements TextMapPropagator {
  inject(ctx: Context, carrier: unknown, setter: TextMapSetter): void {
    const span = trace.getSpanContext(ctx);
    if (span) setter.set(carrier, "x-trace", `${span.traceId}-${span.spanId}`);
  }
  extract(ctx: Context, _carrier: unknown, _getter: TextMapGetter): Context {
    return ctx;
  }
  fields(): string[] {
    return ["x-trace"];
  }
}

function record(id: string, headers: Record<string, string> = { tenant: "t1" }): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: "{}",
    headers,
  };
}

/** Enqueues `rec` through the instrumented outbox inside a fresh trace with its own baggage. */
function inNewTrace<T>(n: number, fn: () => Promise<T>): Promise<T> {
  const bag = propagation.createBaggage({ request: { value: `r-${n}` } });
  return context.with(propagation.setBaggage(context.active(), bag), fn);
}

async function checkStore(name: string, outbox: OutboxRepository): Promise<void> {
  const telemetry = new OutboxTelemetry();
  const traced = telemetry.instrumentOutbox(outbox);
  const id = uniqueName("ident");
  const first = await inNewTrace(1, () => traced.enqueue(record(id)));
  assert.ok(first.headers["x-trace"], `${name}: the propagator's header is stored`);
  assert.equal(first.headers["baggage"], "request=r-1");
  const again = await inNewTrace(2, () => traced.enqueue(record(id)));
  assert.deepEqual(again.headers, first.headers, `${name}: the stored message is returned`);
  const [batched] = await inNewTrace(3, () => traced.enqueueMany([record(id), record(`${id}-b`)]));
  assert.equal(batched.headers["x-trace"], first.headers["x-trace"], name);
  await assert.rejects(
    inNewTrace(4, () => traced.enqueue(record(id, { tenant: "t2" }))),
    OutboxDuplicateIdentityError,
    `${name}: other content is still another message`,
  );
  // Without the telemetry wrapper (no contextHeaders), x-trace is content.
  await assert.rejects(
    outbox.enqueue({ ...record(id), headers: { ...first.headers, "x-trace": "other" } }),
    OutboxDuplicateIdentityError,
  );
  // ... unless the caller passes the names itself.
  await outbox.enqueue(
    { ...record(id), headers: { ...first.headers, "x-trace": "other", baggage: "x=1" } },
    { contextHeaders: traceHeaderNames() },
  );
}

Deno.test("identity ignores exactly the configured propagator's fields on every store", async () => {
  const manager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(manager);
  propagation.setGlobalPropagator(
    new CompositePropagator({
      propagators: [new SingleHeaderPropagator(), new W3CBaggagePropagator()],
    }),
  );
  const tracerProvider = new BasicTracerProvider();
  trace.setGlobalTracerProvider(tracerProvider);
  const dir = await Deno.makeTempDir({ prefix: "outbox_ident_" });
  const db = openSqlite(`${dir}/app.db`);
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const tables = uniqueTables();
  const nc = await connectNats();
  const kv = await createOutboxBucket(new Kvm(nc), uniqueName("kvo"));
  const kvOutbox = new NatsKvOutboxRepository(kv);
  try {
    assert.deepEqual(traceHeaderNames().sort(), [
      "baggage",
      "traceparent",
      "tracestate",
      "x-trace",
    ]);
    await checkStore("memory", new MemoryOutboxRepository());
    const sqlite = nodeSqliteExecutor(db);
    await migrate(sqlite, { dialect: "sqlite" });
    await checkStore("sqlite", new SqlOutboxRepository(sqlite, "sqlite"));
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
    await checkStore(
      "postgres",
      new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables),
    );
    await checkStore("nats kv", kvOutbox);
  } finally {
    await kvOutbox.close();
    await kv.destroy().catch(() => {});
    await nc.close();
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.end();
    db.close();
    await Deno.remove(dir, { recursive: true });
    await tracerProvider.shutdown();
    trace.disable();
    context.disable();
    propagation.disable();
  }
});

Deno.test("contextHeaders given as a one-shot iterator counts for every record of an enqueueMany, on every store", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_ident_" });
  const db = openSqlite(`${dir}/app.db`);
  const sql = postgres(await postgresUrl(), { max: 2, onnotice: () => {} });
  const tables = uniqueTables();
  const nc = await connectNats();
  const kv = await createOutboxBucket(new Kvm(nc), uniqueName("kvo"));
  const kvOutbox = new NatsKvOutboxRepository(kv);
  try {
    const sqlite = nodeSqliteExecutor(db);
    await migrate(sqlite, { dialect: "sqlite" });
    await migrate(postgresJsExecutor(sql), { dialect: "postgres", tables });
    const stores: [string, OutboxRepository][] = [
      ["memory", new MemoryOutboxRepository()],
      ["sqlite", new SqlOutboxRepository(sqlite, "sqlite")],
      ["postgres", new SqlOutboxRepository(postgresJsExecutor(sql), "postgres", tables)],
      ["nats kv", kvOutbox],
    ];
    for (const [name, outbox] of stores) {
      const id = uniqueName("iter");
      await outbox.enqueue(record(id, { tenant: "t1", b3: "trace-1" }));
      // A stored duplicate and an in-batch duplicate: the names are needed more than once.
      const stored = await outbox.enqueueMany(
        [
          record(id, { tenant: "t1", b3: "trace-2" }),
          record(`${id}-b`, { tenant: "t1", b3: "trace-2" }),
          record(`${id}-b`, { tenant: "t1", b3: "trace-3" }),
        ],
        { contextHeaders: new Set(["b3"]).values() },
      );
      assert.equal(stored[0].headers.b3, "trace-1", name);
    }
  } finally {
    await kvOutbox.close();
    await kv.destroy().catch(() => {});
    await nc.close();
    await dropPostgresTables(postgresJsExecutor(sql), tables);
    await sql.end();
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
