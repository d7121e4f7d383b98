/**
 * A message whose result or failure no store can keep as written must not block the rest of its
 * batch. Before the fix, on Postgres, one job outcome or error text with a NUL character made
 * the batch's one `markMany` fail on every retry; on every store, a thrown value whose text
 * could not be read (or an outcome changed after the dispatcher checked it) did the same. Every
 * message of such a batch stayed claimed, and its job ran again after each lease.
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import postgres from "postgres";
import {
  type JsonValue,
  MemoryOutboxRepository,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  type OutboxMessage,
  OutboxPublishError,
  type OutboxRepository,
  type OutboxRuntime,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../mod.ts";
import { createTestDatabase, uniqueName } from "./kit/mod.ts";

const huge = "x".repeat(5_500_000);

/** Job handlers that return or throw something awkward, by message id. */
const handlers: Record<string, () => unknown> = {
  "nul-outcome": () => ({ note: "a\u0000b" }),
  "surrogate-outcome": () => ({ note: "\ud800" }),
  "bigint-outcome": () => ({ n: 1n }),
  "deep-outcome": () => JSON.parse("[".repeat(3000) + "]".repeat(3000)),
  "large-outcome": () => ({ blob: "y".repeat(70_000) }),
  "mutated-outcome": () => {
    const outcome: Record<string, string> = { ok: "yes" };
    setTimeout(() => outcome.note = "late\u0000", 0); // changed after the dispatcher read it
    return outcome;
  },
  "flipping-getter": () => {
    let reads = 0;
    return {
      get note() {
        return reads++ === 0 ? "fine" : "\u0000";
      },
    };
  },
  "nul-error": () => {
    throw new Error("exit code \u0000 from worker \udc00");
  },
  "huge-error": () => {
    throw new Error(huge);
  },
  "message-getter-throws": () => {
    const error = new Error("x");
    Object.defineProperty(error, "message", {
      get() {
        throw new Error("no message for you");
      },
    });
    throw error;
  },
  "symbol-name": () => {
    const error = new Error("named oddly");
    Object.defineProperty(error, "name", { value: Symbol("odd") });
    throw error;
  },
  "null-prototype-bigint": () => {
    throw Object.assign(Object.create(null), { n: 1n });
  },
  "proxy": () => {
    throw new Proxy({}, {
      get() {
        throw new Error("trap");
      },
      getPrototypeOf() {
        throw new Error("trap");
      },
      ownKeys() {
        throw new Error("trap");
      },
    });
  },
  "unknown-kind": () => {
    throw new OutboxPublishError("fatal" as "permanent", "a kind this version does not know");
  },
  "symbol-code": () => {
    throw new OutboxPublishError("permanent", "coded oddly", {
      code: Symbol("c") as unknown as string,
    });
  },
};

interface Store {
  name: string;
  open(): Promise<{ outbox: OutboxRepository; close(): Promise<void> }>;
}

const stores: Store[] = [
  {
    name: "memory",
    open: () =>
      Promise.resolve({ outbox: new MemoryOutboxRepository(), close: () => Promise.resolve() }),
  },
  {
    name: "sqlite",
    async open() {
      const path = await Deno.makeTempFile({ suffix: ".db" });
      const db = new DatabaseSync(path);
      const executor = nodeSqliteExecutor(db);
      await migrate(executor, { dialect: "sqlite" });
      return {
        outbox: new SqlOutboxRepository(executor, "sqlite"),
        async close() {
          db.close();
          await Deno.remove(path);
        },
      };
    },
  },
  {
    name: "postgres",
    async open() {
      const db = await createTestDatabase();
      const sql = postgres(db.url, { max: 2, onnotice: () => {} });
      const executor = postgresJsExecutor(sql);
      await migrate(executor, { dialect: "postgres" });
      return {
        outbox: new SqlOutboxRepository(executor, "postgres"),
        async close() {
          await sql.end();
          await db[Symbol.asyncDispose]();
        },
      };
    },
  },
];

