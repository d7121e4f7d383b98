/**
 * Scenario 7, the inbox under redelivery: a consumer process (consumeWithInbox, SQL inbox in the
 * handler's Postgres transaction) is killed with SIGKILL again and again, several times exactly
 * between the COMMIT of a message's transaction and its ack, and at arbitrary points in between.
 * JetStream redelivers what was not acked; the business side effect (a counter per message,
 * incremented by the handler, with no dedupe of its own) must end at exactly 1 for every message.
 */

import assert from "node:assert/strict";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor } from "../../mod.ts";
import { createTestDatabase, createTestStream, eventually, natsUrl } from "../kit/mod.ts";
import { Child, figures, natsConnection, pgPool, since, workerScript } from "./harness.ts";
import type { InboxConsumerConfig } from "./workers/protocol.ts";

const total = 1_000;
const durable = "billing";
/** Kills right after a COMMIT, before the ack (the consumer hangs there until killed). */
const killsAfterCommit = 6;
/** Kills at whatever point the consumer is at after some more commits. */
const killsAnywhere = 4;

function random(min: number, max: number): number {
  return min + Math.floor(Math.random() * (max - min + 1));
}

Deno.test("inbox under redelivery: consumer killed between commit and ack (and anywhere), 1,000 messages, each side effect applied exactly once", async () => {
  await using db = await createTestDatabase();
  await using pg = pgPool(db.url);
  await migrate(postgresJsExecutor(pg.sql), { dialect: "postgres" });
  await pg.sql`CREATE TABLE counters (id text PRIMARY KEY, n integer NOT NULL)`;
  await using nats = await natsConnection();
  await using stream = await createTestStream(nats.nc);
  const jsm = await jetstreamManager(nats.nc);
  await jsm.consumers.add(stream.name, {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    ack_wait: 2_000_000_000, // 2 s: what a killed consumer's messages wait before redelivery
    max_deliver: -1,
  });
  const js = jetstream(nats.nc);
  const ids = Array.from({ length: total }, (_, i) => `inbox-${i}`);
  await Promise.all(
    ids.map((id, i) =>
      js.publish(`${stream.prefix}.billing`, JSON.stringify({ i }), { msgID: id })
    ),
  );

  const config: InboxConsumerConfig = {
    natsUrl: await natsUrl(),
    stream: stream.name,
    durable,
    postgresUrl: db.url,
    inboxTable: "trellis_inbox",
    outboxTable: "trellis_outbox",
    counterTable: "counters",
  };
  const children: Child[] = [];
  const spawn = (hangAfterCommits?: number) => {
    const child = Child.spawn(
      workerScript("inbox_consumer.ts"),
      { ...config, hangAfterCommits },
      `consumer-${children.length + 1}`,
    );
    children.push(child);
    return child;
  };
  const killedBetweenCommitAndAck: string[] = [];
  const started = performance.now();
  try {
    for (let round = 0; round < killsAfterCommit + killsAnywhere; round++) {
      const child = spawn(round < killsAfterCommit ? random(20, 80) : undefined);
      if (round < killsAfterCommit) {
        const hanging = await child.waitForEvent("hanging", 120_000);
        killedBetweenCommitAndAck.push(hanging.id);
      } else {
        const after = random(20, 80);
        await child.waitFor(
          (e) => e.event === "committed" && e.commits >= after,
          120_000,
          `${after} commits`,
        );
      }
      await child.crash();
    }
    const last = spawn();
    await eventually(async () => {
      const [{ n }] = await pg.sql`SELECT count(*)::int AS n FROM counters`;
      assert.equal(n, total, "every message applied");
      const info = await jsm.consumers.info(stream.name, durable);
      assert.equal(info.num_pending, 0, "nothing left undelivered");
      assert.equal(info.num_ack_pending, 0, "nothing left unacknowledged");
    }, { timeoutMs: 180_000, intervalMs: 200 });
    const elapsedMs = since(started);
    await last.stop();

    const [counters] = await pg.sql`
      SELECT count(*)::int AS messages, sum(n)::int AS applied, min(n) AS min, max(n) AS max
      FROM counters`;
    const [{ inbox }] = await pg.sql`
      SELECT count(*)::int AS inbox FROM trellis_inbox WHERE consumer = ${durable}`;
    const duplicates = children.flatMap((child) => child.all("duplicate").map((e) => e.id));
    const redeliveredAfterKill = killedBetweenCommitAndAck.filter((id) => duplicates.includes(id));
    figures("inbox-redelivery", {
      messages: total,
      consumerProcesses: children.length,
      killsBetweenCommitAndAck: killedBetweenCommitAndAck.length,
      killsAnywhere,
      duplicatesSuppressed: duplicates.length,
      sideEffectsApplied: counters.applied,
      maxPerMessage: counters.max,
      inboxRows: inbox,
      elapsedMs,
    });
    assert.deepEqual(
      { ...counters },
      { messages: total, applied: total, min: 1, max: 1 },
      "each side effect applied exactly once",
    );
    assert.equal(inbox, total);
    assert.deepEqual(
      redeliveredAfterKill.sort(),
      [...killedBetweenCommitAndAck].sort(),
      "every message committed but not acked was redelivered and recognised as a duplicate",
    );
  } finally {
    for (const child of children) await child[Symbol.asyncDispose]();
  }
});
