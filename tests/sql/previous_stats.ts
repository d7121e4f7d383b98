/**
 * The `stats` statement of the previous release (b2a228d, schema version 5), verbatim for an
 * outbox table `o`: it counts the active rows through `FROM <outbox> WHERE state IN ('pending',
 * 'claimed', 'failed')`, which version 2's claim index served. A relay of that release keeps
 * running it against version 6 tables during a rolling upgrade.
 *
 * @module
 */

import type { SqlDialect } from "../../mod.ts";

/** The previous release's `stats` text (parameter: now). */
export function previousStatsSql(dialect: SqlDialect, o: string): string {
  return dialect === "postgres"
    ? `SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE key_head AND (next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz)) AS due, to_char((min(created_at) FILTER (WHERE key_head AND (next_attempt_at IS NULL OR next_attempt_at <= $1::timestamptz))) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS oldest_due, (SELECT count(*) FROM ${o} WHERE state = 'dispatched') AS dispatched, (SELECT count(*) FROM ${o} WHERE state = 'dead') AS dead, (SELECT count(*) FROM ${o} WHERE key_head AND ordering_key IS NOT NULL AND state IN ('dispatched', 'dead') AND state = 'dead') AS blocked_keys FROM ${o} WHERE state IN ('pending', 'claimed', 'failed')`
    : `SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'claimed') AS claimed, count(*) FILTER (WHERE state = 'failed') AS failed, count(*) FILTER (WHERE key_head AND (next_attempt_at IS NULL OR next_attempt_at <= ?1)) AS due, min(created_at) FILTER (WHERE key_head AND (next_attempt_at IS NULL OR next_attempt_at <= ?1)) AS oldest_due, (SELECT count(*) FROM ${o} WHERE state IN ('dispatched', 'dead') AND state = 'dispatched') AS dispatched, (SELECT count(*) FROM ${o} WHERE state IN ('dispatched', 'dead') AND state = 'dead') AS dead, (SELECT count(*) FROM ${o} INDEXED BY ${o}_key_held_idx WHERE key_head AND ordering_key IS NOT NULL AND state IN ('dispatched', 'dead') AND state = 'dead') AS blocked_keys FROM ${o} WHERE state IN ('pending', 'claimed', 'failed')`;
}
