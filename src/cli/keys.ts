/**
 * `outbox-nats keys blocked | retry <key> | skip <key>`: ordering keys whose head went dead, and
 * unblocking them.
 *
 * @module
 */

import { type Command, integerValue, storeSettings } from "./args.ts";
import { CliUsageError } from "./errors.ts";
import { formatAge, formatTable } from "./format.ts";
import { openStore } from "./store.ts";

/** `keys blocked`. */
export const keysBlockedCommand: Command = {
  name: "keys blocked",
  summary: "List blocked ordering keys (key, dead head, since, waiting, last error)",
  description:
    "A key is blocked when its oldest unsettled message (its head) went dead: its later messages\n" +
    "wait. SINCE is the time since the head went dead; WAITING counts the messages behind it.\n" +
    "Unblock a key with `keys retry <key>` (requeue the head) or `keys skip <key>` (leave the head\n" +
    "dead and release the next message).",
  options: {
    json: { type: "boolean", description: "Print a JSON array instead of a table" },
    limit: {
      type: "string",
      value: "<n>",
      default: "100",
      description: "Show at most n keys, longest blocked first",
    },
  },
  examples: [
    "outbox-nats keys blocked --store postgres://app@db:5432/app",
    "outbox-nats keys blocked --store sqlite:./app.db --json",
  ],
  async run({ values }, io) {
    const settings = storeSettings(values, "outbox-nats keys blocked");
    const limit = integerValue(values, "limit", 100);
    const store = await openStore(settings);
    try {
      const blocked = await store.outbox.blockedKeys({ limit });
      if (values.json === true) {
        io.out(JSON.stringify(blocked, null, 2) + "\n");
        return 0;
      }
      if (blocked.length === 0) {
        io.out(`no blocked ordering keys in ${store.label}\n`);
        return 0;
      }
      const now = new Date();
      const rows = blocked.map((key) => [
        key.key,
        key.headId,
        formatAge(key.since, now),
        String(key.waiting),
        key.lastError ?? "",
      ]);
      io.out(
        formatTable(["KEY", "HEAD", "SINCE", "WAITING", "LAST ERROR"], rows, {
          right: [3],
          maxWidth: { 4: io.isTTY ? Math.max(40, io.columns - 60) : 200 },
        }),
      );
      io.out(`${blocked.length} blocked key${blocked.length === 1 ? "" : "s"}\n`);
      return 0;
    } finally {
      await store.close();
    }
  },
};

function unblockCommand(action: "retry" | "skip"): Command {
  const name = `keys ${action}`;
  return {
    name,
    summary: action === "retry"
      ? "Unblock an ordering key by requeuing its dead head"
      : "Unblock an ordering key by skipping its dead head (it stays dead)",
    args: "<key>",
    maxPositionals: 1,
    description: action === "retry"
      ? "The dead head goes back to pending (attempts reset, last error kept) and is published\n" +
        "before the key's later messages. Exits 1 when the key is not blocked."
      : "The dead head stays dead (see `dead list`) and the key's next message is released: the\n" +
        "key's order skips the head. Exits 1 when the key is not blocked.",
    options: {
      json: { type: "boolean", description: "Print the result as JSON" },
    },
    examples: [`outbox-nats ${name} --store postgres://app@db:5432/app order-42`],
    async run({ values, positionals }, io) {
      const settings = storeSettings(values, `outbox-nats ${name}`);
      const [key] = positionals;
      if (key === undefined) throw new CliUsageError(`${name}: give the ordering key`);
      const store = await openStore(settings);
      try {
        const head = (await store.outbox.blockedKeys({ limit: 1_000_000 }))
          .find((blocked) => blocked.key === key);
        const unblocked = await store.outbox.unblockKey(key, { action });
        if (values.json === true) {
          io.out(JSON.stringify({ key, action, unblocked, headId: head?.headId ?? null }) + "\n");
        } else if (unblocked) {
          io.out(
            action === "retry"
              ? `key ${key}: requeued its dead head ${head?.headId ?? ""}\n`
              : `key ${key}: skipped its dead head ${
                head?.headId ?? ""
              } (still dead); the next message is released\n`,
          );
        } else {
          io.err(`key ${key} is not blocked in ${store.label}\n`);
        }
        return unblocked ? 0 : 1;
      } finally {
        await store.close();
      }
    },
  };
}

/** `keys retry <key>`. */
export const keysRetryCommand: Command = unblockCommand("retry");
/** `keys skip <key>`. */
export const keysSkipCommand: Command = unblockCommand("skip");
