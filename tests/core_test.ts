/**
 * The core without any store: validation, prepared-event conversion, retry policy, timestamps.
 */

import assert from "node:assert/strict";
import {
  backoffCeilingMs,
  backoffDelayMs,
  errorMessage,
  OutboxCorruptRecordError,
  type OutboxMessage,
  outboxMessageToPreparedEvent,
  OutboxValidationError,
  preparedTrellisEventToOutboxRecord,
  resolveInboxRecordOptions,
  resolveRetryPolicy,
  sameOutboxContent,
  toIsoTimestamp,
  validateOutboxRecord,
  validateSubject,
} from "../mod.ts";

const base = {
  id: "m-1",
  kind: "event.publish",
  name: "n",
  subject: "a.b",
  payload: "{}",
  headers: {},
} as const;

function message(overrides: Partial<OutboxMessage> = {}): OutboxMessage {
  return {
    ...base,
    headers: {},
    state: "claimed",
    attempts: 1,
    createdAt: "2026-01-01T00:00:00.000Z",
    updatedAt: "2026-01-01T00:00:00.000Z",
    ...overrides,
  };
}

Deno.test("validateOutboxRecord returns a detached copy", () => {
  const headers = { "X-A": "1" };
  const record = validateOutboxRecord({ ...base, headers });
  headers["X-A"] = "2";
  assert.equal(record.headers["X-A"], "1");
  assert.deepEqual(validateOutboxRecord({ ...base, headers: undefined }).headers, {});
});

Deno.test("validateOutboxRecord rejects non-objects and names the field", () => {
  for (const input of [null, undefined, "x", 1, []]) {
    assert.throws(() => validateOutboxRecord(input), OutboxValidationError);
  }
  assert.throws(
    () => validateOutboxRecord({ ...base, headers: [] }),
    (error: OutboxValidationError) => error.field === "headers",
  );
  assert.throws(
    () => validateOutboxRecord({ ...base, id: "\ud800" }),
    (error: OutboxValidationError) => error.field === "id" && /surrogate/.test(error.message),
  );
  // Lower-case Nats-Msg-Id must also equal the id.
  assert.throws(
    () => validateOutboxRecord({ ...base, headers: { "nats-msg-id": "x" } }),
    (error: OutboxValidationError) => error.field === "headers.nats-msg-id",
  );
  assert.doesNotThrow(() => validateOutboxRecord({ ...base, headers: { "Nats-Msg-Id": "m-1" } }));
});

Deno.test("ids with leading or trailing whitespace are rejected: NATS trims header values, so JetStream would take ' a' for 'a'", () => {
  for (const id of [" a", "a ", "\ta", "a\t", "\u00a0a", "a\u3000", "\ufeffa", " "]) {
    assert.throws(
      () => validateOutboxRecord({ ...base, id }),
      (error: OutboxValidationError) => error.field === "id" && /whitespace/.test(error.message),
      JSON.stringify(id),
    );
  }
  assert.doesNotThrow(() => validateOutboxRecord({ ...base, id: "a b\tc d" }), "inner whitespace");
});

Deno.test("id length is measured in UTF-8 bytes", () => {
  assert.doesNotThrow(() => validateOutboxRecord({ ...base, id: "a".repeat(2048) }));
  assert.throws(() => validateOutboxRecord({ ...base, id: "a".repeat(2049) }), /2048 bytes/);
  assert.doesNotThrow(() => validateOutboxRecord({ ...base, id: "é".repeat(1024) }));
  assert.throws(() => validateOutboxRecord({ ...base, id: "é".repeat(1025) }), /2048 bytes/);
  assert.doesNotThrow(() => validateOutboxRecord({ ...base, id: "🚀".repeat(512) }));
  assert.throws(() => validateOutboxRecord({ ...base, id: "🚀".repeat(513) }), /2048 bytes/);
});

