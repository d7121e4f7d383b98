/**
 * dispatchOutbox and the JetStream runtime against real NATS JetStream (memory store).
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  classifyJetStreamError,
  createJetStreamRuntime,
  dispatchOutbox,
  OutboxPublishError,
  type PreparedEvent,
} from "../mod.ts";
import { connectNats, createTestStream, uniqueName } from "./kit/mod.ts";
import { duplicatesOf, events, InstrumentedOutbox, streamIds } from "./helpers/dispatch.ts";

function preparedEvent(subject: string, id = uniqueName("evt")): PreparedEvent {
  return {
    event: "test.event",
    subject,
    header: { id, time: new Date().toISOString() },
    payload: {},
    encodedPayload: "{}",
    headers: {},
  };
}

Deno.test("dispatchOutbox: publishes a batch with stored headers and Nats-Msg-Id, settles it with one markMany", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const records = events(stream.prefix, 30);
    await outbox.enqueueMany(records);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const result = await dispatchOutbox(outbox, runtime, { limit: 50, maxInFlight: 8 });
    assert.deepEqual(result, {
      claimed: 30,
      dispatched: 30,
      duplicates: 0,
      failed: 0,
      unavailable: 0,
      dead: 0,
      superseded: 0,
    });
    assert.equal(outbox.markManyCalls, 1, "one batched mark for the whole batch");
    assert.ok(outbox.all().every((message) => message.state === "dispatched"));
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(ids, records.map((record) => record.id), "published in claim order");
    const jsm = await jetstreamManager(nc);
    const stored = await jsm.streams.getMessage(stream.name, { seq: 3 });
    assert.ok(stored);
    assert.equal(stored.header.get("X-Test"), records[2].headers["X-Test"]);
    assert.equal(stored.header.get("Nats-Msg-Id"), records[2].id);
    assert.equal(stored.string(), records[2].payload);
    assert.equal(stored.subject, records[2].subject);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatchOutbox: undecodable and handler-less rows go dead; neighbours are dispatched in the same batch", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const [first, , third, fourth] = events(stream.prefix, 4);
    await outbox.enqueueMany([
      first,
      { ...events(stream.prefix, 1)[0], id: "poison" },
      third,
      {
        id: "job-1",
        kind: "job.create",
        name: "report.render",
        subject: `${stream.prefix}.jobs`,
        payload: "{}",
        headers: {},
      },
      fourth,
    ]);
    outbox.corruptPayloads.add("poison");
    const dead: string[] = [];
    const result = await dispatchOutbox(outbox, createJetStreamRuntime(jetstream(nc)), {
      onDead: (message) => dead.push(message.id),
    });
    assert.equal(result.dispatched, 3);
    assert.equal(result.dead, 2);
    assert.equal(result.failed, 0);
    assert.deepEqual(dead.sort(), ["job-1", "poison"]);
    const poison = await outbox.get("poison");
    assert.equal(poison?.state, "dead");
    assert.match(
      poison?.lastError ?? "",
      /Corrupt outbox record 'poison': payload is not valid JSON/,
    );
    const job = await outbox.get("job-1");
    assert.equal(job?.state, "dead");
    assert.match(
      job?.lastError ?? "",
      /no_job_handler: no dispatchJobSubmission handler for job.create/,
    );
    assert.deepEqual(await streamIds(nc, stream.name), [first.id, third.id, fourth.id]);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatchOutbox: job messages go to dispatchJobSubmission and their outcome is stored", async () => {
  const nc = await connectNats();
  try {
    const outbox = new InstrumentedOutbox();
    await outbox.enqueue({
      id: "job-2",
      kind: "job.submit",
      name: "invoice.send",
      subject: "jobs.invoice",
      payload: JSON.stringify({ invoice: 7 }),
      headers: {},
    });
    const seen: string[] = [];
    const runtime = createJetStreamRuntime(jetstream(nc), {
      dispatchJobSubmission: (message) => {
        seen.push(`${message.kind}:${message.name}`);
        return Promise.resolve({ kind: "accepted", jobId: `j-${message.id}` });
      },
    });
    const result = await dispatchOutbox(outbox, runtime);
    assert.equal(result.dispatched, 1);
    assert.deepEqual(seen, ["job.submit:invoice.send"]);
    const stored = await outbox.get("job-2");
    assert.equal(stored?.state, "dispatched");
    assert.deepEqual(stored?.outcome, { kind: "accepted", jobId: "j-job-2" });
  } finally {
    await nc.close();
  }
});

Deno.test("dispatchOutbox: a PubAck with duplicate: true counts as dispatched (and as a duplicate)", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const js = jetstream(nc);
    const outbox = new InstrumentedOutbox();
    const [record, other] = events(stream.prefix, 2);
    await outbox.enqueueMany([record, other]);
    // The first attempt reached the stream but its outcome was never recorded (crash).
    const first = await js.publish(record.subject, record.payload, { msgID: record.id });
    assert.equal(first.duplicate, false);
    const receipts: boolean[] = [];
    const runtime = createJetStreamRuntime(js, {
      onPublished: (_event, receipt) => receipts.push(receipt.duplicate),
    });
    const dispatched: Array<[string, boolean]> = [];
    const result = await dispatchOutbox(outbox, runtime, {
      onDispatched: (message, info) => dispatched.push([message.id, info.duplicate]),
    });
    assert.equal(result.dispatched, 2);
    assert.equal(result.duplicates, 1);
    assert.deepEqual(dispatched, [[record.id, true], [other.id, false]]);
    assert.deepEqual(receipts, [true, false]);
    assert.equal((await outbox.get(record.id))?.state, "dispatched");
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(ids, [record.id, other.id], "stored once");
  } finally {
    await nc.close();
  }
});

Deno.test("createJetStreamRuntime: a re-publish is a duplicate even when other headers contain 'Nats-Msg-Id'", async () => {
  // nats-server 2.9 looks for the first occurrence of "Nats-Msg-Id" in the header block; a
  // header named X-Original-Nats-Msg-Id (or a value containing the text) written before ours
  // hid the id, and every re-publish was stored again. The runtime writes Nats-Msg-Id first.
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const event: PreparedEvent = {
      ...preparedEvent(`${stream.prefix}.a`),
      headers: { "X-Original-Nats-Msg-Id": "upstream-7", "X-Note": "copied from Nats-Msg-Id" },
    };
    const first = await runtime.publishPreparedEvent(event);
    const again = await runtime.publishPreparedEvent(event);
    assert.equal(first.duplicate, false);
    assert.equal(again.duplicate, true, "the duplicate window absorbed the re-publish");
    assert.deepEqual(await streamIds(nc, stream.name), [event.header.id]);
    const stored = await (await jetstreamManager(nc)).streams.getMessage(stream.name, { seq: 1 });
    assert.equal(stored?.header.get("X-Original-Nats-Msg-Id"), "upstream-7");
    assert.equal(stored?.header.get("X-Note"), "copied from Nats-Msg-Id");
  } finally {
    await nc.close();
  }
});

Deno.test("dispatchOutbox: no stream for the subject is retried with growing backoff, then dead after maxAttempts", async () => {
  const nc = await connectNats();
  try {
    const outbox = new InstrumentedOutbox();
    const [record] = events(uniqueName("nostream"), 1);
    await outbox.enqueue(record);
    const runtime = createJetStreamRuntime(jetstream(nc));
    const retry = { baseMs: 100, capMs: 10_000, maxAttempts: 5, random: () => 0.999_999 };
    let now = new Date("2030-01-01T00:00:00.000Z");
    const delays: number[] = [];
    for (let attempt = 1; attempt < retry.maxAttempts; attempt++) {
      const result = await dispatchOutbox(outbox, runtime, { now, retry });
      assert.equal(result.failed, 1, `attempt ${attempt} failed`);
      assert.equal(result.unavailable, 0, "no stream is not an outage");
      const stored = await outbox.get(record.id);
      assert.equal(stored?.state, "failed");
      assert.equal(stored?.attempts, attempt);
      assert.match(stored?.lastError ?? "", /^no_stream: /);
      const next = new Date(stored!.nextAttemptAt!);
      delays.push(next.getTime() - now.getTime());
      // Not due before nextAttemptAt.
      assert.equal(
        (await dispatchOutbox(outbox, runtime, { now: new Date(next.getTime() - 1), retry }))
          .claimed,
        0,
      );
      now = next;
    }
    assert.deepEqual(delays, [100, 200, 400, 800], "full-jitter ceiling doubles per attempt");
    const last = await dispatchOutbox(outbox, runtime, { now, retry });
    assert.equal(last.dead, 1);
    const stored = await outbox.get(record.id);
    assert.equal(stored?.state, "dead");
    assert.equal(stored?.attempts, 5);
    assert.match(stored?.lastError ?? "", /^gave up after 5 attempts: no_stream: /);
  } finally {
    await nc.close();
  }
});

Deno.test("dispatchOutbox: a failed mark after the PubAck is retried within the lease, nothing is published twice", async () => {
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const outbox = new InstrumentedOutbox();
    const records = events(stream.prefix, 10);
    await outbox.enqueueMany(records);
    outbox.failMarks = 3;
    const result = await dispatchOutbox(outbox, createJetStreamRuntime(jetstream(nc)));
    assert.equal(result.dispatched, 10);
    assert.equal(outbox.markManyCalls, 4, "three failed mark attempts, then success");
    assert.ok(outbox.all().every((message) => message.state === "dispatched"));
    const ids = await streamIds(nc, stream.name);
    assert.equal(ids.length, 10);
    assert.deepEqual(duplicatesOf(ids), []);
  } finally {
    await nc.close();
  }
});

Deno.test("createJetStreamRuntime: nats.js errors are classified by type", async () => {
  const nc = await connectNats();
  const runtime = createJetStreamRuntime(jetstream(nc));
  try {
    assert.equal(await runtime.probe(), true, "probe answers without publishing");
    const noStream = await runtime.publishPreparedEvent(preparedEvent(uniqueName("nostream")))
      .then(() => undefined, (error) => error);
    assert.ok(noStream instanceof OutboxPublishError);
    assert.equal(noStream.kind, "retryable");
    assert.equal(noStream.code, "no_stream");

    await using small = await createTestStream(nc, { max_msg_size: 100 });
    const tooBig = await runtime.publishPreparedEvent({
      ...preparedEvent(`${small.prefix}.a`),
      encodedPayload: JSON.stringify("x".repeat(500)),
    }).then(() => undefined, (error) => error);
    assert.ok(tooBig instanceof OutboxPublishError);
    assert.equal(tooBig.kind, "permanent");
    assert.equal(tooBig.code, "max_msg_size");

    const badSubject = await runtime.publishPreparedEvent(preparedEvent("has space"))
      .then(() => undefined, (error) => error);
    assert.ok(badSubject instanceof OutboxPublishError);
    assert.equal(badSubject.kind, "permanent");
    assert.equal(badSubject.code, "invalid_subject");
  } finally {
    await nc.close();
  }
  const closed = await runtime.publishPreparedEvent(preparedEvent("any.subject"))
    .then(() => undefined, (error) => error);
  assert.ok(closed instanceof OutboxPublishError);
  assert.equal(closed.kind, "unavailable");
  assert.equal(closed.code, "connection_closed");
  assert.equal(await runtime.probe(), false, "a closed connection does not answer");
  const plain = classifyJetStreamError(new TypeError("boom"));
  assert.equal(plain.kind, "retryable");
  assert.equal(plain.code, "publish_failed");
  assert.equal(classifyJetStreamError(plain), plain);
});
