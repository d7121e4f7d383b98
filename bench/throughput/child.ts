/**
 * The protocol between the throughput script and its scenario subprocesses: the scenario reads
 * its configuration (JSON) from its first argument and prints ONE JSON result line, prefixed so
 * the parent can find it among other output. Each scenario runs in its own process so its peak
 * RSS (`VmHWM`) is its own.
 *
 * @module
 */

import process from "node:process";
import { peakRss } from "../support/rss.ts";

/** Prefix of the result line. */
export const resultPrefix = "@@result ";

/** What every scenario reports. */
export interface ScenarioResult {
  /** Messages handled in the timed section. */
  messages: number;
  /** Seconds of the timed section. */
  seconds: number;
  /** CPU time (user + system) this process used in the timed section, seconds. */
  cpuSeconds?: number;
  /**
   * CPU time of the process's main thread (the one running JavaScript, which publishes) in the
   * timed section, seconds (Linux: /proc schedstat; absent elsewhere). With a worker-thread
   * executor, `cpuSeconds` also counts the worker; this does not.
   */
  mainThreadCpuSeconds?: number;
  /** Peak RSS of the scenario process, bytes. */
  peakRss?: number;
  /** Anything else worth printing. */
  [extra: string]: unknown;
}

/** The scenario's configuration. */
export function readConfig<T>(): T {
  return JSON.parse(Deno.args[0] ?? "{}") as T;
}

/** Prints the result line (adds the peak RSS). */
export function report(result: ScenarioResult): void {
  console.log(resultPrefix + JSON.stringify({ ...result, peakRss: peakRss() }));
}

/** CPU nanoseconds the main thread has run (Linux), else `undefined`. */
function mainThreadCpuNs(): number | undefined {
  try {
    // The main thread's id is the process id; schedstat's first field is its run time in ns.
    const text = Deno.readTextFileSync(`/proc/self/task/${Deno.pid}/schedstat`);
    return Number(text.split(" ")[0]);
  } catch {
    return undefined;
  }
}

/**
 * Runs `fn`; returns its wall-clock duration and the CPU time this process (all threads) and its
 * main thread used meanwhile.
 */
export async function timed(
  fn: () => Promise<void>,
): Promise<{ seconds: number; cpuSeconds: number; mainThreadCpuSeconds?: number }> {
  const cpu = process.cpuUsage();
  const main = mainThreadCpuNs();
  const started = performance.now();
  await fn();
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  const mainEnd = mainThreadCpuNs();
  return {
    seconds,
    cpuSeconds: (used.user + used.system) / 1e6,
    mainThreadCpuSeconds: main === undefined || mainEnd === undefined
      ? undefined
      : (mainEnd - main) / 1e9,
  };
}
