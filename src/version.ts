/**
 * The package's name and version (kept equal to deno.json by a test), for telemetry scopes.
 *
 * @module
 */

/** Package name. */
export const packageName = "@outbox/nats";
/** Package version. */
export const packageVersion = "0.1.0";
