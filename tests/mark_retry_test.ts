/**
 * A retried mark is idempotent for its own claim (issue #15 item 1): when a batch of marks was
 * applied but the store still threw (the reply lost after COMMIT, a KV batch that applied some
 * writes, a store without markMany that failed halfway), the dispatcher's retry must count the
 * applied marks as applied, not superseded, and every hook fires exactly once per outcome. The
 * stores are real (Postgres, SQLite files, NATS KV); the runtime is a fake that answers per
 * subject, and the store faults are injected around real statements.
 */

import assert from "node:assert/strict";
import type { KV } from "@nats-io/kv";
// @ts-types="@types/pg"
import pg from "pg";
import {
  dispatchOutbox,
  type DispatchOutboxOptions,
  type JsonValue,
  MemoryOutboxRepository,
  migrate,
  nodeSqliteExecutor,
  type OutboxClaim,
  type OutboxDeadLetter,
  OutboxDispatcher,
  type OutboxFailure,
  type OutboxMessage,
  OutboxPublishError,
  type OutboxRecord,
  type OutboxRepository,
  type OutboxRuntime,
  pgExecutor,
  type SqlExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { outboxRecordKey } from "../src/stores/nats_kv/keys.ts";
import { postgresUrl } from "./kit/mod.ts";
import { openKvFixture } from "./nats_kv_fixture.ts";
import { dropPostgresTables, openSqlite, uniqueTables } from "./sql/harness.ts";

/** ok.* is delivered, retry.* fails retryably, dead.* permanently. */
const runtime: OutboxRuntime = {
  publishPreparedEvent(event) {
    if (event.subject.startsWith("retry.")) {
      return Promise.reject(new OutboxPublishError("retryable", "busy", { code: "busy" }));
    }
    if (event.subject.startsWith("dead.")) {
      return Promise.reject(new OutboxPublishError("permanent", "refused", { code: "refused" }));
    }
    return Promise.resolve({ stream: "S", seq: 1 });
  },
};

function records(prefix: string): OutboxRecord[] {
  return ["ok", "retry", "dead"].map((kind) => ({
    id: `${prefix}-${kind}`,
    kind: "event.publish" as const,
    name: "n",
    subject: `${kind}.a`,
    payload: "{}",
    headers: {},
  }));
}

interface Hooks {
  dispatched: string[];
  failed: string[];
  dead: string[];
  options: DispatchOutboxOptions;
}

function hooks(): Hooks {
  const seen: Hooks = { dispatched: [], failed: [], dead: [], options: {} };
  seen.options = {
    retry: { baseMs: 60_000, capMs: 60_000, maxAttempts: 5 },
    onDispatched: (message) => seen.dispatched.push(message.id),
    onFailed: (message) => seen.failed.push(message.id),
    onDead: (message) => seen.dead.push(message.id),
  };
  return seen;
}

async function dispatchAndCheck(
  outbox: OutboxRepository,
  prefix: string,
  faults: () => number,
): Promise<void> {
  const seen = hooks();
  const result = await dispatchOutbox(outbox, runtime, seen.options);
  assert.ok(faults() > 0, "the fault was injected");
  assert.deepEqual(
    { ...result },
    {
      claimed: 3,
      dispatched: 1,
      duplicates: 0,
      failed: 1,
      unavailable: 0,
      dead: 1,
      superseded: 0,
    },
  );
  assert.deepEqual(seen.dispatched, [`${prefix}-ok`]);
  assert.deepEqual(seen.failed, [`${prefix}-retry`]);
  assert.deepEqual(seen.dead, [`${prefix}-dead`]);
  assert.equal((await outbox.get(`${prefix}-ok`))?.state, "dispatched");
  assert.equal((await outbox.get(`${prefix}-retry`))?.state, "failed");
  assert.equal((await outbox.get(`${prefix}-dead`))?.state, "dead");
}

/** Runs every statement; the first `lost` mark statements throw AFTER they committed. */
function losingReplies(executor: SqlExecutor, lost: number): SqlExecutor & { lost: number } {
  const wrapper = {
    lost: 0,
    async query(sql: string, params: readonly unknown[]) {
      const rows = await executor.query(sql, params);
      if (wrapper.lost < lost && /^UPDATE .* SET state = m\.state/.test(sql)) {
        wrapper.lost += 1;
        throw new Error("Connection terminated unexpectedly (reply lost after COMMIT)");
      }
      return rows;
    },
  };
  return wrapper as SqlExecutor & { lost: number };
}

Deno.test("postgres (pg): a markMany whose reply is lost after COMMIT is counted once, as applied", async () => {
  const pool = new pg.Pool({ connectionString: await postgresUrl(), max: 2 });
  const executor = pgExecutor(pool);
  const tables = uniqueTables();
  try {
    await migrate(executor, { dialect: "postgres", tables });
    const lossy = losingReplies(executor, 1);
    const outbox = new SqlOutboxRepository(lossy, "postgres", tables);
    await outbox.enqueueMany(records("pg"));
    await dispatchAndCheck(outbox, "pg", () => lossy.lost);
  } finally {
    await dropPostgresTables(executor, tables);
    await pool.end();
  }
});

Deno.test("sqlite: a markMany whose reply is lost after COMMIT is counted once; the retry timer is armed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "outbox_mark_retry_" });
  const db = openSqlite(`${dir}/app.db`);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    const lossy = losingReplies(executor, 1);
    const outbox = new SqlOutboxRepository(lossy, "sqlite");
    await outbox.enqueueMany(records("lite"));
    await dispatchAndCheck(outbox, "lite", () => lossy.lost);

    // With idleRetryMs: false only the dispatcher's retry timer brings a failed message back:
    // it must be armed although the failure's mark reply was lost.
    const again = losingReplies(executor, 1);
    const relay = new SqlOutboxRepository(again, "sqlite");
    await relay.enqueue({
      id: "flaky",
      kind: "event.publish",
      name: "n",
      subject: "flaky.a",
      payload: "{}",
      headers: {},
    });
    let calls = 0;
    const delivered = Promise.withResolvers<void>();
    const dispatcher = new OutboxDispatcher(relay, {
      publishPreparedEvent(event) {
        if (event.header.id !== "flaky") return Promise.resolve();
        calls += 1;
        if (calls === 1) {
          return Promise.reject(new OutboxPublishError("retryable", "busy", { code: "busy" }));
        }
        delivered.resolve();
        return Promise.resolve();
      },
    }, { idleRetryMs: false, retry: { baseMs: 50, capMs: 50, maxAttempts: 5 } });
    try {
      const timeout = setTimeout(() => delivered.resolve(), 3_000);
      await delivered.promise;
      clearTimeout(timeout);
      assert.equal(again.lost, 1, "the failure's mark reply was lost");
      assert.equal(calls, 2, "the retry timer brought the failed message back");
      await dispatcher.whenIdle();
      assert.equal((await relay.get("flaky"))?.state, "dispatched");
    } finally {
      await dispatcher.stop();
    }
  } finally {
    db.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("nats kv: a markMany that applied some writes and then threw is counted once", async () => {
  await using fixture = await openKvFixture();
  const failKey = await outboxRecordKey("kv-retry");
  let thrown = 0;
  // The record write of one mark lands, then the call throws (as a timeout after the write).
  const kv = new Proxy(fixture.kv, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      if (property !== "update") {
        return typeof value === "function" ? value.bind(target) : value;
      }
      return async (key: string, data: Uint8Array, revision: number) => {
        const written = await target.update(key, data, revision);
        const state = JSON.parse(new TextDecoder().decode(data)).state;
        if (key === failKey && state === "failed" && thrown === 0) {
          thrown += 1;
          throw new Error("TimeoutError: the write landed but its reply did not");
        }
        return written;
      };
    },
  }) as KV;
  const outbox = fixture.outbox({ kv });
  await outbox.enqueueMany(records("kv"));
  await dispatchAndCheck(outbox, "kv", () => thrown);
});

