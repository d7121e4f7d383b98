/**
 * The NATS KV outbox across a server crash: a private nats-server is killed (-9) and restarted
 * on the same store; records survive, claims resume, and the wake-up watch recovers by itself.
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import { createOutboxBucket, NatsKvOutboxRepository, type NatsKvWork } from "../mod.ts";
import { connectNats, eventually, NatsServer, uniqueName } from "./kit/mod.ts";

function record(id: string) {
  return {
    id,
    kind: "event.publish" as const,
    name: "n",
    subject: "orders.created",
    payload: "{}",
    headers: {},
  };
}

Deno.test("nats kv fault: kill -9 and restart of the server", async () => {
  await using server = await NatsServer.start();
  const options = { maxReconnectAttempts: -1, reconnectTimeWait: 100 };
  const nc = await connectNats(server.url, options);
  const peerNc = await connectNats(server.url, options);
  const name = uniqueName("kvo");
  const outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), name), {
    syncTimeoutMs: 2_000,
  });
  const producer = new NatsKvOutboxRepository(await new Kvm(peerNc).open(name));
  try {
    const seen: NatsKvWork[] = [];
    const unwatch = await outbox.watch((work) => seen.push(work));
    await producer.enqueue(record("before-crash"));
    await eventually(() => Promise.resolve(assert.equal(seen.at(-1)?.id, "before-crash")));
    const [claim] = await outbox.claimDue(10, new Date());
    assert.equal(claim.id, "before-crash");

    await server.kill("SIGKILL");
    await server.restart();

    // Writes work again once both connections are back; the record survived (file storage).
    await eventually(() => producer.enqueue(record("after-crash")));
    assert.equal((await producer.get("before-crash"))?.state, "claimed");
    // The watch recovers by itself (its consumer is recreated after missed heartbeats) and
    // reports the new work without any claim or poll.
    await eventually(
      () => Promise.resolve(assert.ok(seen.some((work) => work.id === "after-crash"))),
      { timeoutMs: 40_000, intervalMs: 100 },
    );
    await eventually(async () => {
      assert.deepEqual((await outbox.claimDue(10, new Date())).map((m) => m.id), ["after-crash"]);
    });
    assert.equal(await outbox.markDispatched(claim, new Date()), true, "the old claim still holds");
    await unwatch();
  } finally {
    await outbox.close();
    await producer.close();
    await (await new Kvm(nc).open(name)).destroy().catch(() => {});
    await peerNc.close();
    await nc.close();
  }
});
