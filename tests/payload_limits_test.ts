/**
 * enqueue refuses what can only go dead: a non-JSON event.publish payload, and a record larger
 * than the store's maxPayloadBytes (payload plus headers, in UTF-8 bytes as NATS counts them).
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import {
  defaultMaxPayloadBytes,
  MemoryOutboxRepository,
  migrate,
  nodeSqliteExecutor,
  type OutboxAdmin,
  OutboxPayloadTooLargeError,
  type OutboxRecord,
  type OutboxRepository,
  OutboxValidationError,
  SqlOutboxRepository,
} from "../mod.ts";

function record(payload: string, headers: Record<string, string> = {}): OutboxRecord {
  return {
    id: `m-${crypto.randomUUID()}`,
    kind: "event.publish",
    name: "demo",
    subject: "demo.a",
    payload,
    headers,
  };
}

/** A JSON string payload of exactly `bytes` UTF-8 bytes. */
function payloadOf(bytes: number, char = "x"): string {
  const charBytes = new TextEncoder().encode(char).length;
  return JSON.stringify(char.repeat((bytes - 2) / charBytes));
}

async function stores(
  maxPayloadBytes?: number,
): Promise<Array<[string, OutboxRepository & OutboxAdmin]>> {
  const executor = nodeSqliteExecutor(new DatabaseSync(":memory:"));
  await migrate(executor, { dialect: "sqlite" });
  return [
    ["memory", new MemoryOutboxRepository({ maxPayloadBytes })],
    ["sqlite", new SqlOutboxRepository(executor, "sqlite", {}, { maxPayloadBytes })],
  ];
}

Deno.test("maxPayloadBytes: the default sits under NATS's 1 MiB, with room for headers", async () => {
  assert.equal(defaultMaxPayloadBytes, 1024 * 1024 - 64 * 1024);
  for (const [name, outbox] of await stores()) {
    const fits = record(payloadOf(defaultMaxPayloadBytes));
    assert.equal((await outbox.enqueue(fits)).payload.length, defaultMaxPayloadBytes, name);
    const over = record(payloadOf(defaultMaxPayloadBytes + 2));
    await assert.rejects(outbox.enqueue(over), (error: unknown) => {
      assert.ok(error instanceof OutboxPayloadTooLargeError, name);
      assert.ok(error instanceof OutboxValidationError);
      assert.equal(error.field, "payload");
      assert.equal(error.id, over.id);
      assert.equal(error.bytes, defaultMaxPayloadBytes + 2);
      assert.equal(error.limit, defaultMaxPayloadBytes);
      assert.match(error.message, /over the store's maxPayloadBytes of 983040/);
      return true;
    });
    assert.equal(await outbox.get(over.id), undefined, name);
  }
});

Deno.test("maxPayloadBytes: counts UTF-8 bytes and headers; enqueueMany stores nothing", async () => {
  for (const [name, outbox] of await stores(100)) {
    await outbox.enqueue(record(payloadOf(100)));
    await outbox.enqueue(record(payloadOf(98, "é")));
    await assert.rejects(outbox.enqueue(record(payloadOf(102, "é"))), OutboxPayloadTooLargeError);
    // "X-A: vvvvv\r\n" = 3 + 2 + 5 + 2 = 12 bytes
    await outbox.enqueue(record(payloadOf(88), { "X-A": "vvvvv" }));
    await assert.rejects(
      outbox.enqueue(record(payloadOf(90), { "X-A": "vvvvv" })),
      (error: OutboxPayloadTooLargeError) => error.bytes === 102,
    );
    const small = record("{}");
    await assert.rejects(
      outbox.enqueueMany([small, record(payloadOf(200))]),
      OutboxPayloadTooLargeError,
    );
    assert.equal(await outbox.get(small.id), undefined, name);
  }
});

Deno.test("maxPayloadBytes: a bad value is refused when the store is created", () => {
  for (const bad of [0, -1, 1.5, Number.NaN, "1" as unknown as number]) {
    assert.throws(() => new MemoryOutboxRepository({ maxPayloadBytes: bad }), {
      name: "OutboxValidationError",
    });
    assert.throws(
      () =>
        new SqlOutboxRepository(nodeSqliteExecutor(new DatabaseSync(":memory:")), "sqlite", {}, {
          maxPayloadBytes: bad,
        }),
      { name: "OutboxValidationError" },
    );
  }
});

Deno.test("an event.publish payload must be JSON text; a job payload need not be", async () => {
  for (const [name, outbox] of await stores()) {
    for (const payload of ["{not json", "", "undefined", "{'a': 1}"]) {
      await assert.rejects(outbox.enqueue(record(payload)), (error: unknown) => {
        assert.ok(error instanceof OutboxValidationError, name);
        assert.equal(error.field, "payload");
        assert.match(error.message, /event\.publish payload must be JSON text/);
        return true;
      });
    }
    for (const payload of ["{}", "null", "42", '"text"', "[1,2]"]) {
      await outbox.enqueue(record(payload));
    }
    await outbox.enqueue({ ...record("not json"), kind: "job.submit" });
  }
});
