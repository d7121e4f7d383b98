/**
 * The reference model of an outbox: what every store must do, as a small pure state machine.
 * Each operation checks an observed result against the model and returns the next model (or
 * throws `ModelViolation` saying which rule the store broke). Claims are nondeterministic (which
 * due messages a store picks), so the model accepts any legal choice and adopts it.
 *
 * The fence: a claim is identified by the model's own token (one per claim). A mark applies
 * when the message is `claimed` by that token. A mark whose claim already settled the message
 * into the same target state is "already applied by me": with `fence: "token"` it must return
 * `true` and change nothing (the claim-token rules of `OutboxClaim`); with `fence: "legacy"`
 * (stores whose claims carry no `claimToken`) either answer is accepted, nothing may change.
 *
 * @module
 */

import type { OutboxMessage, OutboxStats } from "../../mod.ts";

/** A rule of the outbox the store broke. */
export class ModelViolation extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelViolation";
  }
}

/** Which fence rules the model expects. */
export type FenceMode = "token" | "legacy";

/** Lifecycle states the model tracks (absent = never enqueued, rolled back or pruned). */
export type ModelState = "pending" | "claimed" | "failed" | "dispatched" | "dead";

/** One message in the model. */
export interface ModelMessage {
  state: ModelState;
  attempts: number;
  /** claimed: lease expiry; failed: due time (ms). */
  dueMs?: number;
  /** Last state change (ms), as the store's `updatedAt` (prune cutoffs). */
  updatedMs: number;
  /** The model token of the latest claim (kept after the claim settled; cleared by requeue). */
  token?: number;
  /** The store's own fence of the latest claim, to compare the legacy fence. */
  lease?: string;
}

/** A claim an actor holds: the model token and the message the store returned. */
export interface HeldClaim {
  token: number;
  message: OutboxMessage;
}

/** A mark as the model sees it. */
export interface ModelMark {
  claim: HeldClaim;
  state: "dispatched" | "failed" | "dead";
  /** For failed: when due again (ms). */
  dueMs?: number;
}

/** The whole model. Treat as immutable: operations return a new one. */
export interface Model {
  readonly messages: ReadonlyMap<string, ModelMessage>;
  readonly nextToken: number;
}

/** An empty model. */
export function emptyModel(): Model {
  return { messages: new Map(), nextToken: 1 };
}

function edit(model: Model, change: (messages: Map<string, ModelMessage>) => number | void): Model {
  const messages = new Map([...model.messages].map(([id, m]) => [id, { ...m }]));
  const tokens = change(messages);
  return { messages, nextToken: model.nextToken + (typeof tokens === "number" ? tokens : 0) };
}

/** Whether a claim at `nowMs` may take `message`. */
export function isDue(message: ModelMessage, nowMs: number): boolean {
  if (message.state === "pending") return true;
  if (message.state === "failed" || message.state === "claimed") return message.dueMs! <= nowMs;
  return false;
}

/** Enqueue of `ids` (new ids become pending; known ids are left alone). */
export function applyEnqueue(model: Model, ids: readonly string[], nowMs: number): Model {
  return edit(model, (messages) => {
    for (const id of ids) {
      if (!messages.has(id)) messages.set(id, { state: "pending", attempts: 0, updatedMs: nowMs });
    }
  });
}

/** Checks what an enqueue returned: every id stored, in the state the model has. */
export function checkEnqueued(model: Model, returned: readonly OutboxMessage[], ids: string[]) {
  if (returned.length !== ids.length) {
    throw new ModelViolation(`enqueue returned ${returned.length} messages for ${ids.length}`);
  }
  returned.forEach((message, i) => {
    if (message.id !== ids[i]) throw new ModelViolation(`enqueue returned ${message.id} at ${i}`);
    const expected = model.messages.get(message.id);
    if (expected && expected.state !== message.state) {
      throw new ModelViolation(
        `enqueue of known ${message.id} returned ${message.state}, model ${expected.state}`,
      );
    }
  });
}

/**
 * A claim at `nowMs` with `leaseMs` that returned `claimed`. Checks it is a legal choice
 * (only due messages, none twice, as many as `limit` allows when nothing failed) and adopts it.
 */
