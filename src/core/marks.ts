/**
 * Settling claims: the batch path when a store has `markMany`, one mark at a time otherwise.
 *
 * @module
 */

import type { OutboxMark, OutboxRepository } from "./types.ts";

/**
 * Applies `marks` through `repository.markMany` when the store has it, else one by one with
 * `markDispatched` / `markFailed` / `markDead`. Returns one boolean per mark: `false` means the
 * claim had been superseded and the mark changed nothing.
 *
 * `answered`, when given, makes the one-by-one path resumable: it holds one entry per mark,
 * filled in as each mark is answered, and a mark that already has an answer (from an earlier
 * call that threw halfway) is not sent again. So a caller that retries after an error counts
 * every mark exactly once, even on a store whose marks cannot recognise their own earlier
 * success (claims without a `claimToken`). `markMany` is always called with the whole batch
 * (a store's `markMany` reports marks it had applied before as `true`, see `OutboxClaim`).
 *
 * @example
 * ```ts
 * import { applyMarks, MemoryOutboxRepository } from "@outbox/nats";
 * const outbox = new MemoryOutboxRepository();
 * await outbox.enqueue({ id: "a", kind: "event.publish", name: "n", subject: "s.a", payload: "{}", headers: {} });
 * const [claim] = await outbox.claimDue(1, new Date());
 * const [ok] = await applyMarks(outbox, [{ claim, state: "dispatched" }], new Date());
 * ```
 */
export async function applyMarks(
  repository: OutboxRepository,
  marks: readonly OutboxMark[],
  now: Date,
  answered: Array<boolean | undefined> = [],
): Promise<boolean[]> {
  if (marks.length === 0) return [];
  if (repository.markMany) return await repository.markMany(marks, now);
  for (let index = 0; index < marks.length; index++) {
    if (answered[index] !== undefined) continue;
    answered[index] = await applyOne(repository, marks[index], now);
  }
  return answered.slice(0, marks.length) as boolean[];
}

async function applyOne(
  repository: OutboxRepository,
  mark: OutboxMark,
  now: Date,
): Promise<boolean> {
  switch (mark.state) {
    case "dispatched":
      return mark.sequence === undefined
        ? await repository.markDispatched(mark.claim, now, mark.outcome)
        : await repository.markDispatched(mark.claim, now, mark.outcome, {
          sequence: mark.sequence,
        });
    case "failed":
      return await repository.markFailed(mark.claim, {
        error: mark.error,
        nextAttemptAt: mark.nextAttemptAt,
        now,
      });
    case "dead":
      return await repository.markDead(mark.claim, { error: mark.error, now });
  }
}
