/**
 * `outbox-nats status`: counts per state, due now, oldest due age; `--json`; `--watch`.
 *
 * @module
 */

import type { OutboxStats } from "../../mod.ts";
import { type Command, durationValue, storeSettings } from "./args.ts";
import { CliUsageError, describeError } from "./errors.ts";
import { formatDuration, isDuration } from "./format.ts";
import type { CliIo } from "./io.ts";
import { onShutdownSignals } from "./signals.ts";
import { openStore } from "./store.ts";

/** The JSON form of `status` (one object; one per line with `--watch`). */
export interface StatusReport extends OutboxStats {
  /** The store (password hidden). */
  store: string;
  /** When the figures were taken. */
  at: string;
}

/** The text form of a status report. */
export function formatStatus(report: StatusReport): string {
  const rows: Array<[string, string]> = [
    ["pending", String(report.pending)],
    ["claimed", String(report.claimed)],
    ["failed", String(report.failed)],
    ["dispatched", String(report.dispatched)],
    ["dead", String(report.dead)],
    ["due now", String(report.due)],
    [
      "oldest due",
      report.oldestDueAgeMs === undefined
        ? "-"
        : `${formatDuration(report.oldestDueAgeMs)} (since ${report.oldestDueCreatedAt})`,
    ],
  ];
  if (report.blockedKeys) {
    rows.push(["blocked keys", `${report.blockedKeys} (see outbox-nats keys blocked)`]);
  }
  const width = Math.max(...rows.map(([label]) => label.length));
  const numbers = Math.max(...rows.slice(0, 6).map(([, value]) => value.length));
  const body = rows.map(([label, value], index) =>
    `  ${label.padEnd(width)}  ${index < 6 ? value.padStart(numbers) : value}`
  );
  return [`${report.store} at ${report.at}`, ...body].join("\n") + "\n";
}

/** `status`. */
export const statusCommand: Command = {
  name: "status",
  summary: "Counts per state, messages due now, age of the oldest due message",
  description: "Dead messages need an operator: see `outbox-nats dead list` and `requeue`.\n" +
    "With --watch the figures refresh every interval until Ctrl-C (with --json: one JSON object per line).",
  options: {
    json: { type: "boolean", description: "Print JSON instead of text" },
    watch: {
      type: "string",
      value: "<interval>",
      optionalValue: { omitted: "2s", accepts: isDuration },
      description: "Refresh every interval (default interval: 2s) until interrupted",
    },
  },
  examples: [
    "outbox-nats status --store postgres://app@db:5432/app",
    "outbox-nats status --store sqlite:./app.db --json",
    "outbox-nats status --store nats-kv://orders_outbox --nats nats://127.0.0.1:4222 --watch 5s",
  ],
  async run({ values }, io) {
    const settings = storeSettings(values, "outbox-nats status");
    const watchMs = durationValue(values, "watch");
    if (watchMs !== undefined && watchMs < 100) {
      throw new CliUsageError("--watch: the interval must be at least 100ms");
    }
    const json = values.json === true;
    const store = await openStore(settings);
    try {
      const report = async (): Promise<StatusReport> => {
        const now = new Date();
        const stats = await store.outbox.stats(now);
        return { store: store.label, at: now.toISOString(), ...stats };
      };
      const print = (result: StatusReport) => {
        io.out(json ? `${JSON.stringify(result)}\n` : formatStatus(result));
      };
      if (watchMs === undefined) {
        print(await report());
        return 0;
      }
      return await watch(io, watchMs, async () => {
        const result = await report();
        if (io.isTTY && !json) io.out("\x1b[H\x1b[2J");
        print(result);
        if (!json && !io.isTTY) io.out("\n");
      });
    } finally {
      await store.close();
    }
  },
};

/** Runs `tick` every `intervalMs` until SIGINT / SIGTERM; tick errors are reported, not fatal. */
async function watch(io: CliIo, intervalMs: number, tick: () => Promise<void>): Promise<number> {
  const signals = onShutdownSignals(() => io.err("outbox-nats: interrupted again, exiting\n"));
  try {
    while (!signals.stopping) {
      try {
        await tick();
      } catch (error) {
        io.err(`outbox-nats: status failed: ${describeError(error)}\n`);
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        new Promise<void>((resolve) => timer = setTimeout(resolve, intervalMs)),
        signals.received,
      ]);
      clearTimeout(timer);
    }
    return 0;
  } finally {
    signals.dispose();
  }
}
