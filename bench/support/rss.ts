/**
 * Resident memory of this process, from /proc/self/status (Linux): `VmRSS` now and `VmHWM`, the
 * peak since the process started. Elsewhere both are `undefined`.
 *
 * @module
 */

function field(name: "VmRSS" | "VmHWM"): number | undefined {
  try {
    const status = Deno.readTextFileSync("/proc/self/status");
    const match = status.match(new RegExp(`^${name}:\\s+(\\d+) kB`, "m"));
    return match ? Number(match[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** Current resident set size in bytes. */
export function currentRss(): number | undefined {
  return field("VmRSS");
}

/** Peak resident set size of this process so far, in bytes. */
export function peakRss(): number | undefined {
  return field("VmHWM");
}

/** Bytes as MB (10^6), one decimal. */
export function mb(bytes: number | undefined): string {
  return bytes === undefined ? "n/a" : (bytes / 1e6).toFixed(1);
}
