/**
 * `outbox-nats dead list`: the dead messages, oldest first, with their last error.
 *
 * @module
 */

import { type Command, integerValue, storeSettings } from "./args.ts";
import { formatAge, formatTable } from "./format.ts";
import { openStore } from "./store.ts";

/** `dead list`. */
export const deadListCommand: Command = {
  name: "dead list",
  summary: "List dead messages (id, kind, subject, attempts, age, last error), oldest first",
  description:
    "AGE is the time since the message was enqueued. Long errors are cut to the terminal width in the\n" +
    "table; --json prints every message in full (an array of stored messages, payload included).",
  options: {
    json: { type: "boolean", description: "Print a JSON array instead of a table" },
    limit: {
      type: "string",
      value: "<n>",
      default: "100",
      description: "Show at most n messages",
    },
  },
  examples: [
    "outbox-nats dead list --store postgres://app@db:5432/app",
    "outbox-nats dead list --store sqlite:./app.db --json --limit 1000",
  ],
  async run({ values }, io) {
    const settings = storeSettings(values, "outbox-nats dead list");
    const limit = integerValue(values, "limit", 100);
    const store = await openStore(settings);
    try {
      const now = new Date();
      const dead = await store.outbox.listDead({ limit });
      if (values.json === true) {
        io.out(JSON.stringify(dead, null, 2) + "\n");
        return 0;
      }
      if (dead.length === 0) {
        io.out(`no dead messages in ${store.label}\n`);
        return 0;
      }
      const rows = dead.map((message) => [
        message.id,
        message.kind,
        message.subject,
        String(message.attempts),
        formatAge(message.createdAt, now),
        message.lastError ?? "",
      ]);
      const header = ["ID", "KIND", "SUBJECT", "ATTEMPTS", "AGE", "LAST ERROR"];
      // Fixed columns first; the error gets what is left of the terminal (at least 40).
      const fixed = header.slice(0, 5).map((title, column) =>
        Math.max(title.length, ...rows.map((row) => row[column].length)) + 2
      ).reduce((sum, width) => sum + width, 0);
      const errorWidth = io.isTTY ? Math.max(40, io.columns - fixed) : 200;
      io.out(formatTable(header, rows, { right: [3], maxWidth: { 5: errorWidth } }));
      const total = (await store.outbox.stats(now)).dead;
      io.out(
        total > dead.length
          ? `showing the oldest ${dead.length} of ${total} dead messages (raise --limit to see more)\n`
          : `${dead.length} dead message${dead.length === 1 ? "" : "s"}\n`,
      );
      return 0;
    } finally {
      await store.close();
    }
  },
};
