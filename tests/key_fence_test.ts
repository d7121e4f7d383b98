/**
 * The broker-side key fence (#18, `keyFence: "subject"`): keyed messages are published with
 * `Nats-Expected-Last-Subject-Sequence` = their key's previous PubAck sequence. Against the test
 * server (nats-server 2.9 at 127.0.0.1:4222 by default; `scripts/test_nats_versions.ts sid` runs
 * this file on 2.15, which checks the sequence BEFORE the duplicate window, 2.9 after it), and
 * against a fake client that answers each way, so both orders are covered on any server.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  dispatchOutbox,
  type JetStreamManagerLike,
  type JetStreamPublisher,
  MemoryOutboxRepository,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  type OutboxMessage,
  outboxMessageToPreparedEvent,
  OutboxPublishError,
  type OutboxRecord,
  type OutboxRuntime,
  type PreparedEvent,
  SqlOutboxRepository,
} from "../mod.ts";
import { DatabaseSync } from "node:sqlite";
import { connectNats, createTestStream } from "./kit/mod.ts";
import { streamIds } from "./helpers/dispatch.ts";

let counter = 0;

function keyed(subject: string, key: string | undefined, tag: string): OutboxRecord {
  counter += 1;
  const record: OutboxRecord = {
    id: `fence-${tag}-${counter}-${Math.random().toString(36).slice(2, 8)}`,
    kind: "event.publish",
    name: "t",
    subject,
    payload: JSON.stringify({ n: counter }),
    headers: {},
  };
  if (key !== undefined) record.orderingKey = key;
  return record;
}

function serverVersion(nc: NatsConnection): string {
  return (nc as unknown as { info?: { version?: string } }).info?.version ?? "unknown";
}

/** A runtime whose publishes of `ids` are stored by the broker but whose PubAcks are "lost". */
function losingReplies(runtime: OutboxRuntime, ids: Set<string>): OutboxRuntime {
  return {
    async publishPreparedEvent(event: PreparedEvent, options) {
      const receipt = await runtime.publishPreparedEvent(event, options);
      if (ids.delete(event.header.id)) {
        throw new OutboxPublishError("unavailable", "no PubAck in time (lost on purpose)", {
          code: "timeout",
        });
      }
      return receipt;
    },
  };
}

Deno.test("key fence: a retry whose first attempt was stored (reply lost) is dispatched with the stored sequence", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const subject = `${stream.prefix}.order-1`;
    const outbox = new MemoryOutboxRepository();
    const [a, b, c] = ["a", "b", "c"].map((tag) => keyed(subject, "order-1", tag));
    for (const record of [a, b, c]) await outbox.enqueue(record);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const lost = new Set([b.id]);
    const options = { keyFence: "subject" as const, limit: 10, retry: { baseMs: 1, capMs: 1 } };
    const dispatched: Array<[string, number | undefined, boolean]> = [];
    const hooks = {
      onDispatched: (
        message: OutboxMessage,
        info: { duplicate: boolean; receipt?: { seq?: number } },
      ) => dispatched.push([message.id, info.receipt?.seq, info.duplicate]),
    };
    const flaky = losingReplies(runtime, lost);
    let rounds = 0;
    while ((await outbox.get(c.id))?.state !== "dispatched") {
      assert.ok(++rounds < 20, "the key drains");
      await new Promise((resolve) => setTimeout(resolve, 5));
      await dispatchOutbox(outbox, flaky, { ...options, ...hooks });
    }
    // b was stored by its first attempt; its retry carried the same expectation (a's sequence)
    // and was recognised (2.9: a duplicate PubAck; 2.15: a 10071 and b last on the subject).
    assert.deepEqual(dispatched, [
      [a.id, 1, false],
      [b.id, 2, true],
      [c.id, 3, false],
    ], `nats-server ${serverVersion(nc)}`);
    assert.deepEqual(await streamIds(nc, stream.name), [a.id, b.id, c.id]);
    const failedOnce = await outbox.get(b.id);
    assert.equal(failedOnce?.attempts, 2);
  } finally {
    await nc.close();
  }
});