Deno.test("validateSubject accepts literal subjects only", () => {
  for (const ok of ["a", "a.b.c", "a*b.c", "orders.>x", "ünïcødé.x", "A-Z_0-9.$x"]) {
    assert.equal(validateSubject(ok), ok);
  }
  for (const bad of ["", " ", "a b", "a\tb", "a.", ".a", "a..b", "*", "a.*.b", ">", "a.>", 7]) {
    assert.throws(() => validateSubject(bad), OutboxValidationError, String(bad));
  }
  assert.throws(() => validateSubject("a\u0001b"), /control/);
  assert.throws(() => validateSubject("a".repeat(1025)), /1024 bytes/);
});

Deno.test("sameOutboxContent ignores header order and nothing else", () => {
  const a = { ...base, headers: { x: "1", y: "2" } };
  assert.equal(sameOutboxContent(a, { ...a, headers: { y: "2", x: "1" } }), true);
  assert.equal(sameOutboxContent(a, { ...a, headers: { x: "1", z: "2" } }), false);
  assert.equal(sameOutboxContent(a, { ...a, id: "other" }), true, "the id is not content");
});

Deno.test("prepared events round-trip through outbox records", () => {
  const event = {
    event: "order.created",
    descriptorIdentity: "orders/created@v1",
    subject: "orders.created",
    header: { id: "evt-1", time: "2026-01-01T00:00:00.000Z" },
    payload: { orderId: 42 },
    encodedPayload: '{"orderId":42}',
    headers: { "X-Tenant": "t1" },
  };
  const record = preparedTrellisEventToOutboxRecord(event);
  assert.deepEqual(record.headers, {
    "X-Tenant": "t1",
    "Nats-Msg-Id": "evt-1",
    "Trellis-Event-Time": "2026-01-01T00:00:00.000Z",
    "Trellis-Event-Descriptor": "orders/created@v1",
  });
  const back = outboxMessageToPreparedEvent(message({ ...record }));
  assert.equal(back.descriptorIdentity, "orders/created@v1");
  assert.deepEqual(back.header, event.header);
  assert.deepEqual(back.payload, event.payload);
  assert.equal(back.encodedPayload, event.encodedPayload);
});

Deno.test("the descriptor is optional and absent when the event has none", () => {
  const record = preparedTrellisEventToOutboxRecord({
    event: "e",
    subject: "a.b",
    header: { id: "evt-2", time: "2026-01-01T00:00:00.000Z" },
    payload: null,
    encodedPayload: "null",
    headers: {},
  });
  assert.equal("Trellis-Event-Descriptor" in record.headers, false);
  const back = outboxMessageToPreparedEvent(message({ ...record }));
  assert.equal("descriptorIdentity" in back, false);
});

Deno.test("reading accepts lower-case header names and falls back to id and createdAt", () => {
  const lower = outboxMessageToPreparedEvent(message({
    headers: {
      "nats-msg-id": "m-1",
      "trellis-event-time": "2026-02-02T00:00:00.000Z",
      "trellis-event-descriptor": "d",
    },
  }));
  assert.deepEqual(lower.header, { id: "m-1", time: "2026-02-02T00:00:00.000Z" });
  assert.equal(lower.descriptorIdentity, "d");
  const bare = outboxMessageToPreparedEvent(message());
  assert.deepEqual(bare.header, { id: "m-1", time: "2026-01-01T00:00:00.000Z" });
});

Deno.test("undecodable messages raise OutboxCorruptRecordError", () => {
  assert.throws(
    () => outboxMessageToPreparedEvent(message({ payload: "{not json" })),
    (error: OutboxCorruptRecordError) =>
      error instanceof OutboxCorruptRecordError && error.id === "m-1" &&
      error.cause instanceof SyntaxError && /not valid JSON/.test(error.message),
  );
  assert.throws(
    () => outboxMessageToPreparedEvent(message({ kind: "job.create" })),
    OutboxCorruptRecordError,
  );
});

