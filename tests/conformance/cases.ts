/**
 * The conformance suite: one list of cases every outbox/inbox store must pass. It imports only
 * types from the library and asserts with `node:assert/strict`, so the same cases run under
 * `deno test` and under `node:test` against the built npm package.
 *
 * @module
 */

import assert from "node:assert/strict";
import type {
  InboxAdmin,
  InboxRepository,
  OutboxAdmin,
  OutboxRecord,
  OutboxRepository,
} from "../../mod.ts";
import { fenceCases } from "./fence_cases.ts";
import { idleKeyCases } from "./idle_key_cases.ts";
import { orderingCases } from "./ordering_cases.ts";

/** An outbox store under test: repository plus administration. */
export type OutboxStore = OutboxRepository & OutboxAdmin;
/** An inbox store under test. */
export type InboxStore = InboxRepository & InboxAdmin;

/** One fresh, empty store for one case. */
export interface ConformanceFixture {
  outbox: OutboxStore;
  inbox: InboxStore;
  /** Other handles on the same storage (other connections); concurrency cases use them too. */
  peers?: Array<{ outbox: OutboxStore; inbox: InboxStore }>;
  /** Damages the stored message `id` behind the library's back, so it cannot be decoded. */
  corrupt?(id: string): Promise<void>;
  close(): Promise<void>;
}

/** How a store opens fixtures. */
export interface ConformanceHarness {
  /** Store name used in test names. */
  name: string;
  /** Whether fixtures can damage stored data (`ConformanceFixture.corrupt`). */
  canCorrupt: boolean;
  /** `false` for a store that refuses ordering keys (its ordering cases are skipped). */
  orderingKeys?: boolean;
  /**
   * `false` for a store without the key fence's store half (`keySequence` on claims, the
   * `sequence` of dispatched marks); its fence cases are skipped. Implied `false` without
   * ordering keys.
   */
  keyFence?: boolean;
  /**
   * `false` for a store whose `prune` does not yet retire idle ordering keys; its idle-key cases
   * are skipped. Implied `false` without the key fence.
   */
  idleKeys?: boolean;
  open(): Promise<ConformanceFixture>;
}

/** One case. */
export interface ConformanceCase {
  name: string;
  /** A capability the case needs; harnesses without it skip (ignore) the case. */
  requires?: "corrupt" | "orderingKeys" | "keyFence" | "idleKeys";
  run(fixture: ConformanceFixture): Promise<void>;
}

const iso = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
let counter = 0;

function record(overrides: Partial<OutboxRecord> = {}): OutboxRecord {
  counter += 1;
  return {
    id: `msg-${counter}-${Math.random().toString(36).slice(2, 8)}`,
    kind: "event.publish",
    name: "order.created",
    subject: "orders.created",
    payload: JSON.stringify({ n: counter }),
    headers: { "X-Trace": `t-${counter}` },
    ...overrides,
  };
}

function at(base: Date, ms: number): Date {
  return new Date(base.getTime() + ms);
}

function ids(messages: ReadonlyArray<{ id: string }>): string[] {
  return messages.map((message) => message.id);
}

async function enqueueAll(outbox: OutboxStore, count: number): Promise<OutboxRecord[]> {
  const records: OutboxRecord[] = [];
  for (let i = 0; i < count; i++) {
    const r = record();
    await outbox.enqueue(r);
    records.push(r);
  }
  return records;
}

function handles(fixture: ConformanceFixture): Array<{ outbox: OutboxStore; inbox: InboxStore }> {
  return [{ outbox: fixture.outbox, inbox: fixture.inbox }, ...(fixture.peers ?? [])];
}

