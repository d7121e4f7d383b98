/**
 * The installed package's telemetry entry point on Node with no OpenTelemetry SDK: it imports,
 * instruments a store, a real JetStream runtime, the dispatcher and the backlog, and everything
 * still works (every call is a no-op for OpenTelemetry).
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
import { extractTraceContext, injectTraceContext, OutboxTelemetry } from "@outbox/nats/telemetry";
import { natsUrl, uniqueName } from "./servers.ts";

test("node: no OpenTelemetry SDK is installed next to the package", () => {
  for (const sdk of ["@opentelemetry/sdk-trace-base", "@opentelemetry/sdk-metrics"]) {
    assert.throws(() => import.meta.resolve(sdk), `${sdk} is not installed`);
  }
  // The API is a peer dependency that npm installed with the package.
  assert.ok(import.meta.resolve("@opentelemetry/api"));
});

test("node: @outbox/nats/telemetry instruments a dispatcher to JetStream without an SDK", async () => {
  const nc = await connect({ servers: natsUrl() });
  const name = uniqueName("node_otel");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name, subjects: [`${name}.>`] });
  try {
    const telemetry = new OutboxTelemetry({ publishContext: "parent" });
    const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
    const runtime = telemetry.instrumentRuntime(createJetStreamRuntime(jetstream(nc)));
    const backlog = telemetry.observeBacklog(outbox, { store: "memory", intervalMs: 60_000 });
    await outbox.enqueueMany(Array.from({ length: 10 }, (_, i) => ({
      id: `${name}-${i}`,
      kind: "event.publish" as const,
      name: "node.telemetry",
      subject: `${name}.e`,
      payload: JSON.stringify({ i }),
      headers: injectTraceContext({ "X-Node": "yes" }),
    })));
    await backlog.refresh();
    const dispatcher = new OutboxDispatcher(outbox, runtime, { ...telemetry.hooks });
    await dispatcher.whenIdle();
    await dispatcher.stop();
    await backlog.stop();
    assert.equal((await outbox.stats()).dispatched, 10);
    assert.equal((await jsm.streams.info(name)).state.messages, 10);
    // No SDK, no propagator: no trace headers are invented, and extraction yields a context.
    assert.deepEqual(injectTraceContext({ a: "b" }), { a: "b" });
    assert.equal(typeof extractTraceContext({ a: "b" }).getValue, "function");
  } finally {
    await jsm.streams.delete(name).catch(() => false);
    await nc.close();
  }
});
