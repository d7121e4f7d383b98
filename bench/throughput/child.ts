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

/** Runs `fn`; returns its wall-clock duration and the CPU time this process used meanwhile. */
export async function timed(
  fn: () => Promise<void>,
): Promise<{ seconds: number; cpuSeconds: number }> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  await fn();
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  return { seconds, cpuSeconds: (used.user + used.system) / 1e6 };
}