Deno.test("memory: a markMany with an invalid mark throws before applying any", async () => {
  const outbox = new MemoryOutboxRepository();
  await outbox.enqueueMany(records("mem"));
  const [a, b, c] = await outbox.claimDue(3, new Date());
  const now = new Date();
  await assert.rejects(
    outbox.markMany([
      { claim: a, state: "dispatched" },
      { claim: b, state: "dead", error: "x" },
      { claim: c, state: "failed", error: "y", nextAttemptAt: new Date(Number.NaN) },
    ], now),
    { name: "OutboxValidationError" },
  );
  assert.deepEqual(
    (await Promise.all([a, b, c].map((m) => outbox.get(m.id)))).map((m) => m?.state),
    ["claimed", "claimed", "claimed"],
  );
});

/**
 * A store without markMany and without claim tokens (as a store written before them): its
 * repeated marks cannot tell "already applied". The second mark of a batch fails once.
 */
class TokenlessStore implements OutboxRepository {
  readonly inner = new MemoryOutboxRepository();
  failures = 0;
  #calls = 0;
  enqueue(record: OutboxRecord): Promise<OutboxMessage> {
    return this.inner.enqueue(record);
  }
  enqueueMany(records: readonly OutboxRecord[]): Promise<OutboxMessage[]> {
    return this.inner.enqueueMany(records);
  }
  get(id: string): Promise<OutboxMessage | undefined> {
    return this.inner.get(id);
  }
  async claimDue(limit: number, now: Date): Promise<OutboxMessage[]> {
    const claimed = await this.inner.claimDue(limit, now);
    return claimed.map(({ claimToken: _, ...message }) => message);
  }
  markDispatched(claim: OutboxClaim, now: Date, outcome?: JsonValue): Promise<boolean> {
    return this.#fallible(() => this.inner.markDispatched(claim, now, outcome));
  }
  markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean> {
    return this.#fallible(() => this.inner.markFailed(claim, failure));
  }
  markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean> {
    return this.#fallible(() => this.inner.markDead(claim, dead));
  }
  #fallible(mark: () => Promise<boolean>): Promise<boolean> {
    this.#calls += 1;
    if (this.#calls === 2) {
      this.failures += 1;
      return Promise.reject(new Error("connection reset"));
    }
    return mark();
  }
}

Deno.test("a store without markMany: a retry after a failure halfway resends only unanswered marks", async () => {
  const outbox = new TokenlessStore();
  await outbox.enqueueMany(records("fallback"));
  await dispatchAndCheck(outbox, "fallback", () => outbox.failures);
});
