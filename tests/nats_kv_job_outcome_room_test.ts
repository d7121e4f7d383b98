/**
 * A job outcome the NATS KV record has no room for. The store lets a record be enqueued up to
 * 2 KiB below the server's max_payload, and a job's outcome (up to 64 KiB) is written into the
 * record by its dispatched mark. Before the fix, a job near the limit whose handler returned a
 * large outcome failed its dispatched mark on every try (the record was larger than
 * max_payload): the dispatcher retried the mark until the lease ended, the message was claimed
 * again and the job ran again, forever. Now the dispatcher asks the store how much room a
 * claimed message has (`outcomeRoomBytes`) and sends such a job `dead` (code `outcome`) as it
 * does an outcome no store can keep; and the store refuses a dispatched mark that would not fit
 * by storing the message `dead` itself (`OutboxOutcomeRefusedError`), for callers that did not
 * ask first (a wrapper that hides the method, a direct `markDispatched`).
 */

import assert from "node:assert/strict";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { MeterProvider } from "@opentelemetry/sdk-metrics";
import {
  createOutboxBucket,
  type JsonValue,
  NatsKvOutboxRepository,
  OutboxDispatcher,
  type OutboxMessage,
  OutboxOutcomeRefusedError,
  type OutboxRecord,
  type OutboxRepository,
  type OutboxRuntime,
  OutboxValidationError,
} from "../mod.ts";
import { OutboxTelemetry } from "../telemetry.ts";
import { connectNats, NatsServer, sleep, uniqueName } from "./kit/mod.ts";
import { metricPoints, sum, TestReader } from "./helpers/metrics.ts";

const maxPayload = 16_384;

function job(id: string, payloadBytes = 0): OutboxRecord {
  return {
    id,
    kind: "job.submit",
    name: "render",
    subject: "jobs.render",
    payload: JSON.stringify({ blob: "p".repeat(payloadBytes) }),
    headers: {},
  };
}

/** An outcome of exactly `bytes` bytes of JSON (at least 11). */
function outcomeOf(bytes: number): JsonValue {
  return { blob: "o".repeat(bytes - 11) };
}

/**
 * Runs a dispatcher on `outbox` for `ms` (leases of 600 ms, retried often) whose job handler
 * returns a 4,000-byte outcome for the job `large` and a small one for any other: what ran, was
 * dispatched, went dead (with its lastError) and reached onError.
 */
async function runLargeAndSmall(outbox: NatsKvOutboxRepository, ms: number): Promise<{
  runs: Map<string, number>;
  dispatched: string[];
  dead: Map<string, string>;
  errors: unknown[];
}> {
  const runs = new Map<string, number>();
  const dispatched: string[] = [];
  const dead = new Map<string, string>();
  const errors: unknown[] = [];
  const dispatcher = new OutboxDispatcher(outbox, {
    publishPreparedEvent: () => Promise.reject(new Error("no events here")),
    dispatchJobSubmission: (message: OutboxMessage) => {
      runs.set(message.id, (runs.get(message.id) ?? 0) + 1);
      return Promise.resolve(message.id === "large" ? outcomeOf(4_000) : { ok: true });
    },
  }, {
    limit: 10,
    leaseMs: 600,
    idleRetryMs: 50,
    retry: { maxAttempts: 100 },
    onError: (error) => errors.push(error),
    onDispatched: (message) => dispatched.push(message.id),
    onDead: (message, info) => dead.set(message.id, info.lastError),
  });
  try {
    await sleep(ms);
  } finally {
    await dispatcher.stop();
  }
  return { runs, dispatched, dead, errors };
}

function jsonBytes(value: JsonValue): number {
  return new TextEncoder().encode(JSON.stringify(value)).length;
}

interface Fixture {
  nc: NatsConnection;
  bucket: string;
  outbox: NatsKvOutboxRepository;
  /** A job with the largest payload the store accepts (for its id's length). */
  nearJob(id: string): OutboxRecord;
}

/** A private server with a small max_payload, a bucket, and the largest job it accepts. */
async function withKv(test: (fixture: Fixture) => Promise<void>): Promise<void> {
  await using server = await NatsServer.start({ maxPayload });
  const nc = await connectNats(server.url);
  const bucket = uniqueName("kvo");
  const outbox = new NatsKvOutboxRepository(await createOutboxBucket(new Kvm(nc), bucket));
  try {
    // Found by enqueueing: those probes are jobs too, run by the dispatcher tests (no outcome).
    let low = 0;
    let high = maxPayload;
    while (low < high) {
      const mid = (low + high + 1) >>> 1;
      try {
        await outbox.enqueue(job(`probe-${mid}`, mid));
        low = mid;
      } catch {
        high = mid - 1;
      }
    }
    assert.ok(low > maxPayload - 3_000, `largest accepted payload ${low}`);
    const probeId = `probe-${low}`;
    const nearJob = (id: string) => job(id, low + probeId.length - id.length);
    await test({ nc, bucket, outbox, nearJob });
  } finally {
    await outbox.close();
    await nc.close();
  }
}