Deno.test("key fence: the publish carries the expectation; a message on the key's subject from elsewhere makes the next one dead (key_fence) until an operator retries it", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const subject = `${stream.prefix}.order-2`;
    const outbox = new MemoryOutboxRepository();
    const [a, b, c] = ["a", "b", "c"].map((tag) => keyed(subject, "order-2", tag));
    for (const record of [a, b, c]) await outbox.enqueue(record);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const options = { keyFence: "subject" as const, limit: 10 };
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    // Someone else publishes to the key's subject.
    await jetstream(nc).publish(subject, "{}", { msgID: "intruder" });
    const result = await dispatchOutbox(outbox, runtime, options);
    assert.equal(result.dead, 1, `nats-server ${serverVersion(nc)}`);
    const dead = await outbox.get(b.id);
    assert.equal(dead?.state, "dead");
    assert.match(dead?.lastError ?? "", /^key_fence: the key fence refused the publish/);
    assert.match(dead?.lastError ?? "", /Nats-Msg-Id "intruder"/);
    const [blocked] = await outbox.blockedKeys();
    assert.equal(blocked.key, "order-2");
    assert.equal(blocked.waiting, 1);
    assert.equal((await dispatchOutbox(outbox, runtime, options)).claimed, 0, "the key waits");
    // The operator retries: b goes out unfenced (its key forgot the sequence), c fenced on b.
    assert.equal(await outbox.unblockKey("order-2", { action: "retry" }), true);
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    assert.deepEqual(await streamIds(nc, stream.name), [a.id, "intruder", b.id, c.id]);
  } finally {
    await nc.close();
  }
});

Deno.test("key fence: when the key's previous message was removed from the stream (deleted, then purged), the next one is still dispatched in order, fenced on what is left", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const jsm = await jetstreamManager(nc);
    const subject = `${stream.prefix}.order-9`;
    const outbox = new MemoryOutboxRepository();
    const [a, b, c, d] = ["a", "b", "c", "d"].map((tag) => keyed(subject, "order-9", tag));
    for (const record of [a, b, c, d]) await outbox.enqueue(record);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const options = { keyFence: "subject" as const, limit: 10 };
    // a, then b (fenced on a).
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    const seqB = (await jsm.streams.getMessage(stream.name, { last_by_subj: subject }))!.seq;
    // b (the key's previous message) is removed: c expects it, finds a older, goes again on a.
    await jsm.streams.deleteMessage(stream.name, seqB);
    const third = await dispatchOutbox(outbox, runtime, options);
    assert.equal(third.dispatched, 1, `nats-server ${serverVersion(nc)}: ${JSON.stringify(third)}`);
    assert.deepEqual(await streamIds(nc, stream.name), [a.id, c.id]);
    // Now the subject is emptied: d expects c, finds nothing, goes again expecting 0.
    await jsm.streams.purge(stream.name, { filter: subject });
    assert.equal((await dispatchOutbox(outbox, runtime, options)).dispatched, 1);
    assert.deepEqual(await streamIds(nc, stream.name), [d.id]);
    assert.equal((await outbox.get(d.id))?.state, "dispatched");
    assert.deepEqual(await outbox.blockedKeys(), []);
  } finally {
    await nc.close();
  }
});

Deno.test("key fence: the runtime sends Nats-Expected-Last-Subject-Sequence (a wrong one is refused, the right one stored)", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const subject = `${stream.prefix}.k`;
    const runtime = createJetStreamRuntime(jetstream(nc));
    const event = (id: string): PreparedEvent => ({
      event: "t",
      subject,
      header: { id, time: new Date().toISOString() },
      payload: {},
      encodedPayload: "{}",
      headers: {},
    });
    const first = await runtime.publishPreparedEvent(event("h-1"));
    const second = await runtime.publishPreparedEvent(event("h-1b"));
    // Expecting h-1 while h-1b (newer, not this message) is last: refused.
    await assert.rejects(
      runtime.publishPreparedEvent(event("h-2"), { expectedLastSubjectSequence: first.seq }),
      (error: OutboxPublishError) => error.kind === "permanent" && error.code === "key_fence",
    );
    // A stored header of the same name is not the fence: it is dropped.
    const stored = await runtime.publishPreparedEvent(
      { ...event("h-3"), headers: { "Nats-Expected-Last-Subject-Sequence": "999" } },
      { expectedLastSubjectSequence: second.seq },
    );
    assert.equal(stored.seq, second.seq + 1);
    await assert.rejects(
      runtime.publishPreparedEvent(event("h-4"), { expectedLastSubjectSequence: 0 }),
      { code: "invalid_argument" },
    );
    assert.deepEqual(await streamIds(nc, stream.name), ["h-1", "h-1b", "h-3"]);
  } finally {
    await nc.close();
  }
});

