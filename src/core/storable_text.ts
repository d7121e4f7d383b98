/**
 * Text every store can keep: a mark's `error` and a job's `outcome`.
 *
 * Postgres `text` and `jsonb` cannot hold NUL characters, and its `json` parser refuses lone
 * surrogates; SQLite cuts text at a NUL. A failure message or a job outcome comes from code the
 * library does not control (a job handler's error or return value), so the stores must not fail,
 * or silently cut, on one: an error text is normalised, an outcome that cannot be stored as
 * written is refused with a typed error before anything is sent.
 *
 * @module
 */

import { OutboxValidationError } from "./errors.ts";

/**
 * An error text as the stores keep it: each NUL character and each lone surrogate replaced by
 * U+FFFD (the replacement character). Text without them comes back unchanged.
 *
 * @example
 * ```ts
 * import { storableErrorText } from "./storable_text.ts";
 * console.log(storableErrorText("bad\u0000byte")); // "bad\uFFFDbyte"
 * ```
 */
export function storableErrorText(text: string): string {
  const wellFormed = text.isWellFormed() ? text : text.toWellFormed();
  return wellFormed.includes("\u0000") ? wellFormed.replaceAll("\u0000", "\uFFFD") : wellFormed;
}

/**
 * A job outcome as JSON text every store can keep, or an {@linkcode OutboxValidationError}
 * (field `outcome`, the reason as `cause` where there is one) when it has none: a value
 * `JSON.stringify` refuses (a `bigint`, a cycle) or turns into nothing (`undefined`, a
 * function), or a string or object key with a NUL character or a lone surrogate.
 *
 * @example
 * ```ts
 * import { storableOutcome } from "./storable_text.ts";
 * console.log(storableOutcome({ jobId: "j-1" })); // '{"jobId":"j-1"}'
 * try {
 *   storableOutcome({ note: "a\u0000b" });
 * } catch (error) {
 *   console.log((error as Error).name); // "OutboxValidationError"
 * }
 * ```
 */
export function storableOutcome(value: unknown): string {
  let bad: string | undefined;
  let text: string | undefined;
  try {
    text = JSON.stringify(value, function (key, item) {
      if (bad === undefined) {
        if (!storable(key)) bad = `the key ${JSON.stringify(key)}`;
        else if (typeof item === "string" && !storable(item)) {
          bad = `the string ${JSON.stringify(item)}`;
        }
      }
      return item;
    });
  } catch (error) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome is not JSON: ${error instanceof Error ? error.message : String(error)}`,
      { cause: error },
    );
  }
  if (text === undefined) {
    throw new OutboxValidationError("outcome", "Outbox outcome is not JSON (nothing to store)");
  }
  if (bad !== undefined) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome cannot be stored: ${bad} holds a NUL character or a lone surrogate`,
    );
  }
  return text;
}

function storable(text: string): boolean {
  return !text.includes("\u0000") && text.isWellFormed();
}