/** The sum of a counter's points whose attributes include `filter`. */
async function counted(
  reader: TestReader,
  name: string,
  filter: Record<string, string> = {},
): Promise<number> {
  return sum((await metricPoints(reader)).get(name), filter);
}

/**
 * Runs a dispatcher on `repository` (telemetry hooks counting next to the test's) for a few
 * leases, so a message whose mark keeps failing would be claimed and run again; then checks that
 * every job ran once, the `refused` ones are dead with code `outcome` (stored, hooked and counted
 * alike; `refusedBy` tells whose text the stored `lastError` is: the dispatcher's, which asked
 * first, or the store's), the others dispatched with their outcome, nothing reached `onError`.
 */
async function dispatchAndCheck(
  outbox: NatsKvOutboxRepository,
  repository: OutboxRepository,
  outcomes: Record<string, JsonValue>,
  refused: string[],
  refusedBy: RegExp,
): Promise<void> {
  const reader = new TestReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const telemetry = new OutboxTelemetry({ meterProvider });
  const runs = new Map<string, number>();
  const dispatched: string[] = [];
  const dead = new Map<string, string>();
  const errors: unknown[] = [];
  const runtime: OutboxRuntime = {
    publishPreparedEvent: () => Promise.reject(new Error("no events here")),
    dispatchJobSubmission: (message: OutboxMessage) => {
      runs.set(message.id, (runs.get(message.id) ?? 0) + 1);
      return Promise.resolve(outcomes[message.id]);
    },
  };
  const leaseMs = 1_500;
  const dispatcher = new OutboxDispatcher(repository, runtime, {
    limit: 100,
    leaseMs,
    idleRetryMs: 50,
    retry: { maxAttempts: 100 },
    onError: (error) => errors.push(error),
    onDispatched: (message, info) => {
      telemetry.hooks.onDispatched(message, info);
      if (message.id in outcomes) dispatched.push(message.id);
    },
    onDead: (message, info) => {
      telemetry.hooks.onDead(message, info);
      dead.set(message.id, info.lastError);
    },
  });
  try {
    // Until every job is settled (never, before the fix: bounded by four leases), then two more
    // leases in which nothing may run again.
    const ids = Object.keys(outcomes);
    for (const deadline = Date.now() + leaseMs * 4; Date.now() < deadline; await sleep(50)) {
      const states = await Promise.all(ids.map(async (id) => (await outbox.get(id))?.state));
      if (states.every((state) => state === "dispatched" || state === "dead")) break;
    }
    await sleep(leaseMs * 2);
  } finally {
    await dispatcher.stop();
  }
  try {
    const ids = Object.keys(outcomes);
    assert.deepEqual(
      Object.fromEntries(ids.map((id) => [id, runs.get(id) ?? 0])),
      Object.fromEntries(ids.map((id) => [id, 1])),
      "every job ran once",
    );
    assert.deepEqual(errors, []);
    for (const id of refused) {
      const message = await outbox.get(id);
      assert.equal(message?.state, "dead", id);
      assert.equal(message?.outcome, undefined, id);
      assert.match(message?.lastError ?? "", /^outcome: the job's outcome cannot be stored: /, id);
      assert.match(message?.lastError ?? "", refusedBy, id);
      assert.equal(dead.get(id), message?.lastError, `${id}: onDead sees what was stored`);
    }
    assert.deepEqual([...dead.keys()].toSorted(), refused.toSorted(), "only those are dead");
    const fine = ids.filter((id) => !refused.includes(id));
    for (const id of fine) {
      const message = await outbox.get(id);
      assert.equal(message?.state, "dispatched", id);
      assert.deepEqual(message?.outcome, outcomes[id], id);
    }
    assert.deepEqual(dispatched.toSorted(), fine.toSorted(), "onDispatched for the others only");
    assert.equal(
      await counted(reader, "outbox.messages.dead", { "error.type": "outcome" }),
      refused.length,
    );
    assert.equal(await counted(reader, "outbox.messages.dead"), refused.length);
    // The probes found by withKv are dispatched too (no outcome).
    const probes = (await counted(reader, "outbox.messages.dispatched")) - fine.length;
    assert.ok(probes > 0 && probes < 20, `probes ${probes}`);
    assert.equal((await outbox.claimDue(100, new Date(Date.now() + 60_000))).length, 0);
  } finally {
    await meterProvider.shutdown();
  }
}

Deno.test("nats kv: a job near max_payload whose outcome does not fit goes dead once; the rest of its batch is settled", async () => {
  await withKv(async ({ outbox, nearJob }) => {
    const outcomes: Record<string, JsonValue> = {
      "near-large": outcomeOf(8_000), // under 64 KiB, but not next to this payload
      "near-fits": outcomeOf(1_000), // fits in the headroom kept at enqueue
      "small-large": outcomeOf(12_000), // a small job has room for a large outcome
      "small": { ok: true },
    };
    await outbox.enqueueMany([
      nearJob("near-large"),
      nearJob("near-fits"),
      job("small-large"),
      job("small"),
    ]);
    // Through telemetry's repository wrapper, which must pass outcomeRoomBytes on.
    const instrumented = new OutboxTelemetry().instrumentOutbox(outbox);
    await dispatchAndCheck(
      outbox,
      instrumented,
      outcomes,
      ["near-large"],
      /more than the \d+ bytes the store has room for next to this message$/,
    );
  });
});

Deno.test("nats kv: a store that is not asked first refuses the outcomes itself; the dispatcher records them dead", async () => {
  await withKv(async ({ outbox, nearJob }) => {
    const outcomes: Record<string, JsonValue> = {
      "near-large-1": outcomeOf(8_000),
      "near-large-2": outcomeOf(30_000),
      "small-too-large": outcomeOf(20_000), // over max_payload whatever the payload
      "near-fits": outcomeOf(1_000),
      "small": { ok: true },
    };
    await outbox.enqueueMany([
      nearJob("near-large-1"),
      nearJob("near-fits"),
      nearJob("near-large-2"),
      job("small-too-large"),
      job("small"),
    ]);
    // A wrapper that forwards the required methods and markMany only (as a user's might).
    const hiding: OutboxRepository = {
      enqueue: (record, options) => outbox.enqueue(record, options),
      enqueueMany: (records, options) => outbox.enqueueMany(records, options),
      get: (id) => outbox.get(id),
      claimDue: (limit, now, options) => outbox.claimDue(limit, now, options),
      markDispatched: (claim, now, outcome, options) =>
        outbox.markDispatched(claim, now, outcome, options),
      markFailed: (claim, failure) => outbox.markFailed(claim, failure),
      markDead: (claim, dead) => outbox.markDead(claim, dead),
      markMany: (marks, now) => outbox.markMany(marks, now),
    };
    await dispatchAndCheck(
      outbox,
      hiding,
      outcomes,
      ["near-large-1", "near-large-2", "small-too-large"],
      /more than the \d+ bytes its NATS KV record has room for below the server's max_payload \(16384\)$/,
    );
  });
});

Deno.test("nats kv: outcomeRoomBytes is exact for the repository's own claims; a mark over it stores the message dead and says so", async () => {
  await withKv(async ({ nc, bucket, outbox, nearJob }) => {
    await outbox.claimDue(100, new Date()).then((probes) =>
      outbox.markMany(probes.map((claim) => ({ claim, state: "dispatched" })), new Date())
    );
    await outbox.enqueueMany([
      nearJob("exact"),
      nearJob("over"),
      job("batch-ok"),
      nearJob("batch-over"),
    ]);
    const claimed = new Map(
      (await outbox.claimDue(10, new Date())).map((message) => [message.id, message]),
    );
    assert.equal(claimed.size, 4);
    const room = outbox.outcomeRoomBytes(claimed.get("exact")!)!;
    assert.ok(room > 1_000 && room < 2_048, `room ${room}`);
    // (The same size but for the digits of their enqueue positions.)
    const overRoom = outbox.outcomeRoomBytes(claimed.get("over")!)!;
    assert.ok(Math.abs(overRoom - room) <= 1, `${overRoom} next to ${room}`);
    const small = outbox.outcomeRoomBytes(claimed.get("batch-ok")!)!;
    assert.ok(small > maxPayload - 1_000, `room of a small job ${small}`);

    // Another repository's claim: a bound from below, close to the exact room.
    const peer = new NatsKvOutboxRepository(await new Kvm(nc).open(bucket));
    try {
      const bound = peer.outcomeRoomBytes(claimed.get("exact")!)!;
      assert.ok(bound <= room && bound >= room - 32, `bound ${bound}, exact ${room}`);
    } finally {
      await peer.close();
    }

    // Exactly the room fits.
    const fits = outcomeOf(room);
    assert.equal(jsonBytes(fits), room);
    assert.equal(await outbox.markDispatched(claimed.get("exact")!, new Date(), fits), true);
    assert.deepEqual((await outbox.get("exact"))?.outcome, fits);

    // One byte more is refused: the message is stored dead, the caller is told.
    const over = claimed.get("over")!;
    const refusal = (error: unknown) => {
      assert.ok(error instanceof OutboxOutcomeRefusedError);
      assert.equal(error.id, "over");
      assert.match(
        error.lastError,
        new RegExp(
          `^outcome: the job's outcome cannot be stored: Outbox outcome is ${
            overRoom + 1
          } bytes of JSON, more than the ${overRoom} bytes its NATS KV record has room for below the server's max_payload \\(${maxPayload}\\)$`,
        ),
      );
      return true;
    };
    await assert.rejects(
      outbox.markDispatched(over, new Date(), outcomeOf(overRoom + 1)),
      refusal,
    );
    const stored = await outbox.get("over");
    assert.equal(stored?.state, "dead");
    assert.equal(stored?.outcome, undefined);
    const lastError = stored?.lastError ?? "";
    // The same mark again says so again; a dead mark of the claim reports true, changes nothing.
    await assert.rejects(
      outbox.markDispatched(over, new Date(), outcomeOf(overRoom + 1)),
      refusal,
    );
    assert.equal(await outbox.markDead(over, { error: "other", now: new Date() }), true);
    assert.equal((await outbox.get("over"))?.lastError, lastError);

    // markMany settles the others, then throws; the same marks again: the same.
    const marks = [
      { claim: claimed.get("batch-ok")!, state: "dispatched" as const, outcome: { ok: 1 } },
      {
        claim: claimed.get("batch-over")!,
        state: "dispatched" as const,
        outcome: outcomeOf(outbox.outcomeRoomBytes(claimed.get("batch-over")!)! + 1),
      },
    ];
    for (let round = 0; round < 2; round++) {
      await assert.rejects(outbox.markMany(marks, new Date()), (error: unknown) => {
        assert.ok(error instanceof OutboxOutcomeRefusedError);
        assert.equal(error.id, "batch-over");
        return true;
      });
    }
    assert.equal((await outbox.get("batch-ok"))?.state, "dispatched");
    assert.equal((await outbox.get("batch-over"))?.state, "dead");
    const recorded = [marks[0], { claim: marks[1].claim, state: "dead" as const, error: "x" }];
    assert.deepEqual(await outbox.markMany(recorded, new Date()), [true, true]);
    // Nothing is claimed (and run) again once the leases are over.
    const later = await outbox.claimDue(10, new Date(Date.now() + 120_000));
    assert.deepEqual(later.map((message) => message.id), []);
  });
});

Deno.test("nats kv: a bucket whose max_msg_size is below max_payload refuses an outcome too large for it once, instead of looping", async () => {
  await using server = await NatsServer.start({ maxPayload });
  const nc = await connectNats(server.url);
  const bucket = uniqueName("kvo");
  const kv = await createOutboxBucket(new Kvm(nc), bucket);
  // The bucket's maxValueSize (the stream's max_msg_size) is lowered below the server's
  // max_payload after the repository read it (at its first enqueue): the record of a job below
  // it, whose outcome fits max_payload but not the bucket. Only the server's refusal tells.
  const outbox = new NatsKvOutboxRepository(kv);
  const jsm = await jetstreamManager(nc);
  try {
    await outbox.enqueueMany([job("direct", 5_000), job("large", 5_000), job("small", 10)]);
    const { config } = await jsm.streams.info(`KV_${bucket}`);
    await jsm.streams.update(`KV_${bucket}`, { ...config, max_msg_size: 8_192 });

    // Directly: the mark is refused, the message stored dead, and the same mark says so again.
    const [direct] = await outbox.claimDue(1, new Date());
    assert.equal(direct.id, "direct");
    assert.ok(outbox.outcomeRoomBytes(direct)! > 4_000, "max_payload leaves room for it");
    for (let round = 0; round < 2; round++) {
      await assert.rejects(
        outbox.markDispatched(direct, new Date(), outcomeOf(4_000)),
        (error: unknown) => {
          assert.ok(error instanceof OutboxOutcomeRefusedError, String(error));
          assert.match(error.lastError, /^outcome: the job's outcome cannot be stored: /);
          return true;
        },
      );
    }
    assert.equal((await outbox.get("direct"))?.state, "dead");

    // Through a dispatcher, for a few leases: the job runs once and goes dead, the other one
    // of its batch is dispatched.
    const { runs, dispatched, dead, errors } = await runLargeAndSmall(outbox, 3_000);
    assert.deepEqual(Object.fromEntries(runs), { large: 1, small: 1 });
    assert.deepEqual(errors, []);
    assert.deepEqual([...dead.keys()], ["large"]);
    assert.deepEqual(dispatched, ["small"]);
    const large = await outbox.get("large");
    assert.equal(large?.state, "dead");
    assert.match(large?.lastError ?? "", /^outcome: the job's outcome cannot be stored: /);
  } finally {
    await outbox.close();
    await nc.close();
  }
});

Deno.test("nats kv: on a KV object that does not tell the server's max_payload, a mark the client refuses as too large stores the message dead", async () => {
  await using server = await NatsServer.start({ maxPayload });
  const nc = await connectNats(server.url);
  const bucket = await createOutboxBucket(new Kvm(nc), uniqueName("kvo"));
  // A wrapper of the bucket (as a tracing or metrics layer might be) without its `js`: the
  // repository cannot read max_payload, so nothing is refused before the write.
  const kv = new Proxy(bucket, {
    get(target, property) {
      if (property === "js") return undefined;
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  const outbox = new NatsKvOutboxRepository(kv);
  try {
    await outbox.enqueue(job("blind", 8_000));
    const [claimed] = await outbox.claimDue(1, new Date());
    assert.equal(outbox.outcomeRoomBytes(claimed), undefined);
    for (let round = 0; round < 2; round++) {
      await assert.rejects(
        outbox.markDispatched(claimed, new Date(), outcomeOf(10_000)),
        (error: unknown) => {
          assert.ok(error instanceof OutboxOutcomeRefusedError, String(error));
          assert.match(error.lastError, /max_payload/);
          return true;
        },
      );
    }
    const stored = await outbox.get("blind");
    assert.equal(stored?.state, "dead");
    assert.equal(stored?.outcome, undefined);
    assert.deepEqual(await outbox.claimDue(1, new Date(Date.now() + 120_000)), []);
  } finally {
    await outbox.close();
    await nc.close();
  }
});

Deno.test("nats kv: a bucket's own max_msg_size counts like max_payload: enqueue refuses a record no mark could rewrite, and the dispatcher asks with it", async () => {
  await using server = await NatsServer.start({ maxPayload });
  const nc = await connectNats(server.url);
  const bucket = uniqueName("kvm");
  const kv = await createOutboxBucket(new Kvm(nc), bucket);
  const jsm = await jetstreamManager(nc);
  const { config } = await jsm.streams.info(`KV_${bucket}`);
  await jsm.streams.update(`KV_${bucket}`, { ...config, max_msg_size: 8_192 });
  const outbox = new NatsKvOutboxRepository(kv);
  try {
    // Below max_payload (16 KiB) but within 2 KiB of the bucket's 8 KiB: a claim or a failed
    // mark could not rewrite it, so it is refused at once, for the bucket's limit.
    await assert.rejects(
      outbox.enqueue(job("near", 7_000)),
      (error: unknown) => {
        assert.ok(error instanceof OutboxValidationError, String(error));
        assert.match(error.message, /below the bucket's max_msg_size \(8192\)/);
        return true;
      },
    );
    await assert.rejects(outbox.enqueueMany([job("near-many", 7_000)]), OutboxValidationError);
    assert.equal(await outbox.get("near"), undefined);
    assert.equal(await outbox.get("near-many"), undefined);

    await outbox.enqueueMany([job("large", 5_000), job("small", 10)]);
    const { runs, dead, errors } = await runLargeAndSmall(outbox, 2_000);
    assert.deepEqual(Object.fromEntries(runs), { large: 1, small: 1 });
    assert.deepEqual(errors, []);
    // The dispatcher asked first: the room it was told is the bucket's, not max_payload's.
    assert.match(dead.get("large") ?? "", /the store has room for next to this message/);
    assert.equal((await outbox.get("large"))?.state, "dead");
    assert.equal((await outbox.get("small"))?.state, "dispatched");
  } finally {
    await outbox.close();
    await nc.close();
  }
});
