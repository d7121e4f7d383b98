/**
 * A job whose outcome or error no store can keep as written (NUL characters, lone surrogates,
 * a `bigint`) must not block the rest of its batch: on Postgres, before the fix, the batch's one
 * `markMany` failed every time, so every message of the batch stayed claimed and was claimed and
 * run again after each lease.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  type JsonValue,
  migrate,
  OutboxDispatcher,
  type OutboxMessage,
  type OutboxRuntime,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { createTestDatabase } from "./kit/mod.ts";

const handlers: Record<string, () => JsonValue> = {
  "nul-outcome": () => ({ note: "a\u0000b" }),
  "surrogate-outcome": () => ({ note: "\ud800" }),
  "bigint-outcome": () => ({ n: 1n } as unknown as JsonValue),
  "nul-error": () => {
    throw new Error("exit code \u0000 from worker \udc00");
  },
};

Deno.test("dispatcher on Postgres: jobs with outcomes or errors no store keeps as written do not block their batch", async () => {
  await using db = await createTestDatabase();
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  try {
    const executor = postgresJsExecutor(sql);
    await migrate(executor, { dialect: "postgres" });
    const outbox = new SqlOutboxRepository(executor, "postgres");
    const names = [...Object.keys(handlers), "fine", "fine-too"];
    await outbox.enqueueMany(names.map((name) => ({
      id: name,
      kind: "job.submit" as const,
      name,
      subject: `jobs.${name}`,
      payload: "{}",
      headers: {},
    })));
    const runs: string[] = [];
    const runtime: OutboxRuntime = {
      publishPreparedEvent: () => Promise.reject(new Error("no events in this test")),
      dispatchJobSubmission: (message: OutboxMessage) => {
        runs.push(message.id);
        const handler = handlers[message.id];
        return Promise.resolve(handler ? handler() : { ok: message.id });
      },
    };
    const errors: unknown[] = [];
    const dispatcher = new OutboxDispatcher(outbox, runtime, {
      limit: 10,
      retry: { maxAttempts: 1 },
      idleRetryMs: false,
      onError: (error) => errors.push(error),
    });
    await dispatcher.whenIdle();
    await dispatcher.stop();
    assert.deepEqual(errors, []);
    // Each job ran once: no mark failed, so nothing was claimed twice.
    assert.deepEqual(runs.toSorted(), names.toSorted());
    for (const name of ["fine", "fine-too"]) {
      const message = await outbox.get(name);
      assert.equal(message?.state, "dispatched");
      assert.deepEqual(message?.outcome, { ok: name });
    }
    for (const name of ["nul-outcome", "surrogate-outcome", "bigint-outcome"]) {
      const message = await outbox.get(name);
      assert.equal(message?.state, "dead", name);
      assert.match(message?.lastError ?? "", /^outcome: the job's outcome cannot be stored/);
    }
    const failed = await outbox.get("nul-error");
    assert.equal(failed?.state, "dead");
    assert.match(failed?.lastError ?? "", /exit code \uFFFD from worker \uFFFD/);
  } finally {
    await sql.end();
  }
});
