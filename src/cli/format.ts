/**
 * Text formatting for the CLI: durations (`7d`, `12h`, `30m`, `1h30m`), ages, tables, and store
 * URLs with their password hidden.
 *
 * @module
 */

import { CliUsageError } from "./errors.ts";

const unitMs: Record<string, number> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 604_800_000,
};

/**
 * Parses a duration such as `500ms`, `30s`, `30m`, `12h`, `7d`, `2w` or a combination
 * (`1h30m`) into milliseconds. Throws {@linkcode CliUsageError} naming `option` otherwise.
 */
export function parseDuration(text: string, option: string): number {
  const trimmed = text.trim();
  const part = /(\d+(?:\.\d+)?)(ms|s|m|h|d|w)/gy;
  let total = 0;
  let matched = 0;
  let match: RegExpExecArray | null;
  while ((match = part.exec(trimmed)) !== null) {
    total += Number(match[1]) * unitMs[match[2]];
    matched = part.lastIndex;
  }
  if (trimmed.length === 0 || matched !== trimmed.length || !Number.isFinite(total)) {
    throw new CliUsageError(
      `${option}: invalid duration ${JSON.stringify(text)}; use a number with a unit ` +
        "(ms, s, m, h, d, w), for example 30s, 12h, 7d or 1h30m",
    );
  }
  return Math.round(total);
}

/** Whether `text` is a duration {@linkcode parseDuration} accepts. */
export function isDuration(text: string): boolean {
  return /^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$/.test(text.trim());
}

/**
 * A duration for people: the two largest units (`3d 4h`, `12m 5s`, `4.2s`, `850ms`).
 */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "-";
  const sign = ms < 0 ? "-" : "";
  const value = Math.abs(ms);
  if (value < 1_000) return `${sign}${Math.round(value)}ms`;
  if (value < 60_000) {
    const tenths = Math.floor(value / 100);
    return `${sign}${tenths % 10 === 0 ? tenths / 10 : (tenths / 10).toFixed(1)}s`;
  }
  const sizes: Array<[string, number]> = [
    ["d", 86_400_000],
    ["h", 3_600_000],
    ["m", 60_000],
    ["s", 1_000],
  ];
  let rest = value;
  const counts = sizes.map(([, size]) => {
    const count = Math.floor(rest / size);
    rest -= count * size;
    return count;
  });
  const first = counts.findIndex((count) => count > 0);
  const parts = [`${counts[first]}${sizes[first][0]}`];
  if (first + 1 < sizes.length && counts[first + 1] > 0) {
    parts.push(`${counts[first + 1]}${sizes[first + 1][0]}`);
  }
  return sign + parts.join(" ");
}

/** The age of an ISO timestamp at `now`, formatted; `-` when absent or unparsable. */
export function formatAge(iso: string | undefined, now: Date): string {
  if (iso === undefined) return "-";
  const time = Date.parse(iso);
  if (!Number.isFinite(time)) return "-";
  return formatDuration(Math.max(0, now.getTime() - time));
}

/** A rate with one decimal (`1234.5/s`). */
export function formatRate(count: number, ms: number): string {
  if (ms <= 0) return "0.0/s";
  return `${(count / (ms / 1_000)).toFixed(1)}/s`;
}

/** Options of {@linkcode formatTable}. */
export interface TableOptions {
  /** Columns aligned to the right (numbers). */
  right?: readonly number[];
  /** Widest a column may be; longer cells are cut with `…`. */
  maxWidth?: Readonly<Record<number, number>>;
}

/**
 * Lays out rows under a header, columns separated by two spaces. Newlines and tabs in cells
 * become spaces, so every row stays one line.
 */
export function formatTable(
  header: readonly string[],
  rows: readonly (readonly string[])[],
  options: TableOptions = {},
): string {
  const clean = (cell: string, column: number) => {
    const flat = cell.replace(/[\r\n\t]+/g, " ");
    const max = options.maxWidth?.[column];
    return max !== undefined && flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
  };
  const all = [header, ...rows].map((row) => row.map(clean));
  const widths = header.map((_, column) => Math.max(...all.map((row) => row[column]?.length ?? 0)));
  const right = new Set(options.right ?? []);
  return all.map((row) =>
    row.map((cell, column) => {
      if (column === row.length - 1 && !right.has(column)) return cell;
      return right.has(column) ? cell.padStart(widths[column]) : cell.padEnd(widths[column]);
    }).join("  ").trimEnd()
  ).join("\n") + "\n";
}

/** A store or server URL with its password replaced by `***`, for output and errors. */
export function redactUrl(url: string): string {
  if (/^(nats|tls|wss?):/i.test(url.trim())) return redactNatsUrl(url);
  try {
    const parsed = new URL(url);
    if (parsed.password === "") return url;
    parsed.password = "***";
    return parsed.toString();
  } catch {
    return url.replace(/\/\/([^:/@]+):[^@/]*@/, "//$1:***@");
  }
}

/**
 * A NATS server URL (or a comma-separated list) with its credentials hidden: a password, and a
 * user name that stands alone (NATS reads `nats://<token>@host` as a token).
 */
export function redactNatsUrl(url: string): string {
  return url.split(",").map((one) => {
    const text = one.trim();
    const match = /^([A-Za-z][A-Za-z0-9+.-]*:\/\/)?([^@/]*)@(.*)$/s.exec(text);
    if (!match) return text;
    const [, scheme = "", auth, rest] = match;
    const colon = auth.indexOf(":");
    const shown = colon < 0 ? "***" : `${auth.slice(0, colon)}:***`;
    return `${scheme}${shown}@${rest}`;
  }).join(",");
}