export function applyClaim(
  model: Model,
  claimed: readonly OutboxMessage[],
  limit: number,
  nowMs: number,
  leaseMs: number,
  options: { complete: boolean } = { complete: true },
): { model: Model; held: HeldClaim[] } {
  const seen = new Set<string>();
  const held: HeldClaim[] = [];
  const due = [...model.messages.values()].filter((m) => isDue(m, nowMs)).length;
  for (const message of claimed) {
    const before = model.messages.get(message.id);
    if (!before) {
      throw new ModelViolation(`claim returned ${message.id}, which was never committed`);
    }
    if (seen.has(message.id)) throw new ModelViolation(`claim returned ${message.id} twice`);
    seen.add(message.id);
    if (!isDue(before, nowMs)) {
      throw new ModelViolation(
        `claim returned ${message.id} in model state ${before.state}` +
          (before.state === "claimed" ? " under a live lease (two live claims)" : ""),
      );
    }
    if (message.state !== "claimed" || message.attempts !== before.attempts + 1) {
      throw new ModelViolation(
        `claim returned ${message.id} as ${message.state}/${message.attempts}, expected claimed/${
          before.attempts + 1
        }`,
      );
    }
    if (Date.parse(message.nextAttemptAt ?? "") !== nowMs + leaseMs) {
      throw new ModelViolation(`claim of ${message.id} has lease ${message.nextAttemptAt}`);
    }
  }
  if (claimed.length > limit) throw new ModelViolation(`claim returned ${claimed.length} > limit`);
  if (options.complete && claimed.length < Math.min(limit, due)) {
    throw new ModelViolation(
      `claim returned ${claimed.length} messages, ${due} were due (limit ${limit}): committed work not found`,
    );
  }
  let token = model.nextToken;
  const next = edit(model, (messages) => {
    for (const message of claimed) {
      const m = messages.get(message.id)!;
      m.state = "claimed";
      m.attempts += 1;
      m.dueMs = nowMs + leaseMs;
      m.updatedMs = nowMs;
      m.token = token;
      m.lease = message.nextAttemptAt;
      held.push({ token, message });
      token += 1;
    }
    return claimed.length;
  });
  return { model: next, held };
}

/** How a mark relates to the stored message. */
export type MarkVerdict = "applies" | "again" | "stale";

/** Rule 1, 2 or 3 of the fence for `mark` against `model`. */
export function verdict(model: Model, mark: ModelMark, fence: FenceMode): MarkVerdict {
  const m = model.messages.get(mark.claim.message.id);
  if (!m) return "stale";
  if (m.state === "claimed") {
    if (m.token === mark.claim.token) return "applies";
    // The legacy fence (attempts + lease expiry) cannot tell an equal later claim apart.
    if (
      fence === "legacy" && m.attempts === mark.claim.message.attempts &&
      m.lease === mark.claim.message.nextAttemptAt
    ) return "applies";
    return "stale";
  }
  if (m.token === mark.claim.token && m.state === mark.state) return "again";
  return "stale";
}

/**
 * Marks settled in order (as one `markMany`, or one by one). Checks the results against the
 * fence and returns the next model. `results` undefined: the call threw and the caller resyncs.
 */
export function applyMarks(
  model: Model,
  marks: readonly ModelMark[],
  results: readonly boolean[],
  nowMs: number,
  fence: FenceMode,
): Model {
  if (results.length !== marks.length) {
    throw new ModelViolation(`markMany returned ${results.length} results for ${marks.length}`);
  }
  let current = model;
  marks.forEach((mark, i) => {
    const v = verdict(current, mark, fence);
    const id = mark.claim.message.id;
    const got = results[i];
    if (v === "applies") {
      if (!got) {
        throw new ModelViolation(
          `mark #${i} ${mark.state} of ${id} by a live claim returned false`,
        );
      }
      current = edit(current, (messages) => {
        const m = messages.get(id)!;
        m.state = mark.state;
        m.updatedMs = nowMs;
        m.dueMs = mark.state === "failed" ? mark.dueMs : undefined;
        m.lease = undefined;
      });
    } else if (v === "again") {
      if (!got && fence === "token") {
        throw new ModelViolation(
          `mark #${i} ${mark.state} of ${id}, already applied by the same claim, returned false (must be true: idempotent for its own claim)`,
        );
      }
    } else if (got) {
      throw new ModelViolation(
        `mark #${i} ${mark.state} of ${id} by a stale claim (token ${mark.claim.token}) returned true: a stale claim settled a message`,
      );
    }
  });
  return current;
}