for (const store of stores) {
  Deno.test(`dispatcher on ${store.name}: a job whose outcome or error cannot be kept as written does not block its batch`, async () => {
    const { outbox, close } = await store.open();
    try {
      const names = [...Object.keys(handlers), "fine", "fine-too"];
      await outbox.enqueueMany(names.map((name) => ({
        id: name,
        kind: "job.submit" as const,
        name,
        subject: `jobs.${uniqueName("j")}`,
        payload: "{}",
        headers: {},
      })));
      // Events whose receipt throws when read, next to a plain one.
      const events = ["seq-getter", "duplicate-getter", "fine-event"];
      await outbox.enqueueMany(events.map((id) => ({
        id,
        kind: "event.publish" as const,
        name: "e",
        subject: `events.${uniqueName("e")}`,
        payload: "{}",
        headers: {},
      })));
      const published: string[] = [];
      const runs: string[] = [];
      const hookErrors = new Map<string, string>();
      const runtime: OutboxRuntime = {
        publishPreparedEvent: (event) => {
          const id = event.header.id;
          published.push(id);
          const receipt = { stream: "S", seq: published.length, duplicate: false };
          const throwing = id === "seq-getter"
            ? "seq"
            : id === "duplicate-getter"
            ? "duplicate"
            : "";
          if (throwing) {
            Object.defineProperty(receipt, throwing, {
              get() {
                throw new Error(`no ${throwing} for you`);
              },
            });
          }
          return Promise.resolve(receipt);
        },
        dispatchJobSubmission: (message: OutboxMessage) => {
          runs.push(message.id);
          const handler = handlers[message.id];
          try {
            return Promise.resolve((handler ? handler() : { ok: message.id }) as JsonValue);
          } catch (error) {
            return Promise.reject(error);
          }
        },
      };
      const errors: unknown[] = [];
      const dispatcher = new OutboxDispatcher(outbox, runtime, {
        limit: 50,
        leaseMs: 5_000,
        retry: { maxAttempts: 1 },
        idleRetryMs: false,
        onError: (error) => errors.push(error),
        onDead: (message, info) => hookErrors.set(message.id, info.lastError),
      });
      await dispatcher.whenIdle();
      await dispatcher.stop();
      assert.deepEqual(errors, []);
      // Each job ran once: every batch was settled, nothing was claimed twice.
      assert.deepEqual(runs.toSorted(), names.toSorted());
      for (const name of ["fine", "fine-too"]) {
        const message = await outbox.get(name);
        assert.equal(message?.state, "dispatched");
        assert.deepEqual(message?.outcome, { ok: name });
      }
      // A checked outcome is stored as it was checked, whatever the handler did with it later.
      assert.deepEqual(published.toSorted(), events.toSorted());
      assert.equal((await outbox.get("fine-event"))?.state, "dispatched");
      for (const id of ["seq-getter", "duplicate-getter"]) {
        const message = await outbox.get(id);
        assert.equal(message?.state, "dead", id);
        assert.match(message?.lastError ?? "", /^unreadable: /, id);
      }
      const mutated = await outbox.get("mutated-outcome");
      assert.equal(mutated?.state, "dispatched");
      assert.deepEqual(mutated?.outcome, { ok: "yes" });
      const flipping = await outbox.get("flipping-getter");
      assert.equal(flipping?.state, "dispatched");
      assert.deepEqual(flipping?.outcome, { note: "fine" });
      const checkedOnce = ["mutated-outcome", "flipping-getter"];
      for (const name of Object.keys(handlers).filter((name) => !checkedOnce.includes(name))) {
        const message = await outbox.get(name);
        assert.equal(message?.state, "dead", name);
        const stored = message?.lastError ?? "";
        assert.ok(!stored.includes("\u0000") && stored.isWellFormed(), name);
        assert.ok(stored.length <= 8192, `${name}: ${stored.length}`);
        // The hook sees what was stored.
        assert.equal(hookErrors.get(name), stored, name);
        if (name.endsWith("-outcome")) {
          assert.match(stored, /^outcome: the job's outcome cannot be stored/, name);
        }
      }
      assert.match(
        (await outbox.get("nul-error"))?.lastError ?? "",
        /exit code \uFFFD from worker \uFFFD/,
      );
      const cut = (await outbox.get("huge-error"))?.lastError ?? "";
      assert.ok(/^gave up after 1 attempts: error: x+…$/.test(cut), cut.slice(0, 80));
    } finally {
      await close();
    }
  });
}
