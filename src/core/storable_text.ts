/**
 * Text every store can keep: a mark's `error` and a job's `outcome`.
 *
 * Postgres `text` and `jsonb` cannot hold NUL characters, and its `json` parser refuses lone
 * surrogates; SQLite cuts text at a NUL. A failure message or a job outcome comes from code the
 * library does not control (a job handler's error or return value), so the stores must not fail,
 * or silently cut, on one: an error text is normalised and bounded, an outcome that cannot be
 * stored as written is refused with a typed error before anything is sent.
 *
 * @module
 */

import { errorMessage, OutboxValidationError } from "./errors.ts";
import type { JsonValue, OutboxMark } from "./types.ts";

/**
 * Longest error text (`lastError`) kept, in UTF-16 code units; a longer one is cut and ends in
 * "…". The NATS KV store keeps less (1 KiB of JSON per record).
 *
 * @example
 * ```ts
 * import { maxErrorTextLength } from "./storable_text.ts";
 * console.log(maxErrorTextLength); // 8192
 * ```
 */
export const maxErrorTextLength = 8192;

/**
 * Largest job outcome kept, in UTF-8 bytes of its JSON text (64 KiB: the room a record keeps
 * next to the largest payload, see `defaultMaxPayloadBytes`).
 *
 * @example
 * ```ts
 * import { maxOutcomeBytes } from "./storable_text.ts";
 * console.log(maxOutcomeBytes); // 65536
 * ```
 */
export const maxOutcomeBytes = 64 * 1024;

/**
 * Deepest nesting of arrays and objects a job outcome may have.
 *
 * @example
 * ```ts
 * import { maxOutcomeDepth } from "./storable_text.ts";
 * console.log(maxOutcomeDepth); // 256
 * ```
 */
export const maxOutcomeDepth = 256;

/**
 * An error text as the stores keep it: anything that is not a string turned into text as
 * `errorMessage` does (never throws), cut to {@linkcode maxErrorTextLength} code units (ending
 * in "…", never between the halves of a surrogate pair), and each NUL character and lone
 * surrogate replaced by U+FFFD (the replacement character). Short well-formed text without NUL
 * comes back unchanged.
 *
 * @example
 * ```ts
 * import { storableErrorText } from "./storable_text.ts";
 * console.log(storableErrorText("bad\u0000byte")); // "bad\uFFFDbyte"
 * ```
 */
export function storableErrorText(error: unknown): string {
  let text = typeof error === "string" ? error : errorMessage(error);
  if (text.length > maxErrorTextLength) {
    let end = maxErrorTextLength - 1;
    const last = text.charCodeAt(end - 1);
    if (last >= 0xd800 && last <= 0xdbff) end -= 1; // keep a pair whole
    text = `${text.slice(0, end)}…`;
  }
  if (!text.isWellFormed()) text = text.toWellFormed();
  return text.includes("\u0000") ? text.replaceAll("\u0000", "\uFFFD") : text;
}

/**
 * A job outcome as JSON text every store can keep, or an {@linkcode OutboxValidationError}
 * (field `outcome`, the reason as `cause` where there is one) when it has none: a value
 * `JSON.stringify` refuses (a `bigint`, a cycle, a `toJSON` that throws) or turns into nothing
 * (`undefined`, a function), a string or object key with a NUL character or a lone surrogate,
 * more than {@linkcode maxOutcomeDepth} levels of nesting, or more than
 * {@linkcode maxOutcomeBytes} bytes. Pass on `JSON.parse` of the text, not the value: the value
 * may change after the check (getters, a handler that keeps a reference).
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
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome is not JSON: ${errorMessage(error)}`,
      { cause: error },
    );
  }
  if (typeof text !== "string") {
    throw new OutboxValidationError("outcome", "Outbox outcome is not JSON (nothing to store)");
  }
  // Every code unit is at least one UTF-8 byte: a text this long is too large, whatever it holds.
  if (text.length > maxOutcomeBytes) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome is ${text.length} characters of JSON, more than ${maxOutcomeBytes} bytes`,
    );
  }
  // JSON.stringify writes NUL as \u0000 and a lone surrogate as \udXXX (a pair stays as its
  // two characters); an escape counts only after an even number of backslashes.
  if (/(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f][0-9a-f]{2})/i.test(text)) {
    throw new OutboxValidationError(
      "outcome",
      "Outbox outcome cannot be stored: a string or key holds a NUL character or a lone surrogate",
    );
  }
  // A code unit is at most 3 UTF-8 bytes (a surrogate pair: 4 for 2): count only near the limit.
  const bytes = text.length * 3 <= maxOutcomeBytes ? 0 : utf8Bytes(text);
  if (bytes > maxOutcomeBytes) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome is ${bytes} bytes of JSON, more than ${maxOutcomeBytes}`,
    );
  }
  if (nesting(text) > maxOutcomeDepth) {
    throw new OutboxValidationError(
      "outcome",
      `Outbox outcome is nested more than ${maxOutcomeDepth} levels deep`,
    );
  }
  return text;
}

/** The deepest nesting of `[` / `{` in JSON text (outside strings). */
function nesting(json: string): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > deepest) deepest = depth;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return deepest;
}

function utf8Bytes(text: string): number {
  let bytes = text.length;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x80) bytes += c >= 0x800 ? (c >= 0xd800 && c <= 0xdfff ? 1 : 2) : 1;
  }
  return bytes;
}

/**
 * A mark as every store records it: the error text through {@linkcode storableErrorText}, the
 * outcome as a copy of its checked JSON ({@linkcode storableOutcome}, which throws
 * `OutboxValidationError`). Anything that is not a mark comes back as it is (a store then
 * applies nothing for it). Stores call it for every mark of a batch before applying any.
 *
 * @example
 * ```ts
 * import { storableMark } from "./storable_text.ts";
 * const mark = storableMark({
 *   claim: { id: "a", attempts: 1 },
 *   state: "dead",
 *   error: "bad\u0000byte",
 * });
 * console.log(mark.state === "dead" && mark.error); // "bad\uFFFDbyte"
 * ```
 */
export function storableMark(mark: OutboxMark): OutboxMark {
  if (mark === null || typeof mark !== "object") return mark;
  switch (mark.state) {
    case "failed":
    case "dead":
      return { ...mark, error: storableErrorText(mark.error) };
    case "dispatched":
      return mark.outcome === undefined
        ? mark
        : { ...mark, outcome: JSON.parse(storableOutcome(mark.outcome)) as JsonValue };
    default:
      return mark;
  }
}