Deno.test("key fence: a zombie claim's late publish is refused and does not reorder the stream (with the fence off, it lands after the key's later messages)", async () => {
  const nc = await connectNats();
  try {
    for (const keyFence of ["subject", "off"] as const) {
      // A short duplicate window: the zombie publishes after it, so only the fence can stop it.
      await using stream = await createTestStream(nc, { duplicate_window: 200_000_000 });
      const subject = `${stream.prefix}.z`;
      const outbox = new MemoryOutboxRepository();
      const [m1, m2, m3] = ["1", "2", "3"].map((tag) => keyed(subject, "z", tag));
      for (const record of [m1, m2, m3]) await outbox.enqueue(record);
      const runtime = createJetStreamRuntime(jetstream(nc));
      const t0 = new Date();
      const at = (ms: number) => new Date(t0.getTime() + ms);
      assert.equal(
        (await dispatchOutbox(outbox, runtime, { keyFence, now: t0, leaseMs: 1_000 })).dispatched,
        1,
      );
      // The zombie claims m2 and stalls past its lease.
      const [zombie] = await outbox.claimDue(1, at(1), { leaseMs: 1_000 });
      assert.equal(zombie.id, m2.id);
      assert.equal(zombie.keySequence, 1);
      // Another dispatcher takes m2 over, then m3.
      const options = { keyFence, leaseMs: 1_000 };
      assert.equal(
        (await dispatchOutbox(outbox, runtime, { ...options, now: at(5_000) })).dispatched,
        1,
      );
      assert.equal(
        (await dispatchOutbox(outbox, runtime, { ...options, now: at(5_001) })).dispatched,
        1,
      );
      await new Promise((resolve) => setTimeout(resolve, 400)); // past the duplicate window
      const late = runtime.publishPreparedEvent(
        outboxMessageToPreparedEvent(zombie),
        keyFence === "subject" ? { expectedLastSubjectSequence: zombie.keySequence } : {},
      );
      if (keyFence === "subject") {
        await assert.rejects(late, { code: "key_fence" }, `nats-server ${serverVersion(nc)}`);
        assert.deepEqual(
          await outbox.markMany([{ claim: zombie, state: "dead", error: "key_fence" }], at(5_002)),
          [false],
          "the zombie's claim is superseded: its outcome changes nothing",
        );
        assert.deepEqual(await streamIds(nc, stream.name), [m1.id, m2.id, m3.id]);
      } else {
        await late;
        assert.deepEqual(await streamIds(nc, stream.name), [m1.id, m2.id, m3.id, m2.id]);
      }
    }
  } finally {
    await nc.close();
  }
});

/**
 * A fake nats.js client: its server stored `stored` last on the subject; a fenced publish whose
 * expectation does not match answers like 2.12+ standalone (`sequenceFirst`: a 10071 even for
 * a duplicate) or like 2.9 (a duplicate PubAck first).
 */
function fakeClient(
  stored: { id: string; seq: number } | null,
  sequenceFirst: boolean,
  lookup: "ok" | "fails" = "ok",
): { js: JetStreamPublisher; published: Array<Record<string, string>> } {
  const published: Array<Record<string, string>> = [];
  const manager: JetStreamManagerLike = {
    getAccountInfo: () => Promise.resolve({}),
    streams: {
      find: () => Promise.resolve("S"),
      info: () => Promise.resolve({}),
      getMessage: () =>
        lookup === "fails" ? Promise.reject(new Error("api timeout")) : Promise.resolve(
          stored && {
            seq: stored.seq,
            header: { get: (name: string) => name === "Nats-Msg-Id" ? stored.id : "" },
          },
        ),
    },
  };
  const js: JetStreamPublisher = {
    publish(_subject, _payload, options) {
      const h = options?.headers as { get(name: string): string };
      const id = h.get("Nats-Msg-Id");
      const expected = h.get("Nats-Expected-Last-Subject-Sequence");
      published.push({ id, expected });
      const duplicate = stored !== null && stored.id === id;
      const wrong = expected !== "" && Number(expected) !== (stored?.seq ?? 0);
      if (duplicate && !(sequenceFirst && wrong)) {
        return Promise.resolve({ stream: "S", seq: stored!.seq, duplicate: true });
      }
      if (wrong) {
        const error = new Error(`wrong last sequence: ${stored?.seq ?? 0}`);
        error.name = "JetStreamApiError";
        Object.defineProperty(error, "code", { value: 10071 });
        Object.defineProperty(error, "status", { value: 400 });
        return Promise.reject(error);
      }
      return Promise.resolve({ stream: "S", seq: (stored?.seq ?? 0) + 1, duplicate: false });
    },
    jetstreamManager: () => Promise.resolve(manager),
  };
  return { js, published };
}