/** Every case, in a stable order. */
export const conformanceCases: readonly ConformanceCase[] = [
  {
    name: "enqueue stores a pending message with ISO timestamps",
    async run({ outbox }) {
      const r = record({ headers: { "X-A": "1", "X-B": "two" } });
      const message = await outbox.enqueue(r);
      assert.equal(message.id, r.id);
      assert.equal(message.state, "pending");
      assert.equal(message.attempts, 0);
      assert.match(message.createdAt, iso);
      assert.match(message.updatedAt, iso);
      assert.equal(message.nextAttemptAt, undefined);
      assert.deepEqual(message.headers, r.headers);
      const stored = await outbox.get(r.id);
      assert.ok(stored);
      assert.equal(stored.payload, r.payload);
      assert.equal(stored.subject, r.subject);
      assert.equal(stored.kind, r.kind);
      assert.equal(stored.name, r.name);
      assert.deepEqual(stored.headers, r.headers);
      assert.equal(stored.createdAt, message.createdAt);
      assert.equal(await outbox.get("no-such-id"), undefined);
    },
  },
  {
    name: "enqueue of the same id: identical content returns the stored message, different throws",
    async run({ outbox }) {
      const r = record({ headers: { "X-A": "1", "X-B": "2" } });
      const first = await outbox.enqueue(r);
      const again = await outbox.enqueue({ ...r, headers: { "X-B": "2", "X-A": "1" } });
      assert.equal(again.id, first.id);
      assert.equal(again.createdAt, first.createdAt);
      const changes: Array<Partial<OutboxRecord>> = [
        { payload: "{}" },
        { subject: "orders.other" },
        { name: "other" },
        { kind: "job.create" as const },
        { headers: { "X-A": "1" } },
        { headers: { "X-A": "1", "X-B": "3" } },
      ];
      for (const change of changes) {
        await assert.rejects(outbox.enqueue({ ...r, ...change }), {
          name: "OutboxDuplicateIdentityError",
        });
      }
      const stored = await outbox.get(r.id);
      assert.equal(stored?.payload, r.payload);
    },
  },
  {
    name: "trace context headers are not part of a message's identity",
    async run({ outbox }) {
      const base = record({ id: "traced-1" });
      const traced = (parent: string) => ({
        ...base,
        headers: { "X-A": "1", traceparent: parent },
      });
      const first = await outbox.enqueue(
        traced("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
      );
      const retry = await outbox.enqueue(
        traced("00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"),
      );
      assert.equal(retry.headers.traceparent, first.headers.traceparent, "the first one is kept");
      await assert.rejects(
        outbox.enqueue({
          ...traced("00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"),
          headers: { "X-A": "2" },
        }),
        { name: "OutboxDuplicateIdentityError" },
      );
    },
  },
  {
    name: "invalid records are rejected with OutboxValidationError and nothing is stored",
    async run({ outbox }) {
      const base = record();
      const bad: Array<[string, unknown]> = [
        ["id", { ...base, id: "" }],
        ["id", { ...base, id: 42 }],
        ["id", { ...base, id: "line\nbreak" }],
        ["id", { ...base, id: "x".repeat(3000) }],
        ["kind", { ...base, kind: "event.unknown" }],
        ["payload", { ...base, payload: { a: 1 } }],
        ["payload", { ...base, payload: "nul\u0000byte" }],
        ["payload", { ...base, payload: "{not json" }],
        ["payload", { ...base, payload: "" }],
        ["subject", { ...base, subject: "" }],
        ["subject", { ...base, subject: "orders created" }],
        ["subject", { ...base, subject: "orders..created" }],
        ["subject", { ...base, subject: ".orders" }],
        ["subject", { ...base, subject: "orders.*" }],
        ["subject", { ...base, subject: "orders.>" }],
        ["headers.X-N", { ...base, headers: { "X-N": 1 } }],
        ["headers.X-N", { ...base, headers: { "X-N": "a\r\nInjected: 1" } }],
        ["headers.Bad Name", { ...base, headers: { "Bad Name": "v" } }],
        ["headers.Nats-Msg-Id", { ...base, headers: { "Nats-Msg-Id": "other" } }],
        ["name", { ...base, name: undefined }],
      ];
      for (const [field, input] of bad) {
        await assert.rejects(
          outbox.enqueue(input as OutboxRecord),
          (error: Error & { field?: string }) => {
            assert.equal(error.name, "OutboxValidationError", `${field}: ${error.message}`);
            assert.equal(error.field, field);
            return true;
          },
        );
      }
      assert.equal(await outbox.get(base.id), undefined);
      const good = record();
      await assert.rejects(outbox.enqueueMany([good, { ...record(), subject: "a.*" }]), {
        name: "OutboxValidationError",
      });
      assert.equal(
        await outbox.get(good.id),
        undefined,
        "a bad record stores nothing of its batch",
      );
      assert.deepEqual(await outbox.claimDue(10, new Date()), []);
    },
  },
  {
    name: "a record NATS would refuse (over 1 MiB) is refused at enqueue; nothing is stored",
    async run({ outbox }) {
      const big = record({ payload: JSON.stringify({ blob: "x".repeat(2 * 1024 * 1024) }) });
      const refused = (error: Error & { field?: string }) => {
        assert.ok(error.name.startsWith("Outbox"), error.name);
        assert.equal(error.field, "payload", error.message);
        return true;
      };
      await assert.rejects(outbox.enqueue(big), refused);
      await assert.rejects(outbox.enqueueMany([record(), big]), refused);
      assert.equal(await outbox.get(big.id), undefined);
      assert.deepEqual(await outbox.claimDue(10, new Date()), []);
      // A job's payload is the handler's business: it need not be JSON.
      const job = await outbox.enqueue(record({ kind: "job.create", payload: "plain text" }));
      assert.equal(job.payload, "plain text");
    },
  },
  {
    name: "enqueueMany stores all records in order and resolves duplicates like enqueue",
    async run({ outbox }) {
      const existing = record();
      await outbox.enqueue(existing);
      const fresh = [record(), record(), record()];
      const stored = await outbox.enqueueMany([...fresh, existing]);
      assert.deepEqual(ids(stored), [...ids(fresh), existing.id]);
      assert.ok(stored.every((message) => message.state === "pending"));
      assert.deepEqual(await outbox.enqueueMany([]), []);
      await assert.rejects(outbox.enqueueMany([{ ...existing, payload: "[]" }]), {
        name: "OutboxDuplicateIdentityError",
      });
      const claimed = await outbox.claimDue(10, new Date());
      assert.deepEqual(ids(claimed), [existing.id, ...ids(fresh)]);
    },
  },
  {
    name: "returned messages are copies",
    async run({ outbox }) {
      const r = record();
      const message = await outbox.enqueue(r);
      message.headers["X-Trace"] = "mutated";
      message.state = "dead";
      const stored = await outbox.get(r.id);
      assert.equal(stored?.headers["X-Trace"], r.headers["X-Trace"]);
      assert.equal(stored?.state, "pending");
      const [claimed] = await outbox.claimDue(1, new Date());
      claimed.attempts = 99;
      assert.equal((await outbox.get(r.id))?.attempts, 1);
    },
  },
  {
    name: "claimDue claims oldest first, up to the limit, and sets the lease",
    async run({ outbox }) {
      const records = await enqueueAll(outbox, 5);
      const now = new Date();
      assert.deepEqual(await outbox.claimDue(0, now), []);
      await assert.rejects(outbox.claimDue(-1, now), { name: "OutboxValidationError" });
      const first = await outbox.claimDue(3, now, { leaseMs: 10_000 });
      assert.deepEqual(ids(first), ids(records.slice(0, 3)));
      for (const message of first) {
        assert.equal(message.state, "claimed");
        assert.equal(message.attempts, 1);
        assert.equal(message.nextAttemptAt, at(now, 10_000).toISOString());
        assert.equal(message.updatedAt, now.toISOString());
        assert.equal(message.payload, records.find((r) => r.id === message.id)?.payload);
      }
      const second = await outbox.claimDue(10, now);
      assert.deepEqual(ids(second), ids(records.slice(3)));
      assert.equal(second[0].nextAttemptAt, at(now, 30_000).toISOString(), "default lease 30 s");
      assert.deepEqual(await outbox.claimDue(10, now), [], "claimed messages are not due");
    },
  },
  {
    name: "claimDue rejects an invalid lease or time with OutboxValidationError, claiming nothing",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      for (const leaseMs of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
        await assert.rejects(outbox.claimDue(1, new Date(), { leaseMs }), {
          name: "OutboxValidationError",
        });
      }
      await assert.rejects(outbox.claimDue(1, new Date(Number.NaN)), {
        name: "OutboxValidationError",
      });
      assert.equal((await outbox.get(r.id))?.state, "pending");
    },
  },
  {
    name: "an expired lease makes the message claimable again and fences the old claim",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [first] = await outbox.claimDue(1, t0, { leaseMs: 1_000 });
      assert.deepEqual(await outbox.claimDue(1, at(t0, 999), { leaseMs: 1_000 }), []);
      const [second] = await outbox.claimDue(1, at(t0, 1_000), { leaseMs: 1_000 });
      assert.equal(second.id, r.id);
      assert.equal(second.attempts, 2);
      assert.equal(await outbox.markDispatched(first, at(t0, 1_100)), false, "stale claim");
      assert.equal(
        await outbox.markFailed(first, {
          error: "late",
          now: at(t0, 1_100),
          nextAttemptAt: at(t0, 1_200),
        }),
        false,
      );
      assert.equal(await outbox.markDead(first, { error: "late", now: at(t0, 1_100) }), false);
      assert.equal((await outbox.get(r.id))?.state, "claimed");
      assert.equal(await outbox.markDispatched(second, at(t0, 1_100)), true);
      assert.equal(
        await outbox.markDispatched(second, at(t0, 1_150)),
        true,
        "a repeat by the same claim reports the mark it already applied",
      );
      assert.equal(await outbox.markDead(second, { error: "x", now: at(t0, 1_150) }), false);
      const stored = await outbox.get(r.id);
      assert.equal(stored?.state, "dispatched");
      assert.equal(stored?.nextAttemptAt, undefined);
      assert.equal(stored?.updatedAt, at(t0, 1_100).toISOString());
      assert.deepEqual(await outbox.claimDue(10, at(t0, 10_000_000)), [], "never claimed again");
    },
  },
  {
    name: "a failed message is due again at nextAttemptAt and keeps its error until dispatched",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(1, t0);
      assert.equal(
        await outbox.markFailed(claim, {
          error: "broker said no",
          now: at(t0, 10),
          nextAttemptAt: at(t0, 5_000),
        }),
        true,
      );
      const failed = await outbox.get(r.id);
      assert.equal(failed?.state, "failed");
      assert.equal(failed?.lastError, "broker said no");
      assert.equal(failed?.nextAttemptAt, at(t0, 5_000).toISOString());
      assert.equal(failed?.attempts, 1);
      assert.deepEqual(await outbox.claimDue(1, at(t0, 4_999)), []);
      const [again] = await outbox.claimDue(1, at(t0, 5_000));
      assert.equal(again.id, r.id);
      assert.equal(again.attempts, 2);
      assert.equal(again.lastError, "broker said no");
      assert.equal(await outbox.markDispatched(again, at(t0, 5_001)), true);
      const done = await outbox.get(r.id);
      assert.equal(done?.state, "dispatched");
      assert.equal(done?.lastError, undefined);
    },
  },
  {
    name: "dead messages are never claimed, are listed, and can be requeued",
    async run({ outbox }) {
      const [a, b] = await enqueueAll(outbox, 2);
      const t0 = new Date();
      const [claimA, claimB] = await outbox.claimDue(2, t0);
      assert.equal(await outbox.markDead(claimA, { error: "no stream", now: at(t0, 1) }), true);
      assert.equal(await outbox.markDispatched(claimB, at(t0, 1)), true);
      const dead = await outbox.get(a.id);
      assert.equal(dead?.state, "dead");
      assert.equal(dead?.lastError, "no stream");
      assert.equal(dead?.nextAttemptAt, undefined);
      assert.deepEqual(await outbox.claimDue(10, at(t0, 10_000_000)), []);
      assert.deepEqual(ids(await outbox.listDead()), [a.id]);
      assert.deepEqual(await outbox.listDead({ limit: 0 }), []);
      assert.equal(await outbox.requeue([b.id, "unknown-id"]), 0, "only dead rows are requeued");
      assert.equal(await outbox.requeue([a.id, a.id]), 1);
      assert.equal(await outbox.requeue([a.id]), 0);
      const requeued = await outbox.get(a.id);
      assert.equal(requeued?.state, "pending");
      assert.equal(requeued?.attempts, 0);
      assert.deepEqual(await outbox.listDead(), []);
      const [again] = await outbox.claimDue(10, at(t0, 2));
      assert.equal(again.id, a.id);
      assert.equal(again.attempts, 1);
    },
  },
  {
    name: "a claim from before a requeue cannot settle the requeued message",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [stale] = await outbox.claimDue(1, t0, { leaseMs: 1_000 });
      const [second] = await outbox.claimDue(1, at(t0, 2_000), { leaseMs: 1_000 });
      assert.equal(await outbox.markDead(second, { error: "x", now: at(t0, 2_001) }), true);
      assert.equal(await outbox.requeue([r.id], at(t0, 2_002)), 1);
      const [fresh] = await outbox.claimDue(1, at(t0, 3_000), { leaseMs: 1_000 });
      assert.equal(fresh.attempts, stale.attempts, "same attempt number as the stale claim");
      assert.equal(await outbox.markDispatched(stale, at(t0, 3_001)), false);
      assert.equal(await outbox.markDispatched(fresh, at(t0, 3_001)), true);
    },
  },
  {
    name: "markMany settles a mixed batch and reports superseded claims",
    async run({ outbox }) {
      const records = await enqueueAll(outbox, 4);
      const t0 = new Date();
      const claims = await outbox.claimDue(4, t0, { leaseMs: 1_000 });
      const [reclaimed] = await outbox.claimDue(1, at(t0, 1_000));
      assert.equal(reclaimed.id, records[0].id);
      const now = at(t0, 1_001);
      const marks = [
        { claim: claims[0], state: "dispatched" as const },
        { claim: claims[1], state: "dispatched" as const, outcome: { kind: "accepted" } },
        {
          claim: claims[2],
          state: "failed" as const,
          error: "timeout",
          nextAttemptAt: at(t0, 9_000),
        },
        { claim: claims[3], state: "dead" as const, error: "too large" },
      ];
      const results = outbox.markMany
        ? await outbox.markMany(marks, now)
        : await Promise.all(marks.map((mark) =>
          mark.state === "dispatched"
            ? outbox.markDispatched(mark.claim, now, mark.outcome)
            : mark.state === "failed"
            ? outbox.markFailed(mark.claim, { ...mark, now })
            : outbox.markDead(mark.claim, { error: mark.error, now })
        ));
      assert.deepEqual(results, [false, true, true, true]);
      assert.equal((await outbox.get(records[0].id))?.state, "claimed");
      assert.deepEqual((await outbox.get(records[1].id))?.outcome, { kind: "accepted" });
      const failed = await outbox.get(records[2].id);
      assert.equal(failed?.state, "failed");
      assert.equal(failed?.nextAttemptAt, at(t0, 9_000).toISOString());
      assert.equal((await outbox.get(records[3].id))?.state, "dead");
      if (outbox.markMany) assert.deepEqual(await outbox.markMany([], now), []);
    },
  },
  {
    name: "every claim writes a fresh claim token, kept on the message",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      assert.equal((await outbox.get(r.id))?.claimToken, undefined, "none before a claim");
      const t0 = new Date();
      const [first] = await outbox.claimDue(1, t0, { leaseMs: 1_000 });
      assert.equal(typeof first.claimToken, "string");
      assert.ok(first.claimToken!.length > 0);
      assert.equal((await outbox.get(r.id))?.claimToken, first.claimToken);
      const [second] = await outbox.claimDue(1, at(t0, 1_000), { leaseMs: 1_000 });
      assert.notEqual(second.claimToken, first.claimToken);
      assert.equal(await outbox.markDispatched(second, at(t0, 1_001)), true);
      assert.equal((await outbox.get(r.id))?.claimToken, second.claimToken, "kept when settled");
    },
  },
  {
    name: "the token fences: attempts and lease do not settle a claim with another token",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(1, t0);
      const forged = { ...claim, claimToken: "not-the-token" };
      assert.equal(await outbox.markDispatched(forged, at(t0, 1)), false);
      assert.equal(await outbox.markDead(forged, { error: "x", now: at(t0, 1) }), false);
      assert.equal((await outbox.get(r.id))?.state, "claimed");
      // The token and attempts are compared (a writer that claims without writing a token, as
      // an older version would, changes attempts), not the timestamps.
      assert.equal(await outbox.markDispatched({ ...claim, attempts: 99 }, at(t0, 1)), false);
      const other = { ...claim, nextAttemptAt: "1999-01-01T00:00:00.000Z" };
      assert.equal(await outbox.markDispatched(other, at(t0, 1)), true);
    },
  },
  {
    name: "a repeated mark is idempotent for its own claim and changes nothing",
    async run({ outbox }) {
      const [a, b, c] = await enqueueAll(outbox, 3);
      const t0 = new Date();
      const [ca, cb, cc] = await outbox.claimDue(3, t0);
      const failure = { error: "first", now: at(t0, 1), nextAttemptAt: at(t0, 60_000) };
      assert.equal(await outbox.markFailed(ca, failure), true);
      assert.equal(
        await outbox.markFailed(ca, { error: "second", now: at(t0, 2), nextAttemptAt: at(t0, 9) }),
        true,
      );
      const failed = await outbox.get(a.id);
      assert.equal(failed?.lastError, "first", "the first mark's data stays");
      assert.equal(failed?.nextAttemptAt, at(t0, 60_000).toISOString());
      assert.equal(failed?.updatedAt, at(t0, 1).toISOString());
      assert.equal(await outbox.markDead(ca, { error: "x", now: at(t0, 3) }), false);
      assert.equal(await outbox.markDispatched(ca, at(t0, 3)), false);

      assert.equal(await outbox.markDead(cb, { error: "gone", now: at(t0, 1) }), true);
      assert.equal(await outbox.markDead(cb, { error: "again", now: at(t0, 2) }), true);
      assert.equal((await outbox.get(b.id))?.lastError, "gone");

      assert.equal(await outbox.markDispatched(cc, at(t0, 1), { kind: "one" }), true);
      assert.equal(await outbox.markDispatched(cc, at(t0, 2), { kind: "two" }), true);
      const done = await outbox.get(c.id);
      assert.deepEqual(done?.outcome, { kind: "one" });
      assert.equal(done?.updatedAt, at(t0, 1).toISOString());
    },
  },
  {
    name: "after a later claim took the message, the earlier claim's marks are superseded",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [first] = await outbox.claimDue(1, t0);
      const failure = { error: "busy", now: at(t0, 1), nextAttemptAt: at(t0, 1) };
      assert.equal(await outbox.markFailed(first, failure), true);
      const [second] = await outbox.claimDue(1, at(t0, 2));
      assert.equal(second.id, r.id);
      assert.equal(await outbox.markFailed(first, failure), false, "no longer provable");
      assert.equal(await outbox.markDispatched(second, at(t0, 3)), true);
      assert.equal(await outbox.markFailed(first, failure), false);
    },
  },
  {
    name: "a requeue ends every mark of the claims before it",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [claim] = await outbox.claimDue(1, t0);
      assert.equal(await outbox.markDead(claim, { error: "x", now: at(t0, 1) }), true);
      assert.equal(await outbox.requeue([r.id], at(t0, 2)), 1);
      assert.equal(await outbox.markDead(claim, { error: "x", now: at(t0, 3) }), false);
      assert.equal(await outbox.markDispatched(claim, at(t0, 3)), false);
      assert.equal((await outbox.get(r.id))?.state, "pending");
    },
  },
  {
    name: "claims without a token keep the attempts-and-lease fence; a repeat is superseded",
    async run({ outbox }) {
      const [r] = await enqueueAll(outbox, 1);
      const t0 = new Date();
      const [claimed] = await outbox.claimDue(1, t0);
      const legacy = { id: r.id, attempts: claimed.attempts, nextAttemptAt: claimed.nextAttemptAt };
      assert.equal(
        await outbox.markDispatched({ ...legacy, attempts: 2 }, at(t0, 1)),
        false,
        "wrong attempts",
      );
      assert.equal(await outbox.markDispatched(legacy, at(t0, 1)), true);
      assert.equal(await outbox.markDispatched(legacy, at(t0, 2)), false);
    },
  },
  {
    name: "markMany: marks of one id are settled in input order; a retried batch reports true",
    async run({ outbox }) {
      const [a, b, c] = await enqueueAll(outbox, 3);
      const t0 = new Date();
      const [ca, cb, cc] = await outbox.claimDue(3, t0);
      const now = at(t0, 1);
      const marks = [
        { claim: ca, state: "dispatched" as const },
        { claim: ca, state: "dispatched" as const },
        { claim: cb, state: "dispatched" as const },
        { claim: cb, state: "dead" as const, error: "x" },
        { claim: cc, state: "dead" as const, error: "first" },
        { claim: cc, state: "failed" as const, error: "second", nextAttemptAt: at(t0, 5) },
      ];
      const settle = (batch: typeof marks, when: Date) =>
        outbox.markMany
          ? outbox.markMany(batch, when)
          : Promise.all(batch.map((mark) =>
            mark.state === "dispatched"
              ? outbox.markDispatched(mark.claim, when)
              : mark.state === "failed"
              ? outbox.markFailed(mark.claim, { ...mark, now: when })
              : outbox.markDead(mark.claim, { error: mark.error, now: when })
          ));
      if (outbox.markMany) {
        assert.deepEqual(await settle(marks, now), [true, true, true, false, true, false]);
      } else {
        for (const mark of marks) await settle([mark], now);
      }
      assert.equal((await outbox.get(a.id))?.state, "dispatched");
      assert.equal((await outbox.get(b.id))?.state, "dispatched");
      assert.equal((await outbox.get(c.id))?.state, "dead");
      assert.equal((await outbox.get(c.id))?.lastError, "first");
      // The whole batch again, as a dispatcher retries after a lost reply.
      assert.deepEqual(
        await settle([marks[0], marks[2], marks[4]], at(t0, 2)),
        [true, true, true],
      );
      assert.equal((await outbox.get(a.id))?.updatedAt, now.toISOString());
    },
  },
  {
    name: "job outcomes are stored with the dispatched message",
    async run({ outbox }) {
      const r = record({ kind: "job.submit", name: "resize", subject: "jobs.resize" });
      await outbox.enqueue(r);
      const [claim] = await outbox.claimDue(1, new Date());
      const outcome = { kind: "accepted", jobId: "job-7", tags: ["a", "b"], retry: null };
      assert.equal(await outbox.markDispatched(claim, new Date(), outcome), true);
      assert.deepEqual((await outbox.get(r.id))?.outcome, outcome);
    },
  },
  {
    name: "error texts with NUL or a lone surrogate are kept with U+FFFD; neighbours settle",
    async run({ outbox }) {
      const [a, b, c] = await enqueueAll(outbox, 3);
      const claims = await outbox.claimDue(3, new Date());
      const byId = new Map(claims.map((claim) => [claim.id, claim]));
      const later = at(new Date(), 60_000);
      const results = await outbox.markMany!([
        { claim: byId.get(a.id)!, state: "failed", error: "bad\u0000byte", nextAttemptAt: later },
        { claim: byId.get(b.id)!, state: "dead", error: "half \ud800 pair" },
        { claim: byId.get(c.id)!, state: "dispatched" },
      ], new Date());
      assert.deepEqual(results, [true, true, true]);
      assert.equal((await outbox.get(a.id))?.lastError, "bad\uFFFDbyte");
      assert.equal((await outbox.get(b.id))?.lastError, "half \uFFFD pair");
      assert.equal((await outbox.get(c.id))?.state, "dispatched");
      // markFailed / markDead alone, the same way.
      const [d] = await enqueueAll(outbox, 1);
      const [claim] = await outbox.claimDue(1, new Date());
      assert.equal(claim.id, d.id);
      assert.equal(await outbox.markDead(claim, { error: "x\u0000y", now: new Date() }), true);
      assert.equal((await outbox.get(d.id))?.lastError, "x\uFFFDy");
    },
  },
  {
    name: "an outcome no store can keep is refused with OutboxValidationError, nothing applied",
    async run({ outbox }) {
      const [a, b] = await enqueueAll(outbox, 2);
      const claims = await outbox.claimDue(2, new Date());
      const byId = new Map(claims.map((claim) => [claim.id, claim]));
      const outcomes: unknown[] = [{ note: "a\u0000b" }, { ["k\u0000"]: 1 }, ["\udc00"], {
        big: 1n,
      }];
      for (const value of outcomes) {
        const outcome = value as string; // not JSON a store can keep, whatever the type says
        await assert.rejects(
          outbox.markMany!([
            { claim: byId.get(b.id)!, state: "dispatched" },
            { claim: byId.get(a.id)!, state: "dispatched", outcome },
          ], new Date()),
          { name: "OutboxValidationError", field: "outcome" },
        );
        await assert.rejects(
          outbox.markDispatched(byId.get(a.id)!, new Date(), outcome),
          { name: "OutboxValidationError", field: "outcome" },
        );
      }
      assert.equal((await outbox.get(a.id))?.state, "claimed");
      assert.equal((await outbox.get(b.id))?.state, "claimed");
      // A mark of an id no message can have is simply not applied.
      assert.deepEqual(
        await outbox.markMany!([
          { claim: { id: "no\u0000such", attempts: 1, claimToken: "t" }, state: "dispatched" },
          { claim: byId.get(b.id)!, state: "dispatched" },
        ], new Date()),
        [false, true],
      );
    },
  },
  {
    name: "a mark with a time no store can keep (after year 9999) is refused, nothing applied",
    async run({ outbox }) {
      const [a, b] = await enqueueAll(outbox, 2);
      const claims = await outbox.claimDue(2, new Date());
      const byId = new Map(claims.map((claim) => [claim.id, claim]));
      await assert.rejects(
        outbox.markMany!([
          { claim: byId.get(a.id)!, state: "dispatched" },
          {
            claim: byId.get(b.id)!,
            state: "failed",
            error: "later",
            nextAttemptAt: new Date(8.64e15),
          },
        ], new Date()),
        { name: "OutboxValidationError", field: "nextAttemptAt" },
      );
      assert.equal((await outbox.get(a.id))?.state, "claimed");
      assert.equal((await outbox.get(b.id))?.state, "claimed");
    },
  },
  {
    name: "concurrent claimers receive every message exactly once",
    async run(fixture) {
      const { outbox } = fixture;
      const total = 60;
      await outbox.enqueueMany(Array.from({ length: total }, () => record()));
      const claimers = handles(fixture);
      const seen: string[] = [];
      const now = new Date();
      await Promise.all(Array.from({ length: 6 }, async (_, worker) => {
        const store = claimers[worker % claimers.length].outbox;
        while (true) {
          const batch = await store.claimDue(7, now);
          if (batch.length === 0) break;
          seen.push(...ids(batch));
        }
      }));
      assert.equal(seen.length, total);
      assert.equal(new Set(seen).size, total);
    },
  },
  {
    name: "hostile ids round-trip unchanged",
    async run({ outbox }) {
      const hostile = [
        "'; DROP TABLE trellis_outbox; --",
        'quote"double',
        "a:b:c",
        "with space",
        "star*and>gt",
        "*",
        ">",
        "dots.in.the.id",
        "..",
        "slash/and\\back",
        "percent%2F",
        "unicode-ünïcødé-日本語-🚀",
        "=",
        "_",
        "x".repeat(1000),
        "é".repeat(1000),
      ];
      for (const id of hostile) await outbox.enqueue(record({ id }));
      for (const id of hostile) assert.equal((await outbox.get(id))?.id, id);
      const claimed = await outbox.claimDue(100, new Date());
      assert.deepEqual(new Set(ids(claimed)), new Set(hostile));
      for (const message of claimed) {
        assert.equal(await outbox.markDispatched(message, new Date()), true, message.id);
      }
    },
  },
  {
    name: "stats counts states, due messages and the oldest due age",
    async run({ outbox }) {
      const { blockedKeys, ...empty } = await outbox.stats();
      assert.deepEqual(
        { ...empty },
        { pending: 0, claimed: 0, failed: 0, dispatched: 0, dead: 0, due: 0 },
      );
      assert.ok(blockedKeys === undefined || blockedKeys === 0);
      const records = await enqueueAll(outbox, 5);
      const t0 = new Date(Date.now() + 1_000);
      const [a, b, c, d] = await outbox.claimDue(4, t0, { leaseMs: 10_000 });
      await outbox.markDispatched(a, t0);
      await outbox.markDead(b, { error: "x", now: t0 });
      await outbox.markFailed(c, { error: "y", now: t0, nextAttemptAt: at(t0, 5_000) });
      const stats = await outbox.stats(at(t0, 1));
      assert.equal(stats.pending, 1);
      assert.equal(stats.claimed, 1);
      assert.equal(stats.failed, 1);
      assert.equal(stats.dispatched, 1);
      assert.equal(stats.dead, 1);
      assert.equal(stats.due, 1, "only the pending one is due");
      const pending = await outbox.get(records[4].id);
      assert.equal(stats.oldestDueCreatedAt, pending?.createdAt);
      assert.equal(stats.oldestDueAgeMs, at(t0, 1).getTime() - Date.parse(pending!.createdAt));
      const later = await outbox.stats(at(t0, 20_000));
      assert.equal(later.due, 3, "pending, failed-and-due and the expired claim");
      assert.equal(later.oldestDueCreatedAt, (await outbox.get(c.id))?.createdAt);
      void d;
    },
  },
  {
    name: "prune deletes old dispatched and dead messages in batches; dry run deletes nothing",
    async run({ outbox }) {
      const records = await enqueueAll(outbox, 6);
      const t0 = new Date();
      const claims = await outbox.claimDue(5, t0);
      for (const claim of claims.slice(0, 3)) await outbox.markDispatched(claim, at(t0, 1));
      await outbox.markDead(claims[3], { error: "x", now: at(t0, 1) });
      await outbox.markDispatched(claims[4], at(t0, 5_000));
      const progress: Array<{ dispatched: number; dead: number }> = [];
      const dry = await outbox.prune({
        dispatchedBefore: at(t0, 2),
        deadBefore: at(t0, 2),
        batchSize: 2,
        dryRun: true,
      });
      assert.deepEqual({ ...dry }, { dispatched: 3, dead: 1 });
      assert.equal((await outbox.stats()).dispatched, 4);
      const kept = await outbox.prune({
        dispatchedBefore: at(t0, 2),
        batchSize: 2,
        onProgress: (p) => progress.push({ ...p }),
      });
      assert.deepEqual({ ...kept }, { dispatched: 3, dead: 0 });
      assert.ok(progress.length >= 2, "one progress report per batch");
      assert.deepEqual(progress.at(-1), { dispatched: 3, dead: 0 });
      for (const r of records.slice(0, 3)) assert.equal(await outbox.get(r.id), undefined);
      assert.equal((await outbox.get(records[3].id))?.state, "dead");
      assert.equal((await outbox.get(records[4].id))?.state, "dispatched");
      assert.equal((await outbox.get(records[5].id))?.state, "pending");
      const dead = await outbox.prune({ deadBefore: at(t0, 2) });
      assert.deepEqual({ ...dead }, { dispatched: 0, dead: 1 });
      assert.equal(await outbox.get(records[3].id), undefined);
      await assert.rejects(outbox.prune({ dispatchedBefore: t0, batchSize: 0 }), {
        name: "OutboxValidationError",
      });
    },
  },
  {
    name: "a corrupt stored message goes dead without blocking its neighbours",
    requires: "corrupt",
    async run({ outbox, corrupt }) {
      assert.ok(corrupt, "the harness declared canCorrupt");
      const [a, b, c] = await enqueueAll(outbox, 3);
      await corrupt(b.id);
      const claimed = await outbox.claimDue(10, new Date());
      assert.deepEqual(ids(claimed), [a.id, c.id]);
      const stats = await outbox.stats();
      assert.equal(stats.dead, 1);
      const dead = await outbox.listDead();
      assert.deepEqual(ids(dead), [b.id]);
      assert.match(dead[0].lastError ?? "", /corrupt/i);
    },
  },
  {
    name: "inbox records an id once",
    async run({ inbox }) {
      assert.equal(await inbox.record("evt-1"), true);
      assert.equal(await inbox.record("evt-1"), false);
      assert.equal(await inbox.record("evt-1", new Date()), false);
      assert.equal(await inbox.record("evt-2", new Date()), true);
      assert.equal(await inbox.record("'; DROP TABLE trellis_inbox; --"), true);
      assert.equal(await inbox.record("é".repeat(500)), true);
      assert.equal(await inbox.record("é".repeat(500)), false);
      await assert.rejects(inbox.record(""), { name: "OutboxValidationError" });
    },
  },
  {
    name: "inbox has() reports what record() stored, per consumer",
    async run({ inbox }) {
      assert.equal(typeof inbox.has, "function", "every store offers has()");
      assert.equal(await inbox.has!("evt-h"), false);
      assert.equal(await inbox.record("evt-h", { consumer: "a" }), true);
      assert.equal(await inbox.has!("evt-h", { consumer: "a" }), true);
      assert.equal(await inbox.has!("evt-h", { consumer: "b" }), false);
      assert.equal(await inbox.has!("evt-h"), false);
    },
  },
  {
    name: "inbox scopes ids by consumer",
    async run({ inbox }) {
      assert.equal(await inbox.record("evt-1", { consumer: "billing" }), true);
      assert.equal(await inbox.record("evt-1", { consumer: "shipping" }), true);
      assert.equal(await inbox.record("evt-1"), true, "the default scope is its own");
      assert.equal(await inbox.record("evt-1", { consumer: "billing" }), false);
      assert.equal(await inbox.record("evt-1", { consumer: "" }), false);
    },
  },
  {
    name: "concurrent inbox records of one id: exactly one wins",
    async run(fixture) {
      const inboxes = handles(fixture).map((handle) => handle.inbox);
      const results = await Promise.all(
        Array.from({ length: 12 }, (_, i) => inboxes[i % inboxes.length].record("race-1")),
      );
      assert.equal(results.filter(Boolean).length, 1);
    },
  },
  {
    name: "inbox prune forgets old ids",
    async run({ inbox }) {
      const t0 = new Date();
      assert.equal(await inbox.record("old-1", at(t0, -10_000)), true);
      assert.equal(await inbox.record("old-2", { now: at(t0, -10_000), consumer: "c" }), true);
      assert.equal(await inbox.record("new-1", t0), true);
      assert.equal(await inbox.prune({ receivedBefore: at(t0, -1), batchSize: 1 }), 2);
      assert.equal(await inbox.record("old-1", t0), true, "forgotten, so recorded again");
      assert.equal(await inbox.record("new-1", t0), false);
    },
  },
  ...orderingCases,
  ...fenceCases,
  ...idleKeyCases,
];
