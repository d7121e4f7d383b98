/**
 * consumeWithInbox on an R3 stream of a 3-node cluster through a leader change: a consumer
 * process (SQL inbox in the handler's Postgres transaction, a per-message counter as the side
 * effect) keeps consuming while the node leading its durable consumer is killed (-9) and later
 * restarted. Every side effect must be applied exactly once and nothing may stay pending.
 */

import assert from "node:assert/strict";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { migrate, postgresJsExecutor } from "../../mod.ts";
import { createTestDatabase, eventually, NatsCluster, sleep, uniqueName } from "../kit/mod.ts";
import { Child, figures, natsConnection, pgPool, since, workerScript } from "./harness.ts";
import type { InboxConsumerConfig } from "./workers/protocol.ts";

const total = 2_000;
const durable = "billing";

Deno.test(
  "R3 cluster: consumeWithInbox keeps going through a kill (-9) of its consumer's leader; each side effect applied exactly once",
  async () => {
    await using cluster = await NatsCluster.start();
    await using db = await createTestDatabase();
    await using pg = pgPool(db.url);
    await migrate(postgresJsExecutor(pg.sql), { dialect: "postgres" });
    await pg.sql`CREATE TABLE counters (id text PRIMARY KEY, n integer NOT NULL)`;
    await using nats = await natsConnection(cluster.url);
    const stream = uniqueName("stream");
    const prefix = uniqueName("subj");
    const jsm = await jetstreamManager(nats.nc);
    await jsm.streams.add({ name: stream, subjects: [`${prefix}.>`], num_replicas: 3 });
    await jsm.consumers.add(stream, {
      durable_name: durable,
      ack_policy: AckPolicy.Explicit,
      ack_wait: 5_000_000_000,
      max_deliver: -1,
    });
    const js = jetstream(nats.nc, { timeout: 10_000 });
    const ids = Array.from({ length: total }, (_, i) => `r3-inbox-${i}`);
    for (let i = 0; i < total; i += 200) {
      await Promise.all(
        ids.slice(i, i + 200).map((id) =>
          js.publish(`${prefix}.billing`, JSON.stringify({ id }), { msgID: id })
        ),
      );
    }

    const config: InboxConsumerConfig = {
      natsUrl: cluster.url,
      stream,
      durable,
      postgresUrl: db.url,
      inboxTable: "trellis_inbox",
      outboxTable: "trellis_outbox",
      counterTable: "counters",
      concurrency: 4,
    };
    await using child = Child.spawn(workerScript("inbox_consumer.ts"), config, "r3-consumer");
    await child.waitFor(
      (e) => e.event === "committed" && e.commits >= 300,
      120_000,
      "300 commits",
    );
    const leaderName = await eventually(async () => {
      const leader = (await jsm.consumers.info(stream, durable)).cluster?.leader;
      assert.ok(leader, "the consumer has a leader");
      return leader;
    });
    const leader = cluster.node(leaderName);
    const [{ atKill }] = await pg.sql`SELECT count(*)::int AS "atKill" FROM counters`;
    // The child's own count of commits, which the wait below compares with `atKill`.
    const childCommitsAtKill = child.last("committed")?.commits ?? 0;
    await cluster.kill(leader);
    const killed = performance.now();
    const next = await eventually(async () => {
      const info = await jsm.consumers.info(stream, durable);
      const name = info.cluster?.leader;
      assert.ok(name && name !== leader.name, `a new consumer leader (now ${name})`);
      return name;
    }, { timeoutMs: 30_000, intervalMs: 100 });
    const newLeaderAfterMs = since(killed);
    const flowing = await child.waitFor(
      (e) => e.event === "committed" && e.commits >= atKill + 200,
      60_000,
      "200 more commits with the old leader down",
    );
    assert.ok(flowing);
    const flowingAfterKillMs = since(killed);
    await sleep(1_000);
    await cluster.restart(leader);
    await eventually(async () => {
      const [{ n }] = await pg.sql`SELECT count(*)::int AS n FROM counters`;
      assert.equal(n, total, "every message applied");
      const info = await jsm.consumers.info(stream, durable);
      assert.equal(info.num_pending, 0, "nothing left undelivered");
      assert.equal(info.num_ack_pending, 0, "nothing left unacknowledged");
    }, { timeoutMs: 120_000, intervalMs: 200 });
    const drainAfterKillMs = since(killed);
    await child.stop();

    const [counters] = await pg.sql`
    SELECT count(*)::int AS messages, sum(n)::int AS applied, min(n) AS min, max(n) AS max
    FROM counters`;
    const duplicates = child.all("duplicate").length;
    const errors = child.all("error").length;
    figures("r3-inbox-consumer-leader-kill", {
      messages: total,
      oldLeader: leader.name,
      newLeader: next,
      appliedAtKill: atKill,
      childCommitsAtKill,
      newLeaderAfterMs,
      flowingAfterKillMs,
      drainAfterKillMs,
      duplicatesSuppressed: duplicates,
      handlerErrors: errors,
      sideEffectsApplied: counters.applied,
      maxPerMessage: counters.max,
    });
    assert.deepEqual(
      { ...counters },
      { messages: total, applied: total, min: 1, max: 1 },
      "each side effect applied exactly once",
    );
    // Nothing stuck: the pull request left with the dead leader is replaced within two missed
    // heartbeats of pullExpiresMs (5 s). With nats.js's 30 s default it took ~47 s.
    assert.ok(
      flowingAfterKillMs - newLeaderAfterMs <= 20_000,
      `consumption resumed ${flowingAfterKillMs - newLeaderAfterMs} ms after the new leader`,
    );
  },
);
