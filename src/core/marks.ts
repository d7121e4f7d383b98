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
): Promise<boolean[]> {
  if (marks.length === 0) return [];
  if (repository.markMany) return await repository.markMany(marks, now);
  const results: boolean[] = [];
  for (const mark of marks) {
    switch (mark.state) {
      case "dispatched":
        results.push(await repository.markDispatched(mark.claim, now, mark.outcome));
        break;
      case "failed":
        results.push(
          await repository.markFailed(mark.claim, {
            error: mark.error,
            nextAttemptAt: mark.nextAttemptAt,
            now,
          }),
        );
        break;
      case "dead":
        results.push(await repository.markDead(mark.claim, { error: mark.error, now }));
        break;
    }
  }
  return results;
}
