/**
 * Timestamps as drivers return them, normalised to ISO-8601 strings.
 *
 * @module
 */

/**
 * Default claim lease: how long a claimed message is exclusive to its claimer.
 *
 * @example
 * ```ts
 * import { defaultLeaseMs } from "@outbox/nats";
 * console.log(defaultLeaseMs); // 30000
 * ```
 */
export const defaultLeaseMs = 30_000;

/**
 * Normalises a timestamp from any driver (`Date`, ISO or SQL text, epoch milliseconds as number
 * or bigint) to `Date#toISOString()` form. SQL text without a zone (SQLite's `CURRENT_TIMESTAMP`)
 * is UTC. Returns `undefined` for something that is not a valid time.
 *
 * @example
 * ```ts
 * import { toIsoTimestamp } from "@outbox/nats";
 * toIsoTimestamp(new Date(0)); // "1970-01-01T00:00:00.000Z"
 * toIsoTimestamp("2026-01-01 10:00:00+00"); // "2026-01-01T10:00:00.000Z"
 * toIsoTimestamp(0n); // "1970-01-01T00:00:00.000Z"
 * ```
 */
export function toIsoTimestamp(value: unknown): string | undefined {
  let date: Date;
  if (value instanceof Date) date = value;
  else if (typeof value === "number") date = new Date(value);
  else if (typeof value === "bigint") date = new Date(Number(value));
  else if (typeof value === "string") {
    if (isoPattern.test(value) && Number.isFinite(Date.parse(value))) return value;
    date = new Date(sqlTimestamp.test(value) ? fromSqlText(value) : value);
  } else return undefined;
  const time = date.getTime();
  return Number.isFinite(time) ? date.toISOString() : undefined;
}

const isoPattern = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const sqlTimestamp =
  /^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([zZ]|[+-]\d{2}(:?\d{2})?)?$/;

/** `2026-01-02 03:04:05.006+00` (Postgres text) or `2026-01-02 03:04:05` (SQLite, UTC). */
function fromSqlText(value: string): string {
  const text = value.replace(" ", "T");
  if (/[zZ]$/.test(text)) return text;
  const zone = /([+-]\d{2})(:?(\d{2}))?$/.exec(text);
  if (!zone) return `${text}Z`;
  return `${text.slice(0, zone.index)}${zone[1]}:${zone[3] ?? "00"}`;
}

/** The latest time the stores keep: the end of year 9999 (Postgres reads no later ISO text). */
export const latestStoredTime: number = Date.UTC(9999, 11, 31, 23, 59, 59, 999);

/**
 * `now + ms` as a `Date`, at most {@linkcode latestStoredTime} (a retry delay or lease so long
 * it would pass it is due then: no store could keep the later time).
 */
export function addMs(now: Date, ms: number): Date {
  return new Date(Math.min(now.getTime() + ms, latestStoredTime));
}
