/**
 * Splits V8 CPU profiles (`.cpuprofile`, as `deno run --cpu-prof` writes them) of throughput
 * scenario processes into components, so CPU per message can be charged to the publish path,
 * the store, the batch engine and the rest.
 *
 * Usage: `deno run -A bench/profile_summary.ts [--cpu-us=<µs per message>] <file.cpuprofile>...`
 * (for example after `BENCH_CHILD_FLAGS="--cpu-prof --cpu-prof-dir=.tmp/prof" deno task
 * bench:throughput --only=pg --rounds=1`). Each sample is charged to the frame nearest its leaf
 * that belongs to a known component; native frames (the driver's C++ code, `JSON.parse`, the
 * regexp engine) are charged to the library frame that called them. Idle samples are left out.
 * Components:
 *
 * - publish: `src/runtime/` and nats.js (`@nats-io/*`);
 * - store: `src/stores/`, `src/core/` (rebuilding the prepared event from a row parses its
 *   payload) and the database driver (`postgres`, `pg`);
 * - engine: `src/dispatch/`;
 * - other: the scenario script, GC and the Deno runtime outside any of them.
 *
 * With `--cpu-us`, each share is also shown as µs per message (share x the measured CPU per
 * message the throughput script prints).
 *
 * @module
 */

import { parseArgs } from "node:util";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string };
  children?: number[];
}

interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

type Component = "publish" | "store" | "engine" | "other";

function componentOf(url: string): Component | undefined {
  if (url.includes("/src/runtime/") || url.includes("@nats-io")) return "publish";
  if (
    url.includes("/src/stores/") || url.includes("/src/core/") ||
    /\/postgres\/\d|\/postgres@|\/pg@|\/pg\/\d|\/pg-protocol|\/pg-types/.test(url)
  ) {
    return "store";
  }
  if (url.includes("/src/dispatch/")) return "engine";
  return undefined;
}

/** Sample counts per component of one profile (idle left out). */
export function summarize(profile: Profile): Record<Component | "gc", number> {
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const node of profile.nodes) {
    byId.set(node.id, node);
    for (const child of node.children ?? []) parent.set(child, node.id);
  }
  const cache = new Map<number, Component | "gc" | "idle">();
  const classify = (id: number): Component | "gc" | "idle" => {
    const known = cache.get(id);
    if (known) return known;
    const node = byId.get(id)!;
    const name = node.callFrame.functionName;
    let result: Component | "gc" | "idle";
    if (name === "(idle)") result = "idle";
    else if (name === "(garbage collector)") result = "gc";
    else {
      let current: number | undefined = id;
      let found: Component | undefined;
      while (current !== undefined && found === undefined) {
        found = componentOf(byId.get(current)!.callFrame.url);
        current = parent.get(current);
      }
      result = found ?? "other";
    }
    cache.set(id, result);
    return result;
  };
  const counts = { publish: 0, store: 0, engine: 0, other: 0, gc: 0 };
  for (const sample of profile.samples) {
    const component = classify(sample);
    if (component !== "idle") counts[component] += 1;
  }
  return counts;
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    options: { "cpu-us": { type: "string" } },
    allowPositionals: true,
  });
  const cpuUs = values["cpu-us"] === undefined ? undefined : Number(values["cpu-us"]);
  console.log("| profile | samples | publish | store | engine | other | of which GC |");
  console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
  for (const file of positionals) {
    const counts = summarize(JSON.parse(await Deno.readTextFile(file)) as Profile);
    const total = counts.publish + counts.store + counts.engine + counts.other + counts.gc;
    const cell = (n: number) => {
      const share = n / total;
      return cpuUs === undefined
        ? `${(share * 100).toFixed(1)}%`
        : `${(share * cpuUs).toFixed(1)} (${(share * 100).toFixed(0)}%)`;
    };
    console.log(
      `| ${file.split("/").pop()} | ${total} | ${cell(counts.publish)} | ${cell(counts.store)} | ${
        cell(counts.engine)
      } | ${cell(counts.other + counts.gc)} | ${cell(counts.gc)} |`,
    );
  }
}
