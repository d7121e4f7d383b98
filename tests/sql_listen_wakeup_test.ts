/**
 * The LISTEN/NOTIFY wake path end to end on Postgres: `notify: true` enqueues, a dispatcher woken
 * only through `listenForOutboxWakeups` (idle polling off), and a notification that arrives while
 * a claim is in flight. That claim's snapshot was taken before the row committed, so it cannot
 * return the row: only the wake-up it absorbed can get the row claimed. It must cause exactly one
 * more claim, at once, without waiting for the batch in flight to be acknowledged or recorded.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import {
  listenForOutboxWakeups,
  migrate,
  OutboxDispatcher,
  type OutboxMessage,
  type OutboxRecord,
  type OutboxRuntime,
  postgresJsExecutor,
  type PreparedEvent,
  SqlOutboxRepository,
} from "../mod.ts";
import { postgresUrl } from "./kit/mod.ts";
import { signal } from "./helpers/dispatch.ts";
import { dropPostgresTables, uniqueTables } from "./sql/harness.ts";

function record(id: string): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ id }),
    headers: {},
  };
}

/** Fails (instead of hanging) when `promise` does not settle: a missed wake-up never does. */
async function within<T>(promise: Promise<T>, what: string, ms = 15_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

interface Fixture {
  sql: postgres.Sql;
  tables: ReturnType<typeof uniqueTables>;
  /** The relay's repository; its `claimDue` is wrapped by the test. */
  relay: SqlOutboxRepository;
  /** Commits `id` in its own transaction with `pg_notify`. */
  commit(id: string): Promise<void>;
  /** Resolves on the next `notify` wake-up delivered to the listener. */
  nextWake(): Promise<void>;
  listen(onWake: () => void): Promise<void>;
}

async function withListeningOutbox(fn: (fixture: Fixture) => Promise<void>): Promise<void> {
  const url = await postgresUrl();
  const sql = postgres(url, { max: 4, onnotice: () => {} });
  const listener = postgres(url, { max: 1, onnotice: () => {} });
  const tables = uniqueTables();
  const executor = postgresJsExecutor(sql);
  let subscription: { close(): Promise<void> } | undefined;
  const waiters: Array<() => void> = [];
  try {
    await migrate(executor, { dialect: "postgres", tables });
    await fn({
      sql,
      tables,
      relay: new SqlOutboxRepository(executor, "postgres", tables),
      commit: (id) =>
        sql.begin(async (tx) => {
          await new SqlOutboxRepository(postgresJsExecutor(tx), "postgres", tables, {
            notify: true,
          }).enqueue(record(id));
        }).then(() => {}),
      nextWake: () => new Promise<void>((resolve) => waiters.push(resolve)),
      async listen(onWake) {
        subscription = await listenForOutboxWakeups(listener, {
          tables,
          onWake(reason) {
            onWake();
            if (reason === "notify") { for (const resolve of waiters.splice(0)) resolve(); }
          },
        });
      },
    });
  } finally {
    await subscription?.close();
    await listener.end();
    await dropPostgresTables(executor, tables);
    await sql.end();
  }
}

/**
 * Records the ids each claim of `relay` returns. `holdNext(id, done)`: the next claim, once it has
 * run (its snapshot predates the commit), commits `id` and waits for the commit's notification to
 * reach the dispatcher before it returns, then calls `done`.
 */
function recordClaims(
  relay: SqlOutboxRepository,
  commit: (id: string) => Promise<void>,
  nextWake: () => Promise<void>,
): { claims: string[][]; holdNext(id: string, done: () => void): void } {
  const claimDue = relay.claimDue.bind(relay);
  const claims: string[][] = [];
  let hold: { id: string; done: () => void } | undefined;
  relay.claimDue = async (limit, now, options) => {
    const claimed = await claimDue(limit, now, options);
    claims.push(claimed.map((m) => m.id));
    const held = hold;
    if (held) {
      hold = undefined;
      const woke = nextWake();
      await commit(held.id);
      await woke;
      held.done();
    }
    return claimed;
  };
  return {
    claims,
    holdNext: (id, done) => {
      hold = { id, done };
    },
  };
}

Deno.test("LISTEN wake-up arriving during an in-flight claim that cannot see the row: exactly one more claim takes it (idle polling off)", async () => {
  await withListeningOutbox(async ({ relay, commit, nextWake, listen }) => {
    const { claims, holdNext } = recordClaims(relay, commit, nextWake);
    const dispatched = new Map<string, () => void>();
    const runtime: OutboxRuntime = { publishPreparedEvent: () => Promise.resolve() };
    const dispatcher = new OutboxDispatcher(relay, runtime, {
      idleRetryMs: false,
      onDispatched: (message: OutboxMessage) => dispatched.get(message.id)?.(),
      onError: (error) => console.error(error),
    });
    try {
      await listen(() => dispatcher.notify());
      await within(dispatcher.whenIdle(), "the first drain");
      const before = claims.length;
      const absorbed = signal();
      const late = signal();
      dispatched.set("late", late.resolve);
      holdNext("late", absorbed.resolve);
      dispatcher.notify(); // the claim that will absorb the notification
      await within(absorbed.promise, "the held claim");
      await within(late.promise, "the row committed during the claim was never dispatched");
      const after = claims.slice(before);
      assert.deepEqual(
        after,
        [[], ["late"]],
        "the held claim saw nothing; the wake-up it absorbed caused exactly one more claim",
      );
      assert.equal((await relay.get("late"))?.state, "dispatched");
    } finally {
      await dispatcher.stop();
    }
  });
});

Deno.test("LISTEN wake-up during a claim that returns a short batch: the next claim starts while that batch is still being published", async () => {
  await withListeningOutbox(async ({ relay, commit, nextWake, listen }) => {
    const { claims, holdNext } = recordClaims(relay, commit, nextWake);
    // The first message's publish is not acknowledged until the test says so.
    const release = signal();
    const published: string[] = [];
    const secondClaimed = signal();
    const runtime: OutboxRuntime = {
      async publishPreparedEvent(event: PreparedEvent) {
        published.push(event.header.id);
        if (event.header.id === "first") await release.promise;
      },
    };
    const dispatched = new Map<string, () => void>();
    const dispatcher = new OutboxDispatcher(relay, runtime, {
      idleRetryMs: false,
      onDispatched: (message: OutboxMessage) => dispatched.get(message.id)?.(),
      onError: (error) => console.error(error),
    });
    try {
      await listen(() => dispatcher.notify());
      await within(dispatcher.whenIdle(), "the first drain");
      const before = claims.length;
      const absorbed = signal();
      const second = signal();
      const first = signal();
      dispatched.set("first", first.resolve);
      dispatched.set("second", second.resolve);
      holdNext("second", absorbed.resolve);
      const wrapped = relay.claimDue;
      relay.claimDue = async (limit, now, options) => {
        const claimed = await wrapped(limit, now, options);
        if (claimed.some((m) => m.id === "second")) secondClaimed.resolve();
        return claimed;
      };
      await commit("first"); // its notification wakes the dispatcher; that claim absorbs "second"'s
      await within(absorbed.promise, "the held claim");
      await within(
        secondClaimed.promise,
        "a wake-up during a claim must not wait for the claimed batch's PubAcks",
      );
      assert.deepEqual(published.slice(0, 1), ["first"]);
      assert.equal(
        (await relay.get("first"))?.state,
        "claimed",
        "the first batch was still being published when the next claim took the new row",
      );
      release.resolve();
      await within(Promise.all([first.promise, second.promise]), "both dispatched");
      assert.deepEqual(claims.slice(before, before + 2), [["first"], ["second"]]);
    } finally {
      release.resolve();
      await dispatcher.stop();
    }
  });
});