const fakeEvent: PreparedEvent = {
  event: "t",
  subject: "orders.k",
  header: { id: "m-2", time: "2026-01-01T00:00:00.000Z" },
  payload: {},
  encodedPayload: "{}",
  headers: {},
};

for (const sequenceFirst of [true, false]) {
  const order = sequenceFirst ? "sequence check first (2.12+)" : "duplicate check first (2.9)";
  Deno.test(`key fence (fake server, ${order}): a stored earlier attempt is a success with its sequence`, async () => {
    const { js, published } = fakeClient({ id: "m-2", seq: 8 }, sequenceFirst);
    const runtime = createJetStreamRuntime(js, { publisher: "js.publish" });
    const receipt = await runtime.publishPreparedEvent(fakeEvent, {
      expectedLastSubjectSequence: 7,
    });
    assert.deepEqual(receipt, { stream: "S", seq: 8, duplicate: true });
    assert.deepEqual(published, [{ id: "m-2", expected: "7" }]);
  });
  Deno.test(`key fence (fake server, ${order}): another message last on the subject is permanent (key_fence)`, async () => {
    const { js } = fakeClient({ id: "intruder", seq: 8 }, sequenceFirst);
    const runtime = createJetStreamRuntime(js, { publisher: "js.publish" });
    await assert.rejects(
      runtime.publishPreparedEvent(fakeEvent, { expectedLastSubjectSequence: 7 }),
      (error: OutboxPublishError) =>
        error.kind === "permanent" && error.code === "key_fence" &&
        /last message on the subject is sequence 8 \(Nats-Msg-Id "intruder"\)/.test(error.message),
    );
  });
}

Deno.test("key fence (fake server): a removed previous message is published again expecting what is left; a lookup that fails is retryable; without an expectation nothing is looked up", async () => {
  const emptied = fakeClient(null, true);
  const empty = createJetStreamRuntime(emptied.js, { publisher: "js.publish" });
  assert.equal(
    (await empty.publishPreparedEvent(fakeEvent, { expectedLastSubjectSequence: 7 })).seq,
    1,
  );
  assert.deepEqual(emptied.published, [{ id: "m-2", expected: "7" }, { id: "m-2", expected: "0" }]);
  const older = fakeClient({ id: "kept", seq: 5 }, true);
  const trimmed = createJetStreamRuntime(older.js, { publisher: "js.publish" });
  assert.equal(
    (await trimmed.publishPreparedEvent(fakeEvent, { expectedLastSubjectSequence: 7 })).seq,
    6,
  );
  assert.deepEqual(older.published, [{ id: "m-2", expected: "7" }, { id: "m-2", expected: "5" }]);
  const blind = createJetStreamRuntime(fakeClient({ id: "m-2", seq: 8 }, true, "fails").js, {
    publisher: "js.publish",
  });
  await assert.rejects(
    blind.publishPreparedEvent(fakeEvent, { expectedLastSubjectSequence: 7 }),
    (error: OutboxPublishError) =>
      error.kind === "retryable" && error.code === "key_fence_unverified",
  );
  const { js, published } = fakeClient({ id: "other", seq: 8 }, true);
  const plain = createJetStreamRuntime(js, { publisher: "js.publish" });
  assert.equal((await plain.publishPreparedEvent(fakeEvent)).seq, 9);
  assert.deepEqual(published, [{ id: "m-2", expected: "" }]);
});

