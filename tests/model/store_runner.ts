/**
 * Runs a list of store commands against a real store and the reference model, checking the
 * invariants after every step and at the end:
 *
 * - nothing committed is lost: every stored message is in the model's state, and at the end
 *   every instance, past every lease, claims every unsettled message (so a requeued message is
 *   claimable again on every instance);
 * - a stale claim never settles a message, and no message has two live claims (a claim only
 *   returns due messages; a mark only applies for the latest claim);
 * - `dead` is never claimed;
 * - `stats()` counts match the model.
 *
 * @module
 */

import type { OutboxMessage, OutboxRecord } from "../../mod.ts";
import type { Command, Operation } from "./store_commands.ts";
import { idCount } from "./store_commands.ts";
import {
  applyClaim,
  applyEnqueue,
  applyMarks,
  applyPrune,
  applyRequeue,
  checkEnqueued,
  describe,
  describeStored,
  emptyModel,
  expectedStats,
  type FenceMode,
  type HeldClaim,
  isDue,
  type Model,
  type ModelMark,
  type ModelMessage,
  ModelViolation,
  resync,
  sameState,
  verdict,
} from "./reference_model.ts";
import type { Instance, Run, Target } from "./store_targets.ts";

/** How strictly marks of an already-settled own claim are judged (see reference_model.ts). */
export interface RunOptions {
  /** `token`: retries and repeated marks of one claim must return true. */
  fence: FenceMode | "auto";
  /**
   * Leave repeated ids out of one markMany (#15 item 5: NATS KV settles two marks of one id
   * concurrently, so which one wins is a race).
   */
  uniqueMarks?: boolean;
}

/** The id of message index `n`. */
export function messageId(n: number): string {
  return `m${n}`;
}

/** The record of message index `n` (the same content every time: re-enqueues are idempotent). */
export function recordOf(n: number): OutboxRecord {
  return {
    id: messageId(n),
    kind: "event.publish",
    name: "model.event",
    subject: `model.s${n % 2}`,
    payload: JSON.stringify({ n }),
    headers: { "X-Model": `${n}` },
  };
}

class Rollback extends Error {}

/** A prepared step as the order check sees it. */
interface Step {
  check: (model: Model, observed: unknown) => Model;
  /**
   * For marks and requeues: how many parts (marks, unique ids) another actor may come between
   * on stores that are not atomic (their parts run concurrently), and a check of some parts.
   */
  parts?: number;
  checkParts?: PartCheck;
  /** The message of each part: parts of one message keep their input order. */
  partKeys?: string[];
}

/** Checks the parts `indexes` of a step (`first` / `last`: the first or last call of a run). */
type PartCheck = (
  model: Model,
  observed: unknown,
  indexes: number[],
  first: boolean,
  last: boolean,
) => Model;

/** Whether the stored message is the model's, due times included. */
function fits(model: ModelMessage | undefined, stored: OutboxMessage | undefined): boolean {
  if (!sameState(model, stored)) return false;
  if (!model || !stored || (model.state !== "claimed" && model.state !== "failed")) return true;
  return Date.parse(stored.nextAttemptAt ?? "") === model.dueMs;
}

/** Executes commands on one fresh run of `target`. */
export class StoreRunner {
  #model: Model = emptyModel();
  #held: HeldClaim[][] = [[], [], []];
  #nowMs: number;
  #log: string[] = [];

  constructor(
    readonly target: Target,
    readonly run: Run,
    readonly options: RunOptions,
    startMs: number,
  ) {
    this.#nowMs = startMs;
  }

  /** What happened so far (printed with a failure). */
  get log(): readonly string[] {
    return this.#log;
  }

  /** Runs every command, checking after each; then the final drain. */
  async execute(commands: readonly Command[]): Promise<void> {
    for (const [i, command] of commands.entries()) {
      try {
        await this.#step(command);
        await this.run.settle();
        await this.#checkStored();
      } catch (error) {
        throw this.#explain(error, `step ${i} ${JSON.stringify(command)}`);
      }
    }
    try {
      await this.#drain();
    } catch (error) {
      throw this.#explain(error, "final drain");
    }
  }

