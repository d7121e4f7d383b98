/**
 * The shapes the NATS KV stores accept when they read an entry back: a valid record, marker and
 * inbox entry decode; every malformed field is reported with its path, so the entry is treated
 * as corrupt instead of trusted.
 */

import assert from "node:assert/strict";
import {
  decodeInboxEntry,
  decodeMarker,
  decodeRecord,
  storedRecordProblem,
} from "../src/stores/nats_kv/records.ts";

const encode = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));
const at = "2026-01-02T03:04:05.006Z";
const valid = {
  v: 1,
  id: "m-1",
  kind: "event.publish",
  name: "order.created",
  subject: "orders.created",
  payload: "{}",
  headers: { "X-Tenant": "t1" },
  state: "claimed",
  attempts: 1,
  createdAt: at,
  updatedAt: at,
  nextAttemptAt: at,
  lastError: "boom",
  outcome: { anything: [1, "two"] },
  seq: 7,
};

Deno.test("nats kv records: a valid record decodes, extra properties are allowed", () => {
  assert.equal(storedRecordProblem(valid), undefined);
  assert.equal(storedRecordProblem({ ...valid, extra: true }), undefined);
  const { nextAttemptAt: _n, lastError: _l, outcome: _o, seq: _s, ...minimal } = valid;
  assert.equal(storedRecordProblem({ ...minimal, state: "pending" }), undefined);
  const decoded = decodeRecord(encode(valid), "m-1");
  assert.ok(decoded.ok);
});

Deno.test("nats kv records: every malformed field is named", () => {
  const cases: Array<[Record<string, unknown> | unknown, string]> = [
    [null, "/ must be an object"],
    [[valid], "/ must be an object"],
    [{ ...valid, v: 2 }, "/v "],
    [{ ...valid, id: "" }, "/id "],
    [{ ...valid, id: 1 }, "/id "],
    [{ ...valid, kind: "event" }, "/kind "],
    [{ ...valid, name: null }, "/name "],
    [{ ...valid, subject: "" }, "/subject "],
    [{ ...valid, payload: {} }, "/payload "],
    [{ ...valid, headers: [] }, "/headers "],
    [{ ...valid, headers: { a: 1 } }, "/headers/a "],
    [{ ...valid, state: "done" }, "/state "],
    [{ ...valid, attempts: -1 }, "/attempts "],
    [{ ...valid, attempts: 1.5 }, "/attempts "],
    [{ ...valid, createdAt: "2026-01-02" }, "/createdAt "],
    [{ ...valid, updatedAt: 0 }, "/updatedAt "],
    [{ ...valid, nextAttemptAt: "2026-01-02 03:04:05" }, "/nextAttemptAt "],
    [{ ...valid, lastError: 1 }, "/lastError "],
    [{ ...valid, seq: 0 }, "/seq "],
  ];
  for (const [raw, expected] of cases) {
    const problem = storedRecordProblem(raw);
    assert.ok(problem?.startsWith(expected), `${JSON.stringify(raw)}: ${problem}`);
    const decoded = decodeRecord(encode(raw));
    assert.equal(decoded.ok, false);
  }
});

Deno.test("nats kv records: markers and inbox entries", () => {
  assert.deepEqual(decodeMarker(encode({ v: 1, id: "m-1" })), { v: 1, id: "m-1" });
  const full = { v: 1, id: "m-1", seq: 3, due: at, rev: 9 };
  assert.deepEqual(decodeMarker(encode(full)), full);
  for (const bad of [{ v: 1 }, { v: 1, id: "m", seq: 0 }, { v: 1, id: "m", due: "soon" }, []]) {
    assert.equal(decodeMarker(encode(bad)), undefined, JSON.stringify(bad));
  }
  assert.equal(decodeMarker(new Uint8Array([0xff])), undefined);
  const entry = { v: 1, id: "m-1", consumer: "", receivedAt: at };
  assert.deepEqual(decodeInboxEntry(encode(entry)), entry);
  assert.equal(decodeInboxEntry(encode({ ...entry, consumer: 1 })), undefined);
  assert.equal(decodeInboxEntry(encode({ ...entry, receivedAt: "yesterday" })), undefined);
});
