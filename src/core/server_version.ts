/**
 * nats-server versions, for the few behaviours that differ between release lines.
 *
 * @module
 */

/**
 * The first nats-server version that honours a reason on a terminate ack (`+TERM <reason>`,
 * reported in the `MSG_TERMINATED` advisory). Earlier servers ignore such an ack entirely, so the
 * message would be redelivered.
 *
 * @example
 * ```ts
 * import { termReasonSinceVersion } from "@outbox/nats";
 * console.log(termReasonSinceVersion); // "2.10.4"
 * ```
 */
export const termReasonSinceVersion = "2.10.4";

/**
 * Whether the server `version` (as `nc.info.version` reports it, e.g. `"2.15.1"`,
 * `"2.11.0-beta.2"`; a pre-release suffix is ignored) is at least `minimum`. An unknown or unparsable version is never "at least"
 * anything: callers fall back to what every supported server does.
 *
 * @example
 * ```ts
 * import { serverVersionAtLeast } from "@outbox/nats";
 * console.log(serverVersionAtLeast("2.9.10", "2.10.4")); // false
 * console.log(serverVersionAtLeast("2.15.1", "2.10.4")); // true
 * ```
 */
export function serverVersionAtLeast(version: string | undefined, minimum: string): boolean {
  const have = parse(version);
  const need = parse(minimum);
  if (!have || !need) return false;
  for (let i = 0; i < 3; i++) {
    if (have[i] !== need[i]) return have[i] > need[i];
  }
  return true;
}

function parse(version: string | undefined): [number, number, number] | undefined {
  const match = typeof version === "string" ? /^v?(\d+)\.(\d+)\.(\d+)/.exec(version.trim()) : null;
  return match ? [Number(match[1]), Number(match[2]), Number(match[3])] : undefined;
}
