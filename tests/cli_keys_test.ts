/**
 * `outbox-nats keys blocked | retry | skip` as a subprocess against real SQL and NATS KV stores.
 */

import assert from "node:assert/strict";
import type { OutboxAdmin, OutboxRecord, OutboxRepository } from "../mod.ts";
import { kvStore, postgresStore, runCli, sqliteStore } from "./helpers/cli.ts";
import { uniqueName } from "./kit/mod.ts";

function keyed(id: string, orderingKey: string): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "n",
    subject: "orders.updated",
    payload: "{}",
    headers: {},
    orderingKey,
  };
}

/** Key `${p}-a` blocked by a dead head with 2 waiting; key `${p}-b` flowing. */
async function seedBlocked(outbox: OutboxRepository & OutboxAdmin, p: string): Promise<void> {
  await outbox.enqueueMany([
    keyed(`${p}-a1`, `${p}-a`),
    keyed(`${p}-b1`, `${p}-b`),
    keyed(`${p}-a2`, `${p}-a`),
    keyed(`${p}-a3`, `${p}-a`),
  ]);
  const now = new Date();
  const claimed = await outbox.claimDue(10, now);
  const head = claimed.find((m) => m.id === `${p}-a1`)!;
  assert.equal(await outbox.markDead(head, { error: "no stream for subject", now }), true);
}

for (
  const [name, open] of [["postgres", postgresStore], ["sqlite", sqliteStore], [
    "nats-kv",
    kvStore,
  ]] as const
) {
  Deno.test(`cli ${name}: keys blocked lists the dead head and the waiting count; retry and skip unblock`, async () => {
    await using store = await open();
    const p = uniqueName("kb");
    await seedBlocked(store.outbox, p);

    const text = await runCli(["keys", "blocked", ...store.args]);
    assert.equal(text.code, 0, text.stderr);
    const lines = text.stdout.trimEnd().split("\n");
    assert.match(lines[0], /^KEY\s+HEAD\s+SINCE\s+WAITING\s+LAST ERROR$/);
    assert.match(lines[1], new RegExp(`^${p}-a\\s+${p}-a1\\s+\\S+\\s+2\\s+no stream for subject$`));
    assert.equal(lines[2], "1 blocked key");

    const status = await runCli(["status", ...store.args]);
    assert.match(status.stdout, /^\s+blocked keys\s+1 \(see outbox-nats keys blocked\)$/m);

    const json = await runCli(["keys", "blocked", ...store.args, "--json"]);
    const [blocked] = JSON.parse(json.stdout);
    assert.deepEqual(
      { key: blocked.key, headId: blocked.headId, waiting: blocked.waiting },
      { key: `${p}-a`, headId: `${p}-a1`, waiting: 2 },
    );

    const skipped = await runCli(["keys", "skip", `${p}-a`, ...store.args]);
    assert.equal(skipped.code, 0, skipped.stderr);
    assert.match(skipped.stdout, new RegExp(`skipped its dead head ${p}-a1 \\(still dead\\)`));
    assert.equal((await store.outbox.get(`${p}-a1`))?.state, "dead");
    const [next] = await store.outbox.claimDue(10, new Date());
    assert.equal(next.id, `${p}-a2`, "the next message is released");
    assert.equal(await store.outbox.markDead(next, { error: "again", now: new Date() }), true);

    const retried = await runCli(["keys", "retry", `${p}-a`, ...store.args, "--json"]);
    assert.equal(retried.code, 0, retried.stderr);
    assert.deepEqual(JSON.parse(retried.stdout), {
      key: `${p}-a`,
      action: "retry",
      unblocked: true,
      headId: `${p}-a2`,
    });
    const [again] = await store.outbox.claimDue(10, new Date());
    assert.equal(again.id, `${p}-a2`, "the requeued head goes first");

    const none = await runCli(["keys", "retry", `${p}-a`, ...store.args]);
    assert.equal(none.code, 1);
    assert.match(none.stderr, /is not blocked/);
    const empty = await runCli(["keys", "blocked", ...store.args]);
    assert.match(empty.stdout, /^no blocked ordering keys in /);
    const usage = await runCli(["keys", "drop", "x", ...store.args]);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /keys blocked/);
  });
}
