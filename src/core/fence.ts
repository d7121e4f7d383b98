/**
 * The fence of a mark: claim tokens and the one decision every store makes when a mark arrives
 * (apply it, report it as already applied by the same claim, or report it superseded). The SQL
 * stores make the same decision in SQL; the rules are documented on `OutboxClaim`.
 *
 * @module
 */

import type { OutboxClaim, OutboxState } from "./types.ts";

/**
 * A fresh claim token: opaque, unique per claim (a random UUID). One claim call may give the
 * same token to all the messages it claims; a mark always names its message id too.
 *
 * @example
 * ```ts
 * import { newClaimToken } from "@outbox/nats";
 * console.log(newClaimToken().length); // 36
 * ```
 */
export function newClaimToken(): string {
  return crypto.randomUUID();
}

/**
 * What a store does with a mark.
 *
 * @example
 * ```ts
 * import type { FenceVerdict } from "@outbox/nats";
 * const verdict: FenceVerdict = "applied"; // report true, write nothing
 * ```
 */
export type FenceVerdict =
  /** The claim holds: write the mark. */
  | "apply"
  /** This claim already settled the message to the mark's state: report `true`, write nothing. */
  | "applied"
  /** Someone else holds or settled the message: report `false`, write nothing. */
  | "superseded";

/**
 * What the fence reads of a stored message.
 *
 * @example
 * ```ts
 * import type { FencedState } from "@outbox/nats";
 * const stored: FencedState = { state: "claimed", attempts: 1, claimToken: "t-1" };
 * ```
 */
export interface FencedState {
  /** The stored state. */
  state: OutboxState;
  /** The stored attempts. */
  attempts: number;
  /** The stored lease expiry or due time (compared only for claims without a token). */
  nextAttemptAt?: string;
  /** The token of the latest claim. */
  claimToken?: string;
}

/**
 * The verdict for a mark of `claim` to `target` against the stored message (see the rules on
 * `OutboxClaim`), for stores written outside this package. `undefined` stored (unknown id) is
 * superseded.
 *
 * @example
 * ```ts
 * import { fenceVerdict } from "@outbox/nats";
 * const stored = { state: "dispatched" as const, attempts: 1, claimToken: "t-1" };
 * fenceVerdict(stored, { id: "m-1", attempts: 1, claimToken: "t-1" }, "dispatched"); // "applied"
 * fenceVerdict(stored, { id: "m-1", attempts: 1, claimToken: "t-1" }, "dead"); // "superseded"
 * ```
 */
export function fenceVerdict(
  stored: FencedState | undefined,
  claim: OutboxClaim,
  target: "dispatched" | "failed" | "dead",
): FenceVerdict {
  if (!stored) return "superseded";
  const token = claim?.claimToken;
  if (token !== undefined) {
    if (
      typeof token !== "string" || stored.claimToken !== token ||
      stored.attempts !== claim.attempts
    ) {
      return "superseded";
    }
    if (stored.state === "claimed") return "apply";
    return stored.state === target ? "applied" : "superseded";
  }
  return stored.state === "claimed" && stored.attempts === claim.attempts &&
      (claim.nextAttemptAt === undefined || claim.nextAttemptAt === stored.nextAttemptAt)
    ? "apply"
    : "superseded";
}