/** Requeue of `ids` at `nowMs`: dead messages become pending with attempts 0. */
export function applyRequeue(model: Model, ids: readonly string[], nowMs: number, count?: number) {
  const dead = [...new Set(ids)].filter((id) => model.messages.get(id)?.state === "dead");
  if (count !== undefined && count !== dead.length) {
    throw new ModelViolation(`requeue returned ${count}, ${dead.length} of those ids were dead`);
  }
  return edit(model, (messages) => {
    for (const id of dead) {
      messages.set(id, { state: "pending", attempts: 0, updatedMs: nowMs });
    }
  });
}

/** Prune of dispatched / dead messages last changed before the cutoffs. */
export function applyPrune(
  model: Model,
  cutoffs: { dispatchedBefore?: number; deadBefore?: number },
  result?: { dispatched: number; dead: number },
): Model {
  const gone = { dispatched: [] as string[], dead: [] as string[] };
  for (const [id, m] of model.messages) {
    if (m.state === "dispatched" && cutoffs.dispatchedBefore !== undefined) {
      if (m.updatedMs < cutoffs.dispatchedBefore) gone.dispatched.push(id);
    }
    if (m.state === "dead" && cutoffs.deadBefore !== undefined) {
      if (m.updatedMs < cutoffs.deadBefore) gone.dead.push(id);
    }
  }
  if (
    result &&
    (result.dispatched !== gone.dispatched.length || result.dead !== gone.dead.length)
  ) {
    throw new ModelViolation(
      `prune removed ${
        JSON.stringify(result)
      }, expected dispatched ${gone.dispatched.length}, dead ${gone.dead.length}`,
    );
  }
  return edit(model, (messages) => {
    for (const id of [...gone.dispatched, ...gone.dead]) messages.delete(id);
  });
}

/** The stats the model predicts at `nowMs`. */
export function expectedStats(
  model: Model,
  nowMs: number,
): Omit<OutboxStats, "oldestDueCreatedAt" | "oldestDueAgeMs"> {
  const stats = { pending: 0, claimed: 0, failed: 0, dispatched: 0, dead: 0, due: 0 };
  for (const m of model.messages.values()) {
    stats[m.state] += 1;
    if (isDue(m, nowMs)) stats.due += 1;
  }
  return stats;
}

/**
 * After a call that threw (an injected fault), the store may have applied any part of it.
 * `observed` is what the store holds now for every id the model knows or the call named;
 * `legal(before, after)` says whether one message's change is an effect the call may have had.
 * Adopts the observed states; throws when a change is not legal.
 */
export function resync(
  model: Model,
  observed: ReadonlyMap<string, OutboxMessage | undefined>,
  legal: (
    id: string,
    before: ModelMessage | undefined,
    after: OutboxMessage | undefined,
  ) => ModelMessage | undefined | "illegal",
): Model {
  return edit(model, (messages) => {
    for (const [id, after] of observed) {
      const before = messages.get(id);
      if (sameState(before, after)) continue;
      const next = legal(id, before, after);
      if (next === "illegal") {
        throw new ModelViolation(
          `after a failed call ${id} went from ${describe(before)} to ${describeStored(after)}`,
        );
      }
      if (next) messages.set(id, next);
      else messages.delete(id);
    }
  });
}

/** Whether the stored message is in the model's state (state and attempts). */
export function sameState(model: ModelMessage | undefined, stored: OutboxMessage | undefined) {
  if (!model || !stored) return !model && !stored;
  return model.state === stored.state && model.attempts === stored.attempts;
}

/** "state/attempts" or "absent". */
export function describe(m: ModelMessage | undefined): string {
  return m ? `${m.state}/${m.attempts}` : "absent";
}

/** "state/attempts" or "absent", for a stored message. */
export function describeStored(m: OutboxMessage | undefined): string {
  return m ? `${m.state}/${m.attempts}` : "absent";
}
