/**
 * consumeWithInbox on real JetStream with the memory inbox (no transaction runner). The SQL
 * inbox in the handler's transaction is tested in inbox_sql_test.ts.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  checkInboxRetention,
  consumeWithInbox,
  createInboxBucket,
  InboxRetentionError,
  MemoryInboxRepository,
  migrate,
  NatsKvInboxRepository,
  nodeSqliteExecutor,
  OutboxValidationError,
  redeliveryHorizonMs,
  serverVersionAtLeast,
  SqlInboxRepository,
  sqliteTransactionRunner,
  termReasonSinceVersion,
} from "../mod.ts";
import {
  connectNats,
  createTestStream,
  eventually,
  type TestStream,
  uniqueName,
} from "./kit/mod.ts";

const second = 1_000_000_000;

async function setup(
  consumerConfig: Record<string, unknown> = {},
): Promise<{ nc: NatsConnection; stream: TestStream; durable: string } & AsyncDisposable> {
  const nc = await connectNats();
  const stream = await createTestStream(nc);
  const jsm = await jetstreamManager(nc);
  const durable = "worker";
  await jsm.consumers.add(stream.name, {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    ...consumerConfig,
  });
  return {
    nc,
    stream,
    durable,
    async [Symbol.asyncDispose]() {
      await stream[Symbol.asyncDispose]();
      await nc.close();
    },
  };
}

/** Acks are fire-and-forget: wait until the server shows nothing pending for the consumer. */
async function settled(nc: NatsConnection, stream: string): Promise<void> {
  const jsm = await jetstreamManager(nc);
  await eventually(async () => {
    const info = await jsm.consumers.info(stream, "worker");
    assert.equal(info.num_ack_pending, 0, "nothing left unacknowledged");
    assert.equal(info.num_pending, 0, "nothing left undelivered");
  }, { timeoutMs: 5_000 });
}

/** Resolves once `predicate()` holds, checking after every handler run. */
function waitFor(predicate: () => boolean): { check(): void; done: Promise<void> } {
  let resolve!: () => void;
  const done = new Promise<void>((r) => resolve = r);
  const check = () => {
    if (predicate()) resolve();
  };
  return { check, done };
}

Deno.test("each message is handled once; a known id is acked without the handler", async () => {
  await using env = await setup();
  const js = jetstream(env.nc);
  const inbox = new MemoryInboxRepository();
  await inbox.record("m-2", { consumer: "worker" }); // as if processed before a lost ack
  const handled: string[] = [];
  const duplicates: string[] = [];
  const all = waitFor(() => handled.length + duplicates.length === 3);
  const running = await consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
    scope: env.durable,
    inbox,
    handler: (message) => {
      handled.push(message.headers!.get("Nats-Msg-Id"));
      all.check();
      return Promise.resolve();
    },
    onDuplicate: (_message, id) => {
      duplicates.push(id);
      all.check();
    },
  });
  for (const id of ["m-1", "m-2", "m-3"]) {
    await js.publish(`${env.stream.prefix}.a`, id, { msgID: id });
  }
  await all.done;
  await running.stop();
  assert.deepEqual(handled, ["m-1", "m-3"]);
  assert.deepEqual(duplicates, ["m-2"]);
  assert.deepEqual({ ...running.stats }, { processed: 2, duplicates: 1, failed: 0, poisoned: 0 });
  assert.equal(await inbox.has("m-1", { consumer: "worker" }), true);
  await settled(env.nc, env.stream.name);
});

Deno.test("a failing handler is redelivered with backoff and nothing is recorded meanwhile", async () => {
  await using env = await setup();
  const js = jetstream(env.nc);
  const inbox = new MemoryInboxRepository();
  const deliveries: number[] = [];
  let recordedDuringFailure: boolean | undefined;
  const done = waitFor(() => deliveries.length === 3);
  const running = await consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
    scope: env.durable,
    inbox,
    nakBackoff: { baseMs: 50, capMs: 200 },
    handler: async (_message, { deliveryCount }) => {
      deliveries.push(deliveryCount);
      done.check();
      if (deliveryCount < 3) {
        recordedDuringFailure = await inbox.has("flaky", { consumer: "worker" });
        throw new Error("not yet");
      }
    },
  });
  await js.publish(`${env.stream.prefix}.a`, "x", { msgID: "flaky" });
  await done.done;
  await running.stop();
  assert.deepEqual(deliveries, [1, 2, 3]);
  assert.equal(recordedDuringFailure, false);
  assert.equal(await inbox.has("flaky", { consumer: "worker" }), true);
  assert.equal(running.stats.failed, 2);
  assert.equal(running.stats.processed, 1);
});

