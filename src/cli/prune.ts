/**
 * `outbox-nats prune`: delete old dispatched (and optionally dead) messages in bounded batches,
 * with a progress bar on a terminal, and a summary.
 *
 * @module
 */

import type { OutboxPruneResult } from "../../mod.ts";
import { type Command, durationValue, integerValue, storeSettings } from "./args.ts";
import { CliUsageError } from "./errors.ts";
import { formatDuration } from "./format.ts";
import { createProgress } from "./progress.ts";
import { openStore } from "./store.ts";

/** `prune`. */
export const pruneCommand: Command = {
  name: "prune",
  summary: "Delete old dispatched (and dead) messages in bounded batches",
  description:
    "Deletes dispatched messages last changed longer ago than --dispatched-older-than, and with\n" +
    "--dead-older-than dead ones too (dead messages are kept unless asked: they need an operator).\n" +
    "Each batch is its own short statement, so the service keeps running. --dry-run only counts.\n" +
    "Pending, claimed and failed messages are never deleted.",
  options: {
    "dispatched-older-than": {
      type: "string",
      value: "<duration>",
      description: "Delete dispatched messages older than this (7d, 12h, 30m, 1h30m)",
    },
    "dead-older-than": {
      type: "string",
      value: "<duration>",
      description: "Delete dead messages older than this as well",
    },
    "dry-run": { type: "boolean", description: "Count what would be deleted; delete nothing" },
    "batch-size": {
      type: "string",
      value: "<n>",
      default: "1000",
      description: "Messages deleted per statement",
    },
    json: { type: "boolean", description: "Print the summary as JSON (no progress output)" },
  },
  examples: [
    "outbox-nats prune --store postgres://app@db:5432/app --dispatched-older-than 7d",
    "outbox-nats prune --store sqlite:./app.db --dispatched-older-than 7d --dead-older-than 30d --dry-run",
  ],
  async run({ values }, io) {
    const settings = storeSettings(values, "outbox-nats prune");
    const dispatchedMs = durationValue(values, "dispatched-older-than");
    const deadMs = durationValue(values, "dead-older-than");
    if (dispatchedMs === undefined && deadMs === undefined) {
      throw new CliUsageError(
        "prune: say what to delete: --dispatched-older-than <duration> and/or --dead-older-than <duration>",
      );
    }
    const batchSize = integerValue(values, "batch-size", 1000);
    const dryRun = values["dry-run"] === true;
    const json = values.json === true;
    const store = await openStore(settings);
    try {
      const started = Date.now();
      const now = new Date(started);
      const before = (ms: number | undefined) =>
        ms === undefined ? undefined : new Date(now.getTime() - ms);
      const cutoffs = { dispatchedBefore: before(dispatchedMs), deadBefore: before(deadMs) };
      const counted = await store.outbox.prune({ ...cutoffs, batchSize, dryRun: true });
      let result: OutboxPruneResult = counted;
      const total = counted.dispatched + counted.dead;
      if (!dryRun && total > 0) {
        const progress = json ? undefined : createProgress(io, "pruning", total);
        try {
          result = await store.outbox.prune({
            ...cutoffs,
            batchSize,
            onProgress: (running) =>
              progress?.update(
                running.dispatched + running.dead,
                `dispatched ${running.dispatched}, dead ${running.dead}`,
              ),
          });
        } finally {
          progress?.finish();
        }
      }
      const elapsedMs = Date.now() - started;
      if (json) {
        io.out(JSON.stringify({ dryRun, ...result, elapsedMs }) + "\n");
        return 0;
      }
      const parts = [
        dispatchedMs === undefined
          ? undefined
          : `${result.dispatched} dispatched (older than ${formatDuration(dispatchedMs)})`,
        deadMs === undefined
          ? undefined
          : `${result.dead} dead (older than ${formatDuration(deadMs)})`,
      ].filter(Boolean).join(" and ");
      io.out(
        dryRun
          ? `dry run: would delete ${parts} message(s) from ${store.label}\n`
          : `deleted ${parts} message(s) from ${store.label} in ${formatDuration(elapsedMs)}\n`,
      );
      return 0;
    } finally {
      await store.close();
    }
  },
};