  #explain(error: unknown, where: string): Error {
    const message = error instanceof Error ? error.message : String(error);
    const explained = new Error(
      `${this.target.name}, ${where}: ${message}\n  trace:\n    ${this.#log.join("\n    ")}`,
      { cause: error },
    );
    explained.name = error instanceof ModelViolation ? "ModelViolation" : "StoreError";
    return explained;
  }

  get #now(): Date {
    return new Date(this.#nowMs);
  }

  #instance(actor: number): Instance {
    return this.run.instances[actor % this.run.instances.length];
  }

  async #step(command: Command): Promise<void> {
    switch (command.op) {
      case "advance":
        this.#nowMs += command.ms;
        this.#log.push(`advance ${command.ms} ms`);
        return;
      case "fault":
        return await this.#fault(command.kind, command.at, command.inner);
      case "overtake":
        return await this.#overtake(command.at, command.delay, command.inner, command.by);
      case "txEnqueue":
        return await this.#txEnqueue(command.actor, command.ids, command.commit, command.by);
      default: {
        const prepared = await this.#prepare(command);
        this.#log.push(prepared.label);
        const observed = await prepared.call();
        this.#model = prepared.check(this.#model, observed);
        return;
      }
    }
  }

  /**
   * Binds an operation to the current claims and clock: `call` runs it on the store, `check`
   * judges its result against a model (the current one, or another order's for overtakes).
   */
  async #prepare(operation: Operation): Promise<{
    label: string;
    call: () => Promise<unknown>;
    check: (model: Model, observed: unknown) => Model;
    /** Whether a change of one message after a failed call may be this operation's effect. */
    legal: (
      id: string,
      before: ModelMessage | undefined,
      after: OutboxMessage | undefined,
    ) => ModelMessage | undefined | "illegal";
    ids: string[];
    parts?: number;
    checkParts?: PartCheck;
    partKeys?: string[];
  }> {
    const instance = this.#instance(operation.actor);
    const store = instance.store;
    const nowMs = this.#nowMs;
    const now = this.#now;
    const illegal = () => "illegal" as const;
    switch (operation.op) {
      case "enqueue": {
        const ids = operation.ids.map(messageId);
        const records = operation.ids.map(recordOf);
        return {
          label: `#${operation.actor} enqueue ${ids.join(",")}`,
          call: () =>
            records.length === 1
              ? store.enqueue(records[0]).then((m) => [m])
              : store.enqueueMany(records),
          check: (model, observed) => {
            const next = applyEnqueue(model, ids, nowMs);
            checkEnqueued(next, observed as OutboxMessage[], ids);
            return next;
          },
          legal: (id, before, after) =>
            !before && ids.includes(id) && after?.state === "pending" && after.attempts === 0
              ? { state: "pending", attempts: 0, updatedMs: nowMs }
              : "illegal",
          ids,
        };
      }
      case "claim": {
        const { limit, leaseMs } = operation;
        return {
          label: `#${operation.actor} claim ${limit} lease ${leaseMs}`,
          call: () => store.claimDue(limit, now, { leaseMs }),
          check: (model, observed) => {
            const claimed = observed as OutboxMessage[];
            const { model: next, held } = applyClaim(model, claimed, limit, nowMs, leaseMs, {
              complete: this.#completeClaims,
            });
            this.#held[operation.actor].push(...held);
            this.#log.push(
              `  #${operation.actor} got ${
                held.map((h) => `${h.message.id}@t${h.token}`).join(",") || "nothing"
              }`,
            );
            return next;
          },
          legal: (_id, before, after) =>
            before && isDue(before, nowMs) && after?.state === "claimed" &&
              after.attempts === before.attempts + 1 &&
              Date.parse(after.nextAttemptAt ?? "") === nowMs + leaseMs
              ? {
                ...before,
                state: "claimed",
                attempts: after.attempts,
                dueMs: nowMs + leaseMs,
                updatedMs: nowMs,
                token: 0, // a claim nobody holds: its reply was lost
                lease: after.nextAttemptAt,
              }
              : "illegal",
          ids: [],
        };
      }
      case "mark":
      case "markMany": {
        // Any instance's claims (the newest first), live or stale, settled by this instance.
        const held = this.#held.flat().sort((a, b) => b.token - a.token);
        const wanted = operation.op === "mark"
          ? [{ pick: operation.pick, state: operation.state }]
          : operation.marks;
        let marks: ModelMark[] = held.length === 0 ? [] : wanted.map(({ pick, state }) => ({
          claim: held[pick % held.length],
          state,
          dueMs: state === "failed" ? nowMs + operation.retryMs : undefined,
        }));
        if (this.options.uniqueMarks) {
          marks = marks.filter((mark, i) =>
            marks.findIndex((other) => other.claim.message.id === mark.claim.message.id) === i
          );
        }
        const storeMarks = marks.map((mark) =>
          mark.state === "failed"
            ? {
              claim: mark.claim.message,
              state: "failed" as const,
              error: "model failure",
              nextAttemptAt: new Date(mark.dueMs!),
            }
            : mark.state === "dead"
            ? { claim: mark.claim.message, state: "dead" as const, error: "model dead" }
            : { claim: mark.claim.message, state: "dispatched" as const }
        );
        const single = operation.op === "mark" && marks.length === 1;
        // auto: the claim-token rules once the store's claims carry a token, else the legacy
        // fence (attempts + lease expiry), which cannot recognise its own earlier success.
        const fence: FenceMode = this.options.fence !== "auto"
          ? this.options.fence
          : marks.every((m) => (m.claim.message as { claimToken?: string }).claimToken)
          ? "token"
          : "legacy";
        return {
          label: `#${operation.actor} ${operation.op} ${
            marks.map((m) => `${m.claim.message.id}@t${m.claim.token}->${m.state}`).join(",") ||
            "(no claims held)"
          }`,
          call: async () => {
            if (marks.length === 0) return [];
            if (!single) return await store.markMany!(storeMarks, now);
            const mark = storeMarks[0];
            switch (mark.state) {
              case "dispatched":
                return [await store.markDispatched(mark.claim, now)];
              case "failed":
                return [
                  await store.markFailed(mark.claim, {
                    error: mark.error,
                    nextAttemptAt: mark.nextAttemptAt,
                    now,
                  }),
                ];
              case "dead":
                return [await store.markDead(mark.claim, { error: mark.error, now })];
            }
          },
          check: (model, observed) => applyMarks(model, marks, observed as boolean[], nowMs, fence),
          parts: marks.length,
          partKeys: marks.map((mark) => mark.claim.message.id),
          checkParts: (model, observed, indexes) =>
            applyMarks(
              model,
              indexes.map((i) => marks[i]),
              indexes.map((i) => (observed as boolean[])[i]),
              nowMs,
              fence,
            ),
          legal: (id, before, after) => {
            // Any mark of this id that applies may be the one that did (when a call throws, any
            // subset of its marks may have been applied).
            if (!before) return illegal();
            const m = { messages: new Map([[id, before]]), nextToken: 0 };
            for (const mark of marks) {
              if (mark.claim.message.id !== id || verdict(m, mark, fence) !== "applies") continue;
              const next: ModelMessage = {
                ...before,
                state: mark.state,
                updatedMs: nowMs,
                dueMs: mark.state === "failed" ? mark.dueMs : undefined,
                lease: undefined,
              };
              if (sameState(next, after)) return next;
            }
            return illegal();
          },
          ids: [],
        };
      }
      case "requeue": {
        // What is dead in the store now (a delayed call may have made it so), the latest first.
        const dead = (await this.run.observer.listDead({ limit: 100 }))
          .sort((a, b) => b.updatedAt.localeCompare(a.updatedAt))
          .map((message) => message.id);
        const ids = [
          ...(dead.length === 0 ? [] : operation.picks.map((pick) => dead[pick % dead.length])),
          ...operation.ids.map(messageId),
        ];
        const unique = [...new Set(ids)];
        let requeued = 0;
        return {
          label: `#${operation.actor} requeue ${ids.join(",")}`,
          call: () => store.requeue(ids, now),
          check: (model, observed) => applyRequeue(model, ids, nowMs, observed as number),
          parts: unique.length,
          partKeys: unique,
          // Stores that requeue id by id: the count is checked over all parts together.
          checkParts: (model, observed, indexes, first, last) => {
            if (first) requeued = 0;
            const part = indexes.map((i) => unique[i]);
            requeued += part.filter((id) => model.messages.get(id)?.state === "dead").length;
            if (last && requeued !== observed) {
              throw new ModelViolation(`requeue returned ${observed}, ${requeued} were dead`);
            }
            return applyRequeue(model, part, nowMs);
          },
          legal: (id, before, after) =>
            before?.state === "dead" && ids.includes(id) && after?.state === "pending" &&
              after.attempts === 0
              ? { state: "pending", attempts: 0, updatedMs: nowMs }
              : "illegal",
          ids,
        };
      }
      case "prune": {
        const cutoff = nowMs - operation.ageMs;
        const cutoffs = operation.dead
          ? { dispatchedBefore: cutoff, deadBefore: cutoff }
          : { dispatchedBefore: cutoff };
        return {
          label: `#${operation.actor} prune before now-${operation.ageMs}${
            operation.dead ? " (and dead)" : ""
          }`,
          call: () =>
            store.prune({
              dispatchedBefore: new Date(cutoffs.dispatchedBefore),
              deadBefore: cutoffs.deadBefore === undefined ? undefined : new Date(cutoff),
            }),
          check: (model, observed) =>
            applyPrune(model, cutoffs, observed as { dispatched: number; dead: number }),
          legal: (_id, before, after) =>
            !after && before && before.updatedMs < cutoff &&
              (before.state === "dispatched" || (operation.dead && before.state === "dead"))
              ? undefined
              : "illegal",
          ids: [],
        };
      }
    }
  }

  /** @internal The type of a prepared operation. */
  prepareFor(operation: Operation) {
    return this.#prepare(operation);
  }

  /** Claims checked for completeness (off while another actor overlaps them). */
  #completeClaims = true;

  async #fault(kind: "fail" | "lost", at: number, inner: Operation): Promise<void> {
    const prepared = await this.#prepare(inner);
    const instance = this.#instance(inner.actor);
    this.#log.push(`${prepared.label} with ${kind} at call ${at}`);
    instance.faults.arm(kind, at);
    let observed: unknown;
    let threw: unknown;
    try {
      observed = await prepared.call();
    } catch (error) {
      threw = error;
    } finally {
      instance.faults.disarm();
    }
    if (threw === undefined) {
      const hit = instance.faults.hit;
      // The fault was not reached, or the store absorbed it (a claim returns what it won, a
      // marker write is best effort): the result must fit the model, and whatever else changed
      // must be an effect the call may have had.
      this.#log.push(`  (${hit ? "fault absorbed" : "fault not reached"})`);
      this.#completeClaims = !hit;
      try {
        this.#model = prepared.check(this.#model, observed);
      } finally {
        this.#completeClaims = true;
      }
      if (hit) {
        await this.run.settle();
        this.#model = resync(this.#model, await this.#observe(prepared.ids), prepared.legal);
      }
      return;
    }
    this.#log.push(`  threw ${(threw as Error).message}`);
    await this.run.settle();
    this.#model = resync(this.#model, await this.#observe(prepared.ids), prepared.legal);
    if (inner.op === "claim") return; // a lost claim is not retried: its leases expire
    // Retry once without faults, as a dispatcher (or an operator) would: the result must be
    // what the first call should have answered.
    const retried = await prepared.call();
    this.#log.push(`  retried: ${JSON.stringify(retried)}`);
    this.#model = prepared.check(this.#model, retried);
  }

  async #overtake(
    at: number,
    delay: "pause" | "hold",
    inner: Operation,
    by: Operation,
  ): Promise<void> {
    const first = await this.#prepare(inner);
    const instance = this.#instance(inner.actor);
    instance.faults.arm(delay, at);
    const running = first.call().then(
      (value) => ({ value }),
      (error: unknown) => ({ error }),
    );
    const reached = await Promise.race([
      instance.faults.reached.then(() => true),
      running.then(() => false),
    ]);
    let secondObserved: unknown;
    let second: Awaited<ReturnType<StoreRunner["prepareFor"]>> | undefined;
    try {
      if (reached) await this.run.settle();
      second = await this.#prepare(by);
      this.#log.push(
        `${first.label}: ${
          delay === "pause" ? "request" : "reply"
        } of call ${at} delayed, overtaken by ${second.label}`,
      );
      secondObserved = await second.call();
      if (reached) await this.run.settle();
    } finally {
      instance.faults.release();
    }
    const firstOutcome = await running;
    if ("error" in firstOutcome) {
      throw new ModelViolation(
        `${first.label} failed after being overtaken: ${(firstOutcome.error as Error).message}`,
      );
    }
    this.#log.push(`  ${reached ? "delayed" : "finished first"}`);
    this.#model = await this.#either(
      [first, firstOutcome.value],
      [second!, secondObserved],
      reached,
    );
  }

  async #txEnqueue(actor: number, indexes: number[], commit: boolean, by: Operation) {
    const instance = this.#instance(actor);
    if (!instance.transaction) return;
    let peer = by.actor;
    if (this.target.txPeers === "same-connection") {
      const same = this.run.instances
        .map((candidate, i) => ({ candidate, i }))
        .filter(({ candidate }) => candidate.connection === instance.connection);
      peer = by.actor === actor ? actor : same[by.actor % same.length].i;
    }
    const claim = await this.#prepare({ ...by, actor: peer } as Operation);
    const ids = indexes.map(messageId);
    const records = indexes.map(recordOf);
    this.#log.push(
      `#${actor} in a transaction: enqueue ${ids.join(",")}, while ${claim.label}; then ${
        commit ? "commit" : "roll back"
      }`,
    );
    let claiming: Promise<{ value: unknown } | { error: unknown }> | undefined;
    try {
      await instance.transaction(async (tx) => {
        await tx.enqueueMany(records);
        claiming = claim.call().then((value) => ({ value }), (error: unknown) => ({ error }));
        await new Promise((resolve) => setTimeout(resolve, 5));
        if (!commit) throw new Rollback();
      });
    } catch (error) {
      if (!(error instanceof Rollback)) throw error;
    }
    const outcome = await claiming!;
    if ("error" in outcome) throw outcome.error;
    const enqueue = {
      check: (model: Model) => commit ? applyEnqueue(model, ids, this.#nowMs) : model,
    };
    const txStep = { check: (model: Model, _: unknown) => enqueue.check(model) };
    this.#model = await this.#either([txStep, undefined], [claim, outcome.value], true);
  }

  /**
   * Accepts the observed results if they fit a serial order of the two steps: `a` then `b`, `b`
   * then `a`, or (stores whose batches are not atomic, NATS KV) `b` between two marks of `a`.
   * When several orders explain the results, the one that matches what the store holds wins.
   */
  async #either(
    a: [Step, unknown],
    b: [Step, unknown],
    overlapped: boolean,
  ): Promise<Model> {
    const held = this.#held.map((claims) => [...claims]);
    const log = this.#log.length;
    type Part = (model: Model) => Model;
    const whole = ([step, observed]: [Step, unknown]): Part => (model) =>
      step.check(model, observed);
    const orders: Part[][] = [[whole(a), whole(b)]];
    if (overlapped) {
      orders.push([whole(b), whole(a)]);
      const [step, observed] = a;
      const parts = step.parts ?? 0;
      if (!this.target.atomicBatches && step.checkParts && parts > 1) {
        // Any proper subset of the parts before `b`, the rest after (each in input order).
        for (let mask = 1; mask < (1 << parts) - 1; mask++) {
          const before = [...Array(parts).keys()].filter((i) => mask & (1 << i));
          const after = [...Array(parts).keys()].filter((i) => !(mask & (1 << i)));
          const keys = step.partKeys ?? [];
          if (before.some((i) => after.some((j) => j < i && keys[j] === keys[i]))) continue;
          orders.push([
            (model) => step.checkParts!(model, observed, before, true, false),
            whole(b),
            (model) => step.checkParts!(model, observed, after, false, true),
          ]);
        }
      }
    }
    const passed: Array<{ model: Model; held: HeldClaim[][]; log: string[] }> = [];
    const failures: ModelViolation[] = [];
    for (const order of orders) {
      this.#held = held.map((claims) => [...claims]);
      this.#log.length = log;
      this.#completeClaims = !overlapped;
      try {
        const model = order.reduce((current, part) => part(current), this.#model);
        passed.push({ model, held: this.#held, log: this.#log.slice(log) });
      } catch (error) {
        if (!(error instanceof ModelViolation)) throw error;
        failures.push(error);
      } finally {
        this.#completeClaims = true;
      }
    }
    if (passed.length === 0) {
      throw new ModelViolation(
        `no serial order explains it: ${failures.map((f) => f.message).join(" / ")}`,
      );
    }
    let chosen = passed[0];
    if (passed.length > 1) {
      const stored = await this.#observe([]);
      chosen = passed.find(({ model }) =>
        [...stored].every(([id, message]) =>
          fits(model.messages.get(id), message)
        )
      ) ?? chosen;
    }
    this.#held = chosen.held;
    this.#log.length = log;
    this.#log.push(...chosen.log);
    return chosen.model;
  }

  async #observe(extra: readonly string[]): Promise<Map<string, OutboxMessage | undefined>> {
    const ids = new Set([...this.#model.messages.keys(), ...extra]);
    const observed = new Map<string, OutboxMessage | undefined>();
    const stored = await Promise.all([...ids].map((id) => this.run.observer.get(id)));
    [...ids].forEach((id, i) => observed.set(id, stored[i]));
    return observed;
  }

  async #checkStored(): Promise<void> {
    const every = Array.from({ length: idCount }, (_, n) => messageId(n));
    for (const [id, stored] of await this.#observe(every)) {
      const expected = this.#model.messages.get(id);
      if (!fits(expected, stored)) {
        throw new ModelViolation(
          `${id} is stored as ${
            describeStored(stored)
          } (due ${stored?.nextAttemptAt}), the model says ${describe(expected)} (due ${
            expected?.dueMs === undefined ? "-" : new Date(expected.dueMs).toISOString()
          })` +
            (expected && !stored ? " (committed message lost)" : ""),
        );
      }
    }
    const stats = await this.run.observer.stats(this.#now);
    const expected = expectedStats(this.#model, this.#nowMs);
    for (const key of Object.keys(expected) as Array<keyof typeof expected>) {
      if (stats[key] !== expected[key]) {
        throw new ModelViolation(
          `stats().${key} is ${stats[key]}, the model says ${expected[key]} (${
            JSON.stringify(stats)
          })`,
        );
      }
    }
  }

  /** Past every lease, each instance in turn must claim every unsettled message. */
  async #drain(): Promise<void> {
    for (const [actor, instance] of this.run.instances.entries()) {
      this.#nowMs += 3_600_000;
      await this.run.settle();
      const want = [...this.#model.messages]
        .filter(([, m]) => isDue(m, this.#nowMs))
        .map(([id]) => id)
        .sort();
      const claimed = await instance.store.claimDue(100, this.#now, { leaseMs: 1_000 });
      const got = claimed.map((message) => message.id).sort();
      if (JSON.stringify(got) !== JSON.stringify(want)) {
        throw new ModelViolation(
          `instance #${actor} claimed [${got}] past every lease, unsettled messages are [${want}]` +
            ` (a message no instance or only some instances can claim is lost to them)`,
        );
      }
      this.#model = applyClaim(this.#model, claimed, 100, this.#nowMs, 1_000).model;
    }
  }
}