Deno.test("a poison message is terminated after max_deliver and reported once", async () => {
  await using env = await setup({ max_deliver: 3 });
  const js = jetstream(env.nc);
  const poisoned: string[] = [];
  const errors: unknown[] = [];
  const healthy: string[] = [];
  const done = waitFor(() => poisoned.length === 1 && healthy.length === 1);
  const running = await consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
    scope: env.durable,
    inbox: new MemoryInboxRepository(),
    nakBackoff: { baseMs: 10, capMs: 20 },
    handler: (message) => {
      if (message.string() === "poison") return Promise.reject(new Error("cannot apply"));
      healthy.push(message.string());
      done.check();
      return Promise.resolve();
    },
    onPoison: (message) => {
      poisoned.push(message.string());
      done.check();
    },
    onError: (error) => errors.push(error),
  });
  await js.publish(`${env.stream.prefix}.a`, "poison", { msgID: "p-1" });
  await js.publish(`${env.stream.prefix}.a`, "fine", { msgID: "p-2" });
  await done.done;
  await running.stop();
  assert.deepEqual(poisoned, ["poison"]);
  assert.deepEqual(healthy, ["fine"], "the poison message did not block its neighbour");
  assert.equal(errors.length, 3);
  assert.equal(running.stats.poisoned, 1);
  await settled(env.nc, env.stream.name);
});

Deno.test("a poison message is terminated with its reason where the server honours one (2.10.4+), without one before; never redelivered", async () => {
  await using env = await setup({ max_deliver: 2, ack_wait: second });
  const js = jetstream(env.nc);
  const version = env.nc.info?.version;
  const advisories = env.nc.subscribe(
    `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.${env.stream.name}.${env.durable}`,
  );
  const poisoned: string[] = [];
  const attempts: number[] = [];
  const running = await consumeWithInbox(
    await js.consumers.get(env.stream.name, env.durable),
    {
      scope: env.durable,
      inbox: new MemoryInboxRepository(),
      nakBackoff: { baseMs: 10, capMs: 10 },
      handler: (message) => {
        attempts.push(message.info.deliveryCount);
        return Promise.reject(new Error("cannot apply"));
      },
      onPoison: (message) => void poisoned.push(message.string()),
    },
  );
  try {
    await js.publish(`${env.stream.prefix}.a`, "poison", { msgID: "term-1" });
    let advisory: { reason?: string; deliveries: number } | undefined;
    // A terminate ack the server ignored sends no advisory: give up after a while.
    const giveUp = setTimeout(() => advisories.unsubscribe(), 10_000);
    for await (const message of advisories) {
      advisory = message.json();
      break;
    }
    clearTimeout(giveUp);
    assert.ok(advisory, `nats-server ${version}: no MSG_TERMINATED advisory (term ignored?)`);
    assert.equal(advisory.deliveries, 2);
    if (serverVersionAtLeast(version, termReasonSinceVersion)) {
      assert.equal(advisory.reason, "poisoned after 2 deliveries: cannot apply");
    } else {
      assert.ok(!advisory.reason, `nats-server ${version}: no reason sent`);
    }
    // Terminated for good: no third delivery (a reason on 2.9 would have been ignored).
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    assert.deepEqual(attempts, [1, 2], `nats-server ${version}`);
    assert.deepEqual(poisoned, ["poison"]);
  } finally {
    advisories.unsubscribe();
    await running.stop();
  }
});

Deno.test("a handler longer than ack_wait is kept alive with in-progress acks", async () => {
  await using env = await setup({ ack_wait: 1 * second });
  const js = jetstream(env.nc);
  const deliveries: number[] = [];
  let release!: () => void;
  const released = new Promise<void>((r) => release = r);
  const started = waitFor(() => deliveries.length >= 1);
  const running = await consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
    scope: env.durable,
    inbox: new MemoryInboxRepository(),
    inProgressIntervalMs: 200,
    handler: async (_message, { deliveryCount }) => {
      deliveries.push(deliveryCount);
      started.check();
      await released;
    },
  });
  await js.publish(`${env.stream.prefix}.a`, "slow", { msgID: "slow-1" });
  await started.done;
  // Hold the handler for 2.5 ack_wait periods, measured by the server's own redelivery clock:
  // ask the consumer until its ack floor shows nothing was redelivered.
  const jsm = await jetstreamManager(env.nc);
  const until = Date.now() + 2_500;
  while (Date.now() < until) {
    const info = await jsm.consumers.info(env.stream.name, "worker");
    assert.equal(info.num_redelivered, 0, "no redelivery while the handler works");
    await new Promise((r) => setTimeout(r, 250));
  }
  release();
  await running.stop();
  assert.deepEqual(deliveries, [1]);
});

Deno.test("stop() waits for the handler in flight, which still acks", async () => {
  await using env = await setup();
  const js = jetstream(env.nc);
  let release!: () => void;
  const released = new Promise<void>((r) => release = r);
  const started = waitFor(() => true);
  const running = await consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
    scope: env.durable,
    inbox: new MemoryInboxRepository(),
    handler: async () => {
      started.check();
      await released;
    },
  });
  await js.publish(`${env.stream.prefix}.a`, "x", { msgID: "s-1" });
  await started.done;
  let stopped = false;
  const stopping = running.stop().then(() => stopped = true);
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(stopped, false, "stop waits for the handler");
  release();
  await stopping;
  assert.equal(running.stats.processed, 1);
  await settled(env.nc, env.stream.name);
});

