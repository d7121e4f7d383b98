/** Decoding rows as real drivers return them, and rejecting what cannot be decoded. */

import assert from "node:assert/strict";
import postgres from "postgres";
import { decodeOutboxRow, decodeOutboxRowLoosely } from "../src/stores/sql/decode.ts";
import {
  migrate,
  type OutboxValidationError,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { createTestDatabase } from "./kit/mod.ts";

const base = {
  seq: 1,
  id: "m-1",
  kind: "event.publish",
  name: "n",
  subject: "s.a",
  payload: "{}",
  headers: '{"X-A":"1"}',
  state: "claimed",
  attempts: 2,
  created_at: "2026-01-01T00:00:00.000Z",
  updated_at: "2026-01-01T00:00:01.000Z",
  next_attempt_at: "2026-01-01T00:00:31.000Z",
  last_error: null,
  outcome: null,
};

Deno.test("decode accepts Date or text timestamps, number/bigint/numeric text, JSON text or objects", () => {
  const expected = decodeOutboxRow(base);
  assert.equal(expected.createdAt, "2026-01-01T00:00:00.000Z");
  const variants = [
    { created_at: new Date("2026-01-01T00:00:00Z"), updated_at: new Date("2026-01-01T00:00:01Z") },
    { created_at: "2026-01-01 00:00:00+00", updated_at: "2026-01-01T00:00:01Z" },
    { attempts: 2n },
    { attempts: "2" },
    { headers: { "X-A": "1" } },
    { headers: JSON.stringify('{"X-A":"1"}') }, // the reference on postgres.js: jsonb string
    { headers: new TextEncoder().encode('{"X-A":"1"}') },
    { next_attempt_at: new Date("2026-01-01T00:00:31Z") },
    { next_attempt_at: Date.parse("2026-01-01T00:00:31Z") },
  ];
  for (const variant of variants) {
    assert.deepEqual(
      decodeOutboxRow({ ...base, ...variant }),
      expected,
      JSON.stringify(variant, (_, v) => typeof v === "bigint" ? `${v}n` : v),
    );
  }
  const outcomes: Array<[unknown, unknown]> = [
    ['{"kind":"accepted"}', { kind: "accepted" }],
    [{ kind: "accepted" }, { kind: "accepted" }],
    ["null", null],
    ['"accepted"', "accepted"],
    [JSON.stringify('{"kind":"accepted"}'), { kind: "accepted" }],
    ["[1,2]", [1, 2]],
  ];
  for (const [stored, outcome] of outcomes) {
    assert.deepEqual(decodeOutboxRow({ ...base, outcome: stored }).outcome, outcome);
  }
  const object = { kind: "x" };
  const decoded = decodeOutboxRow({ ...base, outcome: object });
  assert.notEqual(decoded.outcome, object, "driver objects are copied");
});

Deno.test("undecodable rows throw OutboxCorruptRecordError naming the problem", () => {
  const bad: Array<[Record<string, unknown>, RegExp]> = [
    [{ headers: "{not json" }, /headers is not valid JSON/],
    [{ headers: "[1]" }, /headers is not a JSON object/],
    [{ headers: '{"a":1}' }, /header "a" is not a string/],
    [{ kind: "event.bogus" }, /unknown kind/],
    [{ state: "weird" }, /unknown state/],
    [{ attempts: "two" }, /attempts/],
    [{ attempts: 1.5 }, /attempts/],
    [{ created_at: "yesterday" }, /created_at/],
    [{ payload: null }, /payload is NULL/],
    [{ outcome: "{oops" }, /outcome is not valid JSON/],
    [{ id: 7 }, /id is number/],
  ];
  for (const [change, pattern] of bad) {
    assert.throws(() => decodeOutboxRow({ ...base, ...change }), (error: Error) => {
      assert.equal(error.name, "OutboxCorruptRecordError");
      assert.match(error.message, /^Corrupt outbox record/);
      assert.match(error.message, pattern);
      return true;
    });
  }
});

Deno.test("loose decoding shows what it can of a corrupt row", () => {
  const message = decodeOutboxRowLoosely({
    ...base,
    state: "dead",
    kind: "event.bogus",
    headers: "{not json",
    last_error: "Corrupt outbox record 'm-1': headers is not valid JSON",
  });
  assert.equal(message.id, "m-1");
  assert.equal(message.state, "dead");
  assert.deepEqual(message.headers, {});
  assert.equal(message.kind, "event.bogus");
  assert.match(message.lastError ?? "", /Corrupt/);
});

Deno.test("a driver that renames columns fails the claim instead of dead-lettering every row", async () => {
  const database = await createTestDatabase();
  const plain = postgres(database.url, { max: 1, onnotice: () => {} });
  const camel = postgres(database.url, { max: 1, onnotice: () => {}, transform: postgres.camel });
  try {
    await migrate(postgresJsExecutor(plain), { dialect: "postgres" });
    const outbox = new SqlOutboxRepository(postgresJsExecutor(plain), "postgres");
    await outbox.enqueue({
      id: "camel-1",
      kind: "event.publish",
      name: "n",
      subject: "a.b",
      payload: "{}",
      headers: {},
    });
    const renamed = new SqlOutboxRepository(postgresJsExecutor(camel), "postgres");
    await assert.rejects(
      renamed.claimDue(10, new Date()),
      (error: OutboxValidationError) =>
        error.field === "executor" && /created_at/.test(error.message),
    );
    const stored = await outbox.get("camel-1");
    assert.equal(stored?.state, "claimed", "leased, claimed again later; not dead");
  } finally {
    await plain.end();
    await camel.end();
    await database[Symbol.asyncDispose]();
  }
});
