/**
 * Scenario: per-key order across relays. Two dispatcher processes with two dispatchers each drain
 * a Postgres outbox of 500 keys x 20 messages into a private nats-server while 5% of publishes
 * fail (half of them after the broker stored the message), one process is killed with SIGKILL
 * (and replaced), and the broker is killed and restarted. In the stream, every key's messages
 * must appear in enqueue order, none lost, none duplicated. Two poisoned keys park (their head
 * goes dead) while the 498 others complete; `unblockKey` skip and retry then do what they say.
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { migrate, type OutboxRecord, postgresJsExecutor, SqlOutboxRepository } from "../../mod.ts";
import { createTestDatabase, eventually, NatsServer, uniqueName } from "../kit/mod.ts";
import {
  Child,
  figures,
  natsConnection,
  pgPool,
  readStreamIds,
  since,
  tableSnapshot,
  tempDir,
} from "./harness.ts";
import type { DispatcherConfig } from "./workers/protocol.ts";

const keys = Number(Deno.env.get("OUTBOX_FAULTS_ORDERING_KEYS") ?? 500);
const perKey = 20;
/** The message of a poisoned key that fails permanently (while the poison flag exists). */
const poisonAt = 5;

Deno.test("ordering: 2 processes x 2 dispatchers, 5% publish failures, a SIGKILL and a broker restart keep every key in order; poisoned keys park", async () => {
  const started = performance.now();
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url, 6);
  const executor = postgresJsExecutor(pg.sql);
  await migrate(executor, { dialect: "postgres" });
  const outbox = new SqlOutboxRepository(executor, "postgres");
  await using server = await NatsServer.start();
  await using nats = await natsConnection(server.url);
  await using flags = await tempDir("outbox-poison-");
  const poisonFlag = `${flags.path}/poison`;
  await Deno.writeTextFile(poisonFlag, "on");
  const stream = uniqueName("stream");
  const prefix = uniqueName("ord");
  await (await jetstreamManager(nats.nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });

  // Keys k0..k497 are healthy; "skip-me" and "retry-me" are poisoned at message `poisonAt`.
  const keyNames = [
    ...Array.from({ length: keys - 2 }, (_, k) => `k${k}`),
    "skip-me",
    "retry-me",
  ];
  const expected = new Map<string, string[]>(keyNames.map((key) => [key, []]));
  for (let i = 0; i < perKey; i++) {
    const round: OutboxRecord[] = keyNames.map((key) => {
      const poisoned = key.endsWith("-me") && i === poisonAt;
      const id = `${prefix}-${key}-${poisoned ? "poison-" : ""}${i}`;
      expected.get(key)!.push(id);
      return {
        id,
        kind: "event.publish",
        name: "order.updated",
        subject: `${prefix}.${key}`,
        payload: JSON.stringify({ key, i }),
        headers: {},
        orderingKey: key,
      };
    });
    await pg.sql.begin((tx) =>
      new SqlOutboxRepository(postgresJsExecutor(tx), "postgres").enqueueMany(round)
    );
  }
  const total = keys * perKey;

  const config = (name: string): DispatcherConfig => ({
    name,
    store: { kind: "postgres", url: db.url },
    natsUrl: server.url,
    dispatchers: 2,
    limit: 100,
    maxInFlight: 100,
    leaseMs: 2_000,
    idleRetryMs: 50,
    publishTimeoutMs: 1_000,
    probeIntervalMs: 50,
    probeMaxIntervalMs: 300,
    failureRate: 0.05,
    poisonFlag,
    retry: { baseMs: 10, capMs: 100, maxAttempts: 1_000 },
  });
  await using first = Child.dispatcher(config("ordering-a"));
  await using second = Child.dispatcher(config("ordering-b"));
  const dispatched = async () => (await tableSnapshot(executor)).states.dispatched ?? 0;

  // A crash: process a dies mid-way (its claims are recovered when their 2 s leases expire)...
  await eventually(async () => assert.ok((await dispatched()) >= total * 0.2), {
    timeoutMs: 60_000,
    intervalMs: 50,
  });
  await first.crash();
  await using replacement = Child.dispatcher(config("ordering-a2"));
  // ... and the broker dies and comes back on the same port and store.
  await eventually(async () => assert.ok((await dispatched()) >= total * 0.5), {
    timeoutMs: 60_000,
    intervalMs: 50,
  });
  await server.kill("SIGKILL");
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  await server.restart();

  // Everything but the two parked keys completes: each poisoned key is stuck at its poison
  // message, with the rest of the key waiting behind it.
  const parkedRemaining = perKey - poisonAt; // the dead head and the ones behind it
  await eventually(async () => {
    assert.equal(await dispatched(), total - 2 * parkedRemaining);
    const blocked = await outbox.blockedKeys();
    assert.deepEqual(
      blocked.map((b) => [b.key, b.headId, b.waiting]).sort(),
      [
        ["retry-me", `${prefix}-retry-me-poison-${poisonAt}`, parkedRemaining - 1],
        ["skip-me", `${prefix}-skip-me-poison-${poisonAt}`, parkedRemaining - 1],
      ],
    );
  }, { timeoutMs: 120_000, intervalMs: 200 });
  const parkedAt = since(started);

  // The poison is cured (the flag goes), then one key is skipped and one retried.
  await Deno.remove(poisonFlag);
  assert.equal(await outbox.unblockKey("skip-me", { action: "skip" }), true);
  assert.equal(await outbox.unblockKey("retry-me", { action: "retry" }), true);
  await eventually(async () => assert.equal(await dispatched(), total - 1), {
    timeoutMs: 60_000,
    intervalMs: 100,
  });
  const table = await tableSnapshot(executor);
  assert.deepEqual(table.states, { dispatched: total - 1, dead: 1 });
  assert.deepEqual(await outbox.blockedKeys(), []);
  const totals = await Promise.all([second.stop(), replacement.stop()]);

  const ids = await readStreamIds(nats.nc, stream);
  const duplicates = ids.length - new Set(ids).size;
  assert.equal(duplicates, 0, "nothing stored twice");
  const skipped = `${prefix}-skip-me-poison-${poisonAt}`;
  assert.ok(!ids.includes(skipped), "the skipped head was never published");
  assert.equal(ids.length, total - 1, "nothing lost");
  const inStream = new Map<string, string[]>();
  for (const id of ids) {
    const key = id.slice(prefix.length + 1, id.lastIndexOf("-")).replace(/-poison$/, "");
    inStream.set(key, [...(inStream.get(key) ?? []), id]);
  }
  for (const [key, list] of expected) {
    const want = key === "skip-me" ? list.filter((id) => id !== skipped) : list;
    assert.deepEqual(inStream.get(key), want, `order of ${key}`);
  }
  figures("ordering", {
    messages: total,
    keys,
    injectedFailures: totals.reduce((n, t) => n + t.failed, 0),
    duplicateAcks: totals.reduce((n, t) => n + t.duplicates, 0),
    maxAttempts: table.maxAttempts,
    parkedAfterMs: Math.round(parkedAt),
    totalMs: Math.round(since(started)),
  });
});
