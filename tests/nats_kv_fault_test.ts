/**
 * The NATS KV outbox across a server crash: a private nats-server is killed (-9) and restarted
 * on the same store; records survive, claims resume, and the wake-up watch recovers by itself.
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import {
  createOutboxBucket,
  NatsKvOutboxRepository,
  type NatsKvWork,
  OutboxValidationError,
} from "../mod.ts";
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

Deno.test("nats kv fault: a record the server's max_payload cannot take is refused at enqueue; the largest accepted one can be claimed and settled", async () => {
  // Before: an 8 KiB record threw nats.js's InvalidArgumentError and left an orphan marker, and a
  // record that fit at enqueue but not once the claim added its lease could never be claimed
  // (every claim reaching it threw) nor marked with a long lastError.
  await using server = await NatsServer.start({ maxPayload: 4_096 });
  const nc = await connectNats(server.url);
  const kv = await createOutboxBucket(new Kvm(nc), uniqueName("kvo"));
  const outbox = new NatsKvOutboxRepository(kv);
  const sized = (id: string, bytes: number) => ({
    ...record(id),
    payload: JSON.stringify({ blob: "x".repeat(bytes) }),
  });
  try {
    await assert.rejects(
      outbox.enqueue(sized("too-big", 8_000)),
      (error: OutboxValidationError) =>
        error instanceof OutboxValidationError && error.field === "payload" &&
        /max_payload \(4096\)/.test(error.message),
    );
    await assert.rejects(
      outbox.enqueueMany([record("small-1"), sized("too-big-2", 3_000), record("small-2")]),
      OutboxValidationError,
    );
    assert.equal(await outbox.get("too-big"), undefined);
    assert.equal(await outbox.get("small-1"), undefined, "nothing of a refused batch is stored");
    const markers: string[] = [];
    for await (const key of await kv.keys("q.>")) if (key !== "q._sync") markers.push(key);
    assert.deepEqual(markers, [], "no orphan markers");

    // Find the largest payload the store accepts, then claim it and settle it with a huge error.
    let accepted = 0;
    for (let bytes = 1_000; bytes < 4_096; bytes += 16) {
      try {
        await outbox.enqueue(sized(`fits-${bytes}`, bytes));
        accepted = bytes;
      } catch (error) {
        assert.ok(error instanceof OutboxValidationError);
        break;
      }
    }
    assert.ok(accepted > 1_000);
    const claimed = await outbox.claimDue(100, new Date());
    assert.ok(claimed.some((message) => message.id === `fits-${accepted}`));
    const error = "\u0001".repeat(5_000); // 30 kB once JSON-escaped
    const marks = claimed.map((claim) => ({ claim, state: "dead" as const, error }));
    assert.ok((await outbox.markMany(marks, new Date())).every(Boolean));
    const dead = await outbox.get(`fits-${accepted}`);
    assert.equal(dead?.state, "dead");
    assert.ok(dead?.lastError?.endsWith("…"), "lastError is cut to fit");
    assert.equal((await outbox.stats()).dead, claimed.length);
  } finally {
    await outbox.close();
    await kv.destroy().catch(() => {});
    await nc.close();
  }
});
