/**
 * `outbox-nats requeue`: move dead messages back to pending (attempts reset, last error kept),
 * by id or all of them, optionally only those whose subject matches a NATS wildcard pattern.
 *
 * @module
 */

import type { OutboxAdmin } from "../../mod.ts";
import { type Command, integerValue, storeSettings, stringValue } from "./args.ts";
import { CliUsageError } from "./errors.ts";
import { openStore } from "./store.ts";
import { subjectMatcher } from "./subject_pattern.ts";

/** What a requeue changed. */
export interface RequeueResult {
  /** Messages moved back to pending. */
  requeued: number;
  /** Dead messages looked at (with --all-dead) or ids given. */
  considered: number;
  /** Dead messages left alone because their subject did not match (with --subject). */
  skipped: number;
}

/**
 * Requeues every dead message whose subject matches, `batchSize` at a time. Dead messages are
 * listed oldest first; those that do not match stay dead and are skipped on later pages.
 */
export async function requeueAllDead(
  outbox: OutboxAdmin,
  matches: (subject: string) => boolean,
  batchSize: number,
): Promise<RequeueResult> {
  const result: RequeueResult = { requeued: 0, considered: 0, skipped: 0 };
  // Ids that stay dead after we saw them: not matching, or not changed by requeue (a racing
  // requeue, or an entry the store cannot requeue). Pages are sized to step over them.
  const staying = new Set<string>();
  const seen = new Set<string>();
  while (true) {
    const limit = staying.size + batchSize;
    const page = await outbox.listDead({ limit });
    const fresh = page.filter((message) => !seen.has(message.id));
    const ids: string[] = [];
    for (const message of fresh) {
      seen.add(message.id);
      result.considered += 1;
      if (matches(message.subject)) ids.push(message.id);
      else {
        staying.add(message.id);
        result.skipped += 1;
      }
    }
    if (ids.length > 0) {
      const changed = await outbox.requeue(ids);
      result.requeued += changed;
      // Which ones did not change is unknown: count them all as staying (an over-estimate only
      // makes the next page longer).
      if (changed < ids.length) { for (const id of ids) staying.add(id); }
    }
    if (page.length < limit || fresh.length === 0) return result;
  }
}

/** `requeue`. */
export const requeueCommand: Command = {
  name: "requeue",
  summary: "Move dead messages back to pending (attempts reset to 0, last error kept)",
  args: "[<id>...]",
  maxPositionals: Infinity,
  description:
    "Give message ids, or --all-dead for every dead message (optionally only those whose subject\n" +
    "matches --subject, a NATS wildcard pattern: * is one token, a final > the rest). Ids that are\n" +
    "unknown or not dead are left alone. A running relay picks requeued messages up at once.",
  options: {
    "all-dead": { type: "boolean", description: "Requeue every dead message" },
    subject: {
      type: "string",
      value: "<pattern>",
      description: "With --all-dead: only messages whose subject matches (orders.*, orders.>)",
    },
    "batch-size": {
      type: "string",
      value: "<n>",
      default: "500",
      description: "With --all-dead: messages requeued per round",
    },
    json: { type: "boolean", description: "Print the result as JSON" },
  },
  examples: [
    "outbox-nats requeue --store postgres://app@db:5432/app order-42-created order-43-created",
    "outbox-nats requeue --store sqlite:./app.db --all-dead --subject 'orders.>'",
  ],
  async run({ values, positionals }, io) {
    const settings = storeSettings(values, "outbox-nats requeue");
    const all = values["all-dead"] === true;
    const pattern = stringValue(values, "subject");
    if (pattern !== undefined && !all) {
      throw new CliUsageError(
        `requeue: --subject needs --all-dead (requeue --all-dead --subject '${pattern}')`,
      );
    }
    if (all && positionals.length > 0) {
      throw new CliUsageError("requeue: give message ids or --all-dead, not both");
    }
    if (!all && positionals.length === 0) {
      throw new CliUsageError("requeue: give the ids of dead messages, or --all-dead");
    }
    const matches = pattern === undefined ? () => true : subjectMatcher(pattern);
    const batchSize = integerValue(values, "batch-size", 500);
    const store = await openStore(settings);
    try {
      let result: RequeueResult;
      if (all) {
        result = await requeueAllDead(store.outbox, matches, batchSize);
      } else {
        const ids = [...new Set(positionals)];
        result = {
          requeued: await store.outbox.requeue(ids),
          considered: ids.length,
          skipped: 0,
        };
      }
      if (values.json === true) {
        io.out(JSON.stringify(result) + "\n");
      } else if (all) {
        const filter = pattern === undefined ? "" : ` matching ${pattern}`;
        io.out(
          `requeued ${result.requeued} dead message${result.requeued === 1 ? "" : "s"}${filter}` +
            (pattern === undefined ? "" : ` (${result.skipped} other dead left alone)`) + "\n",
        );
      } else {
        const unchanged = result.considered - result.requeued;
        io.out(
          `requeued ${result.requeued} of ${result.considered} message${
            result.considered === 1 ? "" : "s"
          }` + (unchanged > 0 ? ` (${unchanged} unknown or not dead, left alone)` : "") + "\n",
        );
      }
      return 0;
    } finally {
      await store.close();
    }
  },
};
