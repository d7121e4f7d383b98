/**
 * Inboxes that record immediately (memory, NATS KV) cannot join the work's transaction: the id
 * must be recorded only after the work succeeded, by `processOnce` and by `consumeWithInbox` even
 * when a transaction runner is given. A failed work is run again, never reported as a duplicate.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { Kvm } from "@nats-io/kv";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  createInboxBucket,
  type InboxRepository,
  MemoryInboxRepository,
  NatsKvInboxRepository,
  nodeSqliteExecutor,
  processOnce,
  type SqlExecutor,
  sqliteTransactionRunner,
} from "../mod.ts";
import { connectNats, createTestStream, eventually, uniqueName } from "./kit/mod.ts";

class Boom extends Error {}

async function withInboxes(fn: (inbox: InboxRepository, name: string) => Promise<void>) {
  await fn(new MemoryInboxRepository(), "memory");
  const nc = await connectNats();
  const kv = await createInboxBucket(new Kvm(nc), uniqueName("kvi"), { retentionMs: 0 });
  try {
    await fn(new NatsKvInboxRepository(kv), "nats kv");
  } finally {
    await kv.destroy().catch(() => {});
    await nc.close();
  }
}

Deno.test("processOnce with a memory or NATS KV inbox: a failed work leaves nothing recorded and runs again", async () => {
  await withInboxes(async (inbox, name) => {
    const key = { messageId: "evt-1", consumer: "billing" };
    let runs = 0;
    await assert.rejects(
      processOnce(inbox, key, () => {
        runs += 1;
        return Promise.reject(new Boom("downstream said no"));
      }),
      Boom,
    );
    assert.equal(await inbox.has!("evt-1", { consumer: "billing" }), false, name);
    const retried = await processOnce(inbox, key, () => {
      runs += 1;
      return Promise.resolve("charged");
    });
    assert.deepEqual(retried, { duplicate: false, value: "charged" }, name);
    assert.deepEqual(await processOnce(inbox, key, () => Promise.resolve("again")), {
      duplicate: true,
    });
    assert.equal(runs, 2, name);
  });
});

Deno.test("processOnce refuses an inbox that records immediately but cannot tell whether it has an id", async () => {
  const inbox: InboxRepository = {
    recordsImmediately: true,
    record: () => Promise.resolve(true),
  };
  await assert.rejects(
    processOnce(inbox, { messageId: "evt-1" }, () => Promise.resolve(1)),
    /must offer has\(\)/,
  );
});

Deno.test("consumeWithInbox with a transaction runner and a memory inbox: a rolled-back handler is redelivered and processed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_immediate_" });
  const db = new DatabaseSync(`${dir}/app.db`);
  const nc = await connectNats();
  try {
    db.exec("CREATE TABLE effects (id TEXT PRIMARY KEY)");
    const run = sqliteTransactionRunner(nodeSqliteExecutor(db));
    await using stream = await createTestStream(nc);
    await (await jetstreamManager(nc)).consumers.add(stream.name, {
      durable_name: "worker",
      ack_policy: AckPolicy.Explicit,
    });
    const js = jetstream(nc);
    await js.publish(`${stream.prefix}.a`, "x", { msgID: "order-1" });
    const inbox = new MemoryInboxRepository();
    const running = await consumeWithInbox(await js.consumers.get(stream.name, "worker"), {
      scope: "worker",
      transaction: run,
      inbox,
      nakBackoff: { baseMs: 20, capMs: 100 },
      handler: async (_message, { tx, messageId, deliveryCount }) => {
        await (tx as SqlExecutor).query("INSERT INTO effects (id) VALUES (?)", [messageId]);
        if (deliveryCount === 1) throw new Boom("rolled back with the effect");
      },
    });
    await eventually(() => assert.equal(running.stats.processed, 1), { timeoutMs: 10_000 });
    await running.stop();
    assert.equal(running.stats.failed, 1);
    assert.equal(running.stats.duplicates, 0, "the redelivery was not taken for a duplicate");
    assert.deepEqual(db.prepare("SELECT id FROM effects").all().map((r) => r.id), ["order-1"]);
    assert.equal(await inbox.has("order-1", { consumer: "worker" }), true);
  } finally {
    await nc.close();
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("consumeWithInbox with a transaction runner and an inbox factory that returns a memory or NATS KV inbox: a rolled-back handler is redelivered and processed", async () => {
  await withInboxes(async (immediateInbox, name) => {
    const dir = await Deno.makeTempDir({ prefix: "outbox_immediate_" });
    const db = new DatabaseSync(`${dir}/app.db`);
    const nc = await connectNats();
    try {
      db.exec("CREATE TABLE effects (id TEXT PRIMARY KEY)");
      const run = sqliteTransactionRunner(nodeSqliteExecutor(db));
      await using stream = await createTestStream(nc);
      await (await jetstreamManager(nc)).consumers.add(stream.name, {
        durable_name: "worker",
        ack_policy: AckPolicy.Explicit,
      });
      const js = jetstream(nc);
      await js.publish(`${stream.prefix}.a`, "x", { msgID: "order-1" });
      const running = await consumeWithInbox(await js.consumers.get(stream.name, "worker"), {
        scope: "worker",
        transaction: run,
        // A factory, as for a SQL inbox, that hands out an inbox writing at once.
        inbox: (_tx: SqlExecutor) => immediateInbox,
        nakBackoff: { baseMs: 20, capMs: 100 },
        handler: async (_message, { tx, messageId, deliveryCount }) => {
          await (tx as SqlExecutor).query("INSERT INTO effects (id) VALUES (?)", [messageId]);
          if (deliveryCount === 1) throw new Boom("rolled back with the effect");
        },
      });
      await eventually(
        () => assert.equal(running.stats.processed + running.stats.duplicates, 1, name),
        { timeoutMs: 10_000 },
      );
      await running.stop();
      assert.equal(running.stats.failed, 1, name);
      assert.equal(
        running.stats.duplicates,
        0,
        `${name}: the redelivery was taken for a duplicate`,
      );
      assert.deepEqual(db.prepare("SELECT id FROM effects").all().map((r) => r.id), ["order-1"]);
      assert.equal(await immediateInbox.has!("order-1", { consumer: "worker" }), true, name);
    } finally {
      await nc.close();
      db.close();
      await Deno.remove(dir, { recursive: true });
    }
  });
});