Deno.test("backoff grows exponentially up to the cap, with full jitter", () => {
  const policy = resolveRetryPolicy({ baseMs: 100, capMs: 1_000, random: () => 0.999999 });
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6, 60].map((n) => backoffCeilingMs(n, policy)),
    [100, 200, 400, 800, 1_000, 1_000, 1_000],
  );
  assert.deepEqual([1, 2, 3, 5].map((n) => backoffDelayMs(n, policy)), [100, 200, 400, 1_000]);
  const low = resolveRetryPolicy({ baseMs: 100, capMs: 1_000, random: () => 0 });
  assert.equal(backoffDelayMs(4, low), 0);
  assert.equal(resolveRetryPolicy().maxAttempts, 10);
  assert.equal(resolveRetryPolicy({ baseMs: 600_000 }).capMs, 600_000);
});

Deno.test("retry policies are checked", () => {
  for (
    const bad of [{ baseMs: -1 }, { capMs: Infinity }, { maxAttempts: 0 }, { maxAttempts: 1.5 }, {
      baseMs: 10,
      capMs: 5,
    }]
  ) {
    assert.throws(() => resolveRetryPolicy(bad), OutboxValidationError, JSON.stringify(bad));
  }
});

Deno.test("toIsoTimestamp normalises what drivers return", () => {
  const iso = "2026-01-02T03:04:05.006Z";
  assert.equal(toIsoTimestamp(new Date(iso)), iso);
  assert.equal(toIsoTimestamp(iso), iso);
  assert.equal(toIsoTimestamp("2026-01-02 03:04:05.006+00"), iso);
  assert.equal(toIsoTimestamp("2026-01-02T04:04:05.006+01:00"), iso);
  assert.equal(toIsoTimestamp(Date.parse(iso)), iso);
  assert.equal(toIsoTimestamp(BigInt(Date.parse(iso))), iso);
  for (const bad of ["yesterday", "2026-13-45T00:00:00.000Z", null, undefined, {}, NaN]) {
    assert.equal(toIsoTimestamp(bad), undefined, String(bad));
  }
});

Deno.test("inbox options: a Date, an options object, or nothing", () => {
  const now = new Date("2026-01-01T00:00:00.000Z");
  assert.deepEqual(resolveInboxRecordOptions("a", now), { now, consumer: "" });
  assert.deepEqual(resolveInboxRecordOptions("a", { now, consumer: "c" }), { now, consumer: "c" });
  assert.equal(resolveInboxRecordOptions("a").consumer, "");
  assert.throws(() => resolveInboxRecordOptions("a", new Date(NaN)), OutboxValidationError);
  assert.throws(() => resolveInboxRecordOptions("a\u0000b"), OutboxValidationError);
});

Deno.test("errorMessage gives one line for anything thrown", () => {
  assert.equal(errorMessage(new TypeError("boom")), "TypeError: boom");
  assert.equal(errorMessage(new Error("plain")), "plain");
  assert.equal(errorMessage("text"), "text");
  assert.equal(errorMessage({ code: 1 }), '{"code":1}');
  assert.equal(errorMessage(undefined), "undefined");
});

Deno.test("toIsoTimestamp reads SQL text forms", () => {
  assert.equal(toIsoTimestamp("2026-01-02 03:04:05"), "2026-01-02T03:04:05.000Z");
  assert.equal(toIsoTimestamp("2026-01-02 08:34:05.5+05:30"), "2026-01-02T03:04:05.500Z");
  assert.equal(toIsoTimestamp("2026-01-02 03:04:05.123456+00"), "2026-01-02T03:04:05.123Z");
  assert.equal(toIsoTimestamp("2026-01-02T03:04:05Z"), "2026-01-02T03:04:05.000Z");
});

Deno.test("src/version.ts matches deno.json", async () => {
  const { packageName, packageVersion } = await import("../src/version.ts");
  const config = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
  assert.equal(packageName, config.name);
  assert.equal(packageVersion, config.version);
});
