/**
 * The operations CLI run as a subprocess against real stores (Postgres, SQLite files, NATS KV):
 * status, dead list, requeue and prune on a seeded outbox.
 */

import assert from "node:assert/strict";
import {
  CliProcess,
  runCli,
  seedMix,
  seedRecords,
  sqliteStore,
  storeFixtures,
} from "./helpers/cli.ts";
import { uniqueName } from "./kit/mod.ts";

for (const [name, open] of storeFixtures) {
  Deno.test(`cli ${name}: status prints counts per state, due now and the oldest due age (text and --json)`, async () => {
    await using store = await open();
    const prefix = uniqueName("st");
    const before = Date.now();
    await seedMix(store.outbox, prefix);

    const json = await runCli(["status", ...store.args, "--json"]);
    assert.equal(json.code, 0, json.stderr);
    assert.equal(json.stderr, "");
    const report = JSON.parse(json.stdout);
    assert.deepEqual(
      [report.pending, report.claimed, report.failed, report.dispatched, report.dead, report.due],
      [2, 1, 1, 3, 3, 2],
    );
    assert.equal(typeof report.oldestDueAgeMs, "number");
    assert.ok(Date.parse(report.oldestDueCreatedAt) >= before - 1_000);
    assert.match(report.store, name === "nats-kv" ? /^nats-kv:\/\// : /table/);

    const text = await runCli(["status", ...store.args]);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, /^\s+pending\s+2$/m);
    assert.match(text.stdout, /^\s+claimed\s+1$/m);
    assert.match(text.stdout, /^\s+failed\s+1$/m);
    assert.match(text.stdout, /^\s+dispatched\s+3$/m);
    assert.match(text.stdout, /^\s+dead\s+3$/m);
    assert.match(text.stdout, /^\s+due now\s+2$/m);
    assert.match(text.stdout, /^\s+oldest due\s+\d+(\.\d)?(ms|s) \(since \d{4}-/m);
  });

  Deno.test(`cli ${name}: dead list shows id, kind, subject, attempts, age and last error; --json and --limit`, async () => {
    await using store = await open();
    const prefix = uniqueName("dl");
    await seedMix(store.outbox, prefix);

    const text = await runCli(["dead", "list", ...store.args]);
    assert.equal(text.code, 0, text.stderr);
    const lines = text.stdout.trimEnd().split("\n");
    assert.match(lines[0], /^ID\s+KIND\s+SUBJECT\s+ATTEMPTS\s+AGE\s+LAST ERROR$/);
    // Oldest first (enqueue order): 2, 3, 5.
    assert.match(
      lines[1],
      new RegExp(
        `^${prefix}-2\\s+event\\.publish\\s+${prefix}\\.billing\\.paid\\s+1\\s+\\S+\\s+no stream for subject$`,
      ),
    );
    assert.match(
      lines[2],
      new RegExp(`^${prefix}-3\\s+.*payload too large second line$`),
      "newlines flattened",
    );
    assert.match(lines[3], new RegExp(`^${prefix}-5\\s`));
    assert.equal(lines[4], "3 dead messages");

    const json = await runCli(["dead", "list", ...store.args, "--json", "--limit", "2"]);
    assert.equal(json.code, 0, json.stderr);
    const dead = JSON.parse(json.stdout);
    assert.deepEqual(dead.map((m: { id: string }) => m.id), [`${prefix}-2`, `${prefix}-3`]);
    assert.equal(dead[1].lastError, "payload too large\nsecond line");
    assert.equal(dead[0].state, "dead");
    assert.equal(dead[0].attempts, 1);

    const limited = await runCli(["dead", "list", ...store.args, "--limit", "1"]);
    assert.match(limited.stdout, /showing the oldest 1 of 3 dead messages/);
  });

  Deno.test(`cli ${name}: requeue by id and --all-dead --subject, counting what changed`, async () => {
    await using store = await open();
    const prefix = uniqueName("rq");
    await seedMix(store.outbox, prefix);

    const byId = await runCli(["requeue", ...store.args, `${prefix}-2`, `${prefix}-8`, "nope"]);
    assert.equal(byId.code, 0, byId.stderr);
    assert.equal(byId.stdout, "requeued 1 of 3 messages (2 unknown or not dead, left alone)\n");
    const requeued = await store.outbox.get(`${prefix}-2`);
    assert.equal(requeued?.state, "pending");
    assert.equal(requeued?.attempts, 0);
    assert.equal(requeued?.lastError, "no stream for subject", "last error kept");

    // Dead now: 3 (orders), 5 (orders). Another dead billing message to leave alone:
    const [claimed] = await store.outbox.claimDue(1, new Date());
    assert.equal(claimed.id, `${prefix}-2`);
    await store.outbox.markDead(claimed, { error: "again", now: new Date() });

    const matching = await runCli([
      "requeue",
      ...store.args,
      "--all-dead",
      "--subject",
      `${prefix}.orders.*`,
      "--batch-size",
      "1",
    ]);
    assert.equal(matching.code, 0, matching.stderr);
    assert.equal(
      matching.stdout,
      `requeued 2 dead messages matching ${prefix}.orders.* (1 other dead left alone)\n`,
    );
    assert.equal((await store.outbox.get(`${prefix}-3`))?.state, "pending");
    assert.equal((await store.outbox.get(`${prefix}-5`))?.state, "pending");
    assert.equal((await store.outbox.get(`${prefix}-2`))?.state, "dead");

    const rest = await runCli(["requeue", ...store.args, "--all-dead", "--json"]);
    assert.equal(rest.code, 0, rest.stderr);
    assert.deepEqual(JSON.parse(rest.stdout), { requeued: 1, considered: 1, skipped: 0 });
    assert.equal((await store.outbox.stats()).dead, 0);
  });

  Deno.test(`cli ${name}: prune --dry-run counts and deletes nothing; prune deletes in batches with progress lines`, async () => {
    await using store = await open();
    const prefix = uniqueName("pr");
    await seedMix(store.outbox, prefix);
    const args = [
      "prune",
      ...store.args,
      "--dispatched-older-than",
      "7d",
      "--dead-older-than",
      "30d",
    ];

    const dry = await runCli([...args, "--dry-run"]);
    assert.equal(dry.code, 0, dry.stderr);
    assert.match(
      dry.stdout,
      /^dry run: would delete 2 dispatched \(older than 7d\) and 1 dead \(older than 30d\) message\(s\)/,
    );
    assert.deepEqual(
      [(await store.outbox.stats()).dispatched, (await store.outbox.stats()).dead],
      [3, 3],
      "a dry run deletes nothing",
    );

    const real = await runCli([...args, "--batch-size", "1"]);
    assert.equal(real.code, 0, real.stderr);
    const lines = real.stdout.trimEnd().split("\n");
    // Not a terminal: one plain line per batch, then the summary.
    assert.deepEqual(lines.slice(0, -1), [
      "pruning 1/3 (dispatched 1, dead 0)",
      "pruning 2/3 (dispatched 2, dead 0)",
      "pruning 3/3 (dispatched 2, dead 1)",
    ]);
    assert.match(
      lines.at(-1)!,
      /^deleted 2 dispatched \(older than 7d\) and 1 dead \(older than 30d\) message\(s\) from .* in /,
    );
    const stats = await store.outbox.stats();
    assert.deepEqual([stats.dispatched, stats.dead, stats.pending, stats.claimed, stats.failed], [
      1,
      2,
      2,
      1,
      1,
    ]);
    assert.equal(await store.outbox.get(`${prefix}-0`), undefined);
    assert.equal(await store.outbox.get(`${prefix}-2`), undefined);
    assert.equal((await store.outbox.get(`${prefix}-4`))?.state, "dispatched", "recent kept");

    const json = await runCli([...args, "--json"]);
    assert.deepEqual(
      { ...JSON.parse(json.stdout), elapsedMs: 0 },
      { dryRun: false, dispatched: 0, dead: 0, elapsedMs: 0 },
    );
  });
}

Deno.test("cli sqlite: status --watch refreshes until SIGINT (one JSON object per line)", async () => {
  await using store = await sqliteStore();
  await store.outbox.enqueueMany(seedRecords(uniqueName("w"), 2));
  const watch = new CliProcess(["status", ...store.args, "--json", "--watch", "100ms"]);
  try {
    await watch.waitForLine(/"pending":2/);
    await store.outbox.enqueueMany(seedRecords(uniqueName("w"), 1));
    await watch.waitForLine(/"pending":3/);
    watch.kill("SIGINT");
    const result = await watch.done;
    assert.equal(result.code, 0, result.stderr);
    const reports = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
    assert.ok(reports.length >= 2);
    assert.ok(reports.every((report) => typeof report.due === "number"));
  } finally {
    await watch.cleanup();
  }
});