Deno.test("key fence: dispatched marks of keyed messages carry the PubAck sequence, fence on or off; unkeyed ones do not", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const jsm = await jetstreamManager(nc);
    void jsm;
    for (const keyFence of ["off", "subject"] as const) {
      const outbox = new MemoryOutboxRepository();
      const subject = `${stream.prefix}.${keyFence}`;
      const [a, b] = [keyed(subject, `k-${keyFence}`, "a"), keyed(subject, `k-${keyFence}`, "b")];
      const plain = keyed(`${stream.prefix}.plain`, undefined, "p");
      for (const record of [a, b, plain]) await outbox.enqueue(record);
      const runtime = createJetStreamRuntime(jetstream(nc));
      const seen: Array<number | undefined> = [];
      const original = outbox.markMany.bind(outbox);
      outbox.markMany = (marks, now) => {
        for (const mark of marks) {
          seen.push(mark.state === "dispatched" ? mark.sequence : undefined);
        }
        return original(marks, now);
      };
      await dispatchOutbox(outbox, runtime, { keyFence });
      assert.equal(seen.length, 2);
      assert.equal(typeof seen[0], "number", "keyed: the PubAck sequence");
      assert.equal(seen[1], undefined, "unkeyed: none");
      const [next] = await outbox.claimDue(1, new Date());
      assert.equal(next.id, b.id);
      assert.equal(next.keySequence, seen[0]);
    }
    await assert.rejects(
      dispatchOutbox(new MemoryOutboxRepository(), createJetStreamRuntime(jetstream(nc)), {
        keyFence: "on" as "off",
      }),
      { name: "OutboxValidationError", field: "keyFence" },
    );
  } finally {
    await nc.close();
  }
});

Deno.test("key fence: OutboxDispatcher on SQLite, 20 keys x 10 messages with lost PubAcks and failed publishes: every key in order, fenced, nothing lost or duplicated", async () => {
  const nc = await connectNats();
  const dir = await Deno.makeTempDir({ prefix: "outbox_fence_" });
  const db = new DatabaseSync(`${dir}/o.db`);
  try {
    db.exec("PRAGMA journal_mode = WAL");
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    const outbox = new SqlOutboxRepository(executor, "sqlite");
    await using stream = await createTestStream(nc);
    const expected = new Map<string, string[]>();
    const records: OutboxRecord[] = [];
    for (let i = 0; i < 10; i++) {
      for (let k = 0; k < 20; k++) {
        const id = `k${k}-m${i}`;
        records.push({
          id,
          kind: "event.publish",
          name: "t",
          subject: `${stream.prefix}.k${k}`,
          payload: "{}",
          headers: {},
          orderingKey: `k${k}`,
        });
        expected.set(`k${k}`, [...(expected.get(`k${k}`) ?? []), id]);
      }
    }
    await outbox.enqueueMany(records);
    const runtime = createJetStreamRuntime(jetstream(nc));
    let fenced = 0;
    let lost = 0;
    let failed = 0;
    let seed = 7;
    const random = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
    const flaky: OutboxRuntime = {
      async publishPreparedEvent(event, options) {
        if (options?.expectedLastSubjectSequence !== undefined) fenced += 1;
        if (random() < 0.05) {
          failed += 1;
          throw new OutboxPublishError("retryable", "injected", { code: "injected" });
        }
        const receipt = await runtime.publishPreparedEvent(event, options);
        if (random() < 0.1) {
          lost += 1;
          throw new OutboxPublishError("retryable", "PubAck lost (injected)", { code: "lost" });
        }
        return receipt;
      },
    };
    const dispatcher = new OutboxDispatcher(outbox, flaky, {
      keyFence: "subject",
      limit: 16,
      retry: { baseMs: 1, capMs: 5, maxAttempts: 1_000 },
      idleRetryMs: 5,
      onError: () => {},
    });
    const deadline = Date.now() + 30_000;
    while ((await outbox.stats()).dispatched < records.length) {
      assert.ok(Date.now() < deadline, "everything is dispatched in time");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await dispatcher.stop();
    assert.ok(lost > 0 && failed > 0, `lost ${lost}, failed ${failed}`);
    // Every message but each key's first was published fenced (retries included).
    assert.ok(fenced >= records.length - 20, `${fenced} fenced publishes`);
    assert.equal((await outbox.stats()).dead, 0, `nats-server ${serverVersion(nc)}`);
    const ids = await streamIds(nc, stream.name);
    assert.equal(new Set(ids).size, ids.length, "no duplicates in the stream");
    assert.equal(ids.length, records.length, "nothing lost");
    for (const [key, keyIds] of expected) {
      assert.deepEqual(ids.filter((id) => id.startsWith(`${key}-`)), keyIds, key);
    }
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
    await nc.close();
  }
});
