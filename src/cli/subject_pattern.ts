/**
 * NATS subject wildcards for `requeue --subject`: `*` matches one token, `>` one or more
 * trailing tokens.
 *
 * @module
 */

import { CliUsageError } from "./errors.ts";

/**
 * Compiles a subject pattern into a predicate. Throws {@linkcode CliUsageError} for an invalid
 * pattern (empty tokens, `>` not last, wildcards inside a token).
 */
export function subjectMatcher(pattern: string): (subject: string) => boolean {
  const tokens = pattern.split(".");
  const valid = pattern.length > 0 &&
    tokens.every((token, index) =>
      token.length > 0 && !/\s/.test(token) &&
      (token === "*" || token === ">" || !/[*>]/.test(token)) &&
      (token !== ">" || index === tokens.length - 1)
    );
  if (!valid) {
    throw new CliUsageError(
      `--subject: invalid subject pattern ${
        JSON.stringify(pattern)
      }; use dot-separated tokens with * (one token) or a final > (the rest)`,
    );
  }
  return (subject: string) => {
    const parts = subject.split(".");
    for (let i = 0; i < tokens.length; i++) {
      const token = tokens[i];
      if (token === ">") return parts.length > i;
      if (i >= parts.length) return false;
      if (token !== "*" && token !== parts[i]) return false;
    }
    return parts.length === tokens.length;
  };
}