Deno.test("configuration errors are typed and happen at start", async () => {
  await using env = await setup();
  const js = jetstream(env.nc);
  const base = { scope: env.durable, handler: () => Promise.resolve() };
  const consumer = await js.consumers.get(env.stream.name, env.durable);
  await assert.rejects(
    consumeWithInbox(consumer, { ...base, inbox: { record: () => Promise.resolve(true) } }),
    OutboxValidationError,
  );
  await assert.rejects(
    consumeWithInbox(consumer, { ...base, inbox: new MemoryInboxRepository(), concurrency: 0 }),
    OutboxValidationError,
  );
  await assert.rejects(
    consumeWithInbox(consumer, { ...base, inbox: new MemoryInboxRepository(), pullExpiresMs: 999 }),
    OutboxValidationError,
  );
  await assert.rejects(
    consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), {
      ...base,
      inbox: new MemoryInboxRepository(),
      retention: { inboxRetentionMs: 1_000, strict: true },
    }),
    InboxRetentionError,
  );
});

Deno.test("retention shorter than the redelivery horizon or duplicate window is flagged", () => {
  const consumer = { max_deliver: 5, ack_wait: 30 * second };
  assert.equal(redeliveryHorizonMs(consumer, 60_000), 300_000);
  assert.equal(redeliveryHorizonMs({ ...consumer, backoff: [1 * second, 600 * second] }, 0), 3e6);
  assert.equal(redeliveryHorizonMs({ max_deliver: -1 }, 0), Infinity);
  const warnings: string[] = [];
  const limits = { consumer, nakCapMs: 60_000 };
  const onWarning = (m: string) => warnings.push(m);
  const duplicateWindowMs = 120_000;
  checkInboxRetention({ inboxRetentionMs: 86_400_000, duplicateWindowMs, onWarning }, limits);
  assert.equal(warnings.length, 0);
  checkInboxRetention({ inboxRetentionMs: 100_000, duplicateWindowMs, onWarning }, limits);
  assert.match(warnings[0], /redelivery horizon \(300000 ms/);
  assert.match(warnings[0], /duplicate window \(120000 ms\)/);
  assert.throws(
    () => checkInboxRetention({ inboxRetentionMs: 100_000, strict: true }, limits),
    (error: InboxRetentionError) => error.requiredMs === 300_000,
  );
});

Deno.test("a NATS KV inbox plugs in: duplicates suppressed, failures retried", async () => {
  await using env = await setup({ max_deliver: 5 });
  const js = jetstream(env.nc);
  const kvm = new Kvm(env.nc);
  const bucket = uniqueName("inbox");
  const kv = await createInboxBucket(kvm, bucket);
  const inbox = new NatsKvInboxRepository(kv);
  try {
    await inbox.record("k-2", { consumer: "worker" }); // processed before a lost ack
    const handled: string[] = [];
    const running = await consumeWithInbox(
      await js.consumers.get(env.stream.name, env.durable),
      {
        scope: env.durable,
        inbox,
        nakBackoff: { baseMs: 20, capMs: 50 },
        handler: (message, { deliveryCount }) => {
          if (message.string() === "k-3" && deliveryCount === 1) {
            return Promise.reject(new Error("first try fails"));
          }
          handled.push(message.string());
          return Promise.resolve();
        },
      },
    );
    for (const id of ["k-1", "k-2", "k-3"]) {
      await js.publish(`${env.stream.prefix}.a`, id, { msgID: id });
    }
    await eventually(() => assert.equal(running.stats.processed + running.stats.duplicates, 3));
    await running.stop();
    assert.deepEqual(handled.sort(), ["k-1", "k-3"]);
    assert.equal(running.stats.duplicates, 1);
    assert.equal(await inbox.has("k-3", { consumer: "worker" }), true, "recorded after success");
    await settled(env.nc, env.stream.name);
  } finally {
    await kv.destroy().catch(() => {});
  }
});

Deno.test("with a transaction runner, an inbox not bound to the transaction (no factory) is refused at start", async () => {
  // Over the runner's own SQLite connection its record() would wait forever for the very
  // transaction it runs in; over another connection it would commit before the handler ran.
  await using env = await setup();
  const dir = await Deno.makeTempDir({ prefix: "outbox_unbound_" });
  const db = new DatabaseSync(`${dir}/app.db`);
  try {
    await migrate(nodeSqliteExecutor(db), { dialect: "sqlite" });
    const js = jetstream(env.nc);
    const options = {
      scope: env.durable,
      handler: () => Promise.resolve(),
      transaction: sqliteTransactionRunner(nodeSqliteExecutor(db)),
      inbox: new SqlInboxRepository(nodeSqliteExecutor(db), "sqlite"),
    };
    const started = consumeWithInbox(await js.consumers.get(env.stream.name, env.durable), options);
    await assert.rejects(
      started.then(async (running) => {
        await running.stop();
        return running;
      }),
      (error: unknown) =>
        error instanceof OutboxValidationError && /function of the transaction/.test(error.message),
    );
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});
