/**
 * `outbox-nats relay` as a subprocess against real stores and real JetStream: delivery of a
 * requeued dead row, wake-ups (Postgres LISTEN, NATS KV watch), SIGTERM with work in flight
 * (nothing left claimed), the forced exit on a second signal, and the health endpoint.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import {
  CliProcess,
  kvStore,
  postgresStore,
  runCli,
  seedRecords,
  sqliteStore,
} from "./helpers/cli.ts";
import { duplicatesOf, streamIds } from "./helpers/dispatch.ts";
import {
  connectNats,
  createTestStream,
  eventually,
  NatsServer,
  natsUrl,
  uniqueName,
} from "./kit/mod.ts";

/** Records publishing to `<prefix>.e`. */
function records(prefix: string, count: number, idPrefix = uniqueName("r")) {
  return seedRecords(idPrefix, count).map((record) => ({ ...record, subject: `${prefix}.e` }));
}

async function health(port: number): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`http://127.0.0.1:${port}/health`);
  return { status: response.status, body: await response.json() };
}

function healthPort(line: string): number {
  const port = Number(/health endpoint on http:\/\/[^:]+:(\d+)\//.exec(line)?.[1]);
  assert.ok(port > 0, line);
  return port;
}

Deno.test("cli relay postgres: a requeued dead row is delivered; status lines; SIGTERM exits 0", async () => {
  await using store = await postgresStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const batch = records(stream.prefix, 5);
    await store.outbox.enqueueMany(batch);
    const [first] = await store.outbox.claimDue(1, new Date());
    await store.outbox.markDead(first, { error: "no stream", now: new Date() });
    const requeue = await runCli(["requeue", ...store.args, first.id]);
    assert.equal(requeue.stdout, "requeued 1 of 1 message\n");

    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--status-interval",
      "200ms",
    ]);
    try {
      await relay.waitForLine(/^relay: started: postgres:\/\/.* -> JetStream at nats:\/\//);
      await relay.waitForLine(
        /^relay: published 5 \(\d+\.\d\/s\) failed 0 dead 0 \| due 0, oldest due - \| breaker closed$/,
      );
      relay.kill("SIGTERM");
      const result = await relay.done;
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, /relay: SIGTERM: claiming nothing more/);
      assert.match(
        result.stdout,
        /relay: stopped after .*: published 5 \(0 duplicates\), failed 0, dead 0/,
      );
      assert.equal(result.stderr, "");
    } finally {
      await relay.cleanup();
    }
    const ids = await streamIds(nc, stream.name);
    assert.deepEqual(ids.sort(), batch.map((r) => r.id).sort());
    const requeued = await store.outbox.get(first.id);
    assert.equal(requeued?.state, "dispatched");
    assert.equal(requeued?.attempts, 1, "requeue reset attempts");
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay postgres: SIGTERM with work in flight settles every claim before exiting", async () => {
  await using store = await postgresStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const total = 20_000;
    for (let start = 0; start < total; start += 2_000) {
      await store.outbox.enqueueMany(records(stream.prefix, 2_000, uniqueName(`b${start}`)));
    }
    const jsm = await jetstreamManager(nc);
    let atSignal = 0;
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--limit",
      "50",
      "--max-in-flight",
      "50",
      "--status-interval",
      "0",
    ]);
    try {
      await relay.waitForLine(/^relay: started/);
      // As soon as the first messages land, stop the relay mid-stream.
      atSignal = await eventually(async () => {
        const { state } = await jsm.streams.info(stream.name);
        if (state.messages < 100) throw new Error("relay has not published yet");
        return state.messages;
      }, { intervalMs: 10 });
      relay.kill("SIGTERM");
      const result = await relay.done;
      assert.equal(result.code, 0, result.stderr);
      assert.match(
        result.stdout,
        /relay: SIGTERM: claiming nothing more, settling messages in flight/,
      );
    } finally {
      await relay.cleanup();
    }
    const stats = await store.outbox.stats();
    assert.equal(stats.claimed, 0, "no message left claimed by the stopped relay");
    assert.equal(stats.failed + stats.dead, 0);
    assert.equal(stats.dispatched + stats.pending, total);
    assert.ok(stats.pending > 0, "stopped before the end (work was in flight)");
    const published = (await jsm.streams.info(stream.name)).state.messages;
    assert.equal(published, stats.dispatched, "every published message is marked dispatched");
    assert.ok(published >= atSignal);
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay: SIGTERM while publishes await their PubAck waits for them and records them", async () => {
  await using server = await NatsServer.start();
  await using store = await postgresStore();
  const nc = await connectNats(server.url);
  try {
    const jsm = await jetstreamManager(nc);
    const prefix = uniqueName("inflight");
    await jsm.streams.add({ name: prefix, subjects: [`${prefix}.>`] });
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      server.url,
      "--publish-timeout",
      "10m",
      "--lease",
      "1h",
      "--poll",
      "100ms",
      "--status-interval",
      "0",
    ]);
    try {
      await relay.waitForLine(/^relay: started/);
      server.pause();
      let inFlight: number;
      try {
        await store.outbox.enqueueMany(records(prefix, 30));
        // Claimed and published; the frozen broker holds the PubAcks back.
        inFlight = await eventually(async () => {
          const { claimed } = await store.outbox.stats();
          if (claimed === 0) throw new Error("nothing claimed yet");
          return claimed;
        });
        relay.kill("SIGTERM");
        await relay.waitForLine(/^relay: SIGTERM: claiming nothing more/);
      } finally {
        server.resume();
      }
      const result = await relay.done;
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, new RegExp(`published ${inFlight} \\(0 duplicates\\)`));
      const stats = await store.outbox.stats();
      assert.equal(stats.claimed, 0, "the claims in flight were settled, not abandoned");
      assert.equal(stats.dispatched, inFlight);
      assert.equal(stats.pending, 30 - inFlight);
      assert.equal((await jsm.streams.info(prefix)).state.messages, inFlight);
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay postgres: LISTEN wakes the relay for a new enqueue (polling off)", async () => {
  await using store = await postgresStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--poll",
      "1h",
      "--status-interval",
      "0",
    ]);
    try {
      await relay.waitForLine(/^relay: started: .*LISTEN/);
      const notifying = new SqlOutboxRepository(
        postgresJsExecutor(store.sql),
        "postgres",
        { outbox: store.table, inbox: `${store.table}_i` },
        { notify: true },
      );
      const [record] = records(stream.prefix, 1);
      await notifying.enqueue(record);
      const jsm = await jetstreamManager(nc);
      await eventually(async () => {
        if ((await jsm.streams.info(stream.name)).state.messages !== 1) throw new Error("not yet");
      });
      relay.kill("SIGINT");
      const result = await relay.done;
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, /published 1 \(0 duplicates\)/);
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay nats-kv: the bucket watch wakes the relay for a new enqueue (polling off)", async () => {
  await using store = await kvStore();
  await using stream = await createTestStream(store.nc);
  const relay = new CliProcess(["relay", ...store.args, "--poll", "1h", "--status-interval", "0"]);
  try {
    await relay.waitForLine(/^relay: started: nats-kv:\/\/.*KV watch/);
    const batch = records(stream.prefix, 3);
    await store.outbox.enqueueMany(batch);
    const jsm = await jetstreamManager(store.nc);
    await eventually(async () => {
      if ((await jsm.streams.info(stream.name)).state.messages !== 3) throw new Error("not yet");
    });
    relay.kill("SIGTERM");
    const result = await relay.done;
    assert.equal(result.code, 0, result.stderr);
  } finally {
    await relay.cleanup();
  }
  const stats = await store.outbox.stats();
  assert.deepEqual([stats.dispatched, stats.claimed, stats.pending], [3, 0, 0]);
});

Deno.test("cli relay sqlite: delivers every message, exactly once in the stream", async () => {
  await using store = await sqliteStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const batch = records(stream.prefix, 200);
    await store.outbox.enqueueMany(batch);
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--status-interval",
      "100ms",
    ]);
    try {
      await relay.waitForLine(/^relay: published 200 /);
      relay.kill("SIGTERM");
      assert.equal((await relay.done).code, 0);
    } finally {
      await relay.cleanup();
    }
    const ids = await streamIds(nc, stream.name);
    assert.equal(ids.length, 200);
    assert.deepEqual(duplicatesOf(ids), []);
    assert.equal((await store.outbox.stats()).dispatched, 200);
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay health: 200 ready with the backlog; 503 store_unavailable when the table is gone", async () => {
  await using store = await postgresStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    // A failed message waiting for its retry: backlog that is not due.
    await store.outbox.enqueueMany(records(stream.prefix, 2));
    const [claimed] = await store.outbox.claimDue(1, new Date());
    await store.outbox.markFailed(claimed, {
      error: "timeout",
      now: new Date(),
      nextAttemptAt: new Date(Date.now() + 3_600_000),
    });
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--health",
      "0",
      "--health-host",
      "127.0.0.1",
      "--status-interval",
      "0",
    ]);
    try {
      const port = healthPort(await relay.waitForLine(/health endpoint on/));
      await relay.waitForLine(/^relay: started/);
      const ready = await eventually(async () => {
        const answer = await health(port);
        const backlog = answer.body.backlog as { pending: number; claimed: number } | null;
        if (backlog?.pending !== 0 || backlog.claimed !== 0) throw new Error("not drained yet");
        return answer;
      });
      assert.equal(ready.status, 200);
      assert.equal(ready.body.status, "ready");
      assert.equal(ready.body.ready, true);
      assert.equal(ready.body.breaker, "closed");
      assert.deepEqual(ready.body.backlog, {
        due: 0,
        oldestDueAgeMs: null,
        pending: 0,
        claimed: 0,
        failed: 1,
        dead: 0,
      });
      assert.equal((ready.body.store as { ok: boolean }).ok, true);
      assert.equal((ready.body.relay as { published: number }).published, 1);

      await store.sql.unsafe(`DROP TABLE ${store.table}`);
      const failing = await eventually(async () => {
        const answer = await health(port);
        if (answer.status !== 503) throw new Error("still ready");
        return answer;
      });
      assert.equal(failing.body.status, "store_unavailable");
      assert.equal(failing.body.ready, false);
      assert.match((failing.body.store as { error: string }).error, /does not exist/);

      relay.kill("SIGTERM");
      const result = await relay.done;
      assert.equal(result.code, 0, result.stderr);
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay health: 503 paused while the broker is frozen, 200 again once it answers", async () => {
  await using server = await NatsServer.start();
  await using store = await postgresStore();
  const nc = await connectNats(server.url);
  try {
    const jsm = await jetstreamManager(nc);
    const prefix = uniqueName("frozen");
    await jsm.streams.add({ name: prefix, subjects: [`${prefix}.>`] });
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      server.url,
      "--publish-timeout",
      "300ms",
      "--poll",
      "100ms",
      "--health",
      "0",
      "--health-host",
      "127.0.0.1",
      "--status-interval",
      "0",
    ]);
    try {
      const port = healthPort(await relay.waitForLine(/health endpoint on/));
      await relay.waitForLine(/^relay: started/);
      assert.equal((await health(port)).status, 200);
      server.pause();
      try {
        await store.outbox.enqueueMany(records(prefix, 3));
        await relay.waitForLine(/^relay: JetStream unavailable, paused/);
        const paused = await health(port);
        assert.equal(paused.status, 503);
        assert.equal(paused.body.status, "paused");
        assert.equal(paused.body.breaker, "open");
      } finally {
        server.resume();
      }
      await relay.waitForLine(/^relay: JetStream available again, resumed after/);
      const resumed = await eventually(async () => {
        const answer = await health(port);
        if (answer.status !== 200) throw new Error(`still ${answer.body.status}`);
        return answer;
      });
      assert.equal(resumed.body.status, "ready");
      await eventually(async () => {
        if ((await jsm.streams.info(prefix)).state.messages !== 3) throw new Error("not yet");
      });
      relay.kill("SIGTERM");
      assert.equal((await relay.done).code, 0);
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay: a second signal exits at once while a publish hangs (code 143)", async () => {
  await using server = await NatsServer.start();
  await using store = await postgresStore();
  const nc = await connectNats(server.url);
  try {
    const jsm = await jetstreamManager(nc);
    const prefix = uniqueName("hang");
    await jsm.streams.add({ name: prefix, subjects: [`${prefix}.>`] });
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      server.url,
      "--lease",
      "1h",
      "--publish-timeout",
      "10m",
      "--poll",
      "100ms",
      "--status-interval",
      "0",
    ]);
    try {
      await relay.waitForLine(/^relay: started/);
      server.pause();
      try {
        await store.outbox.enqueueMany(records(prefix, 2));
        // The relay claims them and waits for PubAcks that cannot come.
        await eventually(async () => {
          if ((await store.outbox.stats()).claimed !== 2) throw new Error("not claimed yet");
        });
        relay.kill("SIGTERM");
        await relay.waitForLine(/^relay: SIGTERM: claiming nothing more/);
        relay.kill("SIGTERM");
        const result = await relay.done;
        assert.equal(result.code, 143);
        assert.match(result.stderr, /relay: SIGTERM again: exiting now/);
      } finally {
        server.resume();
      }
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});

Deno.test("cli relay sqlite: --key-fence subject publishes keyed messages fenced (a foreign message on the key's subject parks the key with key_fence)", async () => {
  await using store = await sqliteStore();
  const nc = await connectNats();
  try {
    await using stream = await createTestStream(nc);
    const subject = `${stream.prefix}.order-7`;
    const keyed = (id: string) => ({
      id,
      kind: "event.publish" as const,
      name: "order.updated",
      subject,
      payload: "{}",
      headers: {},
      orderingKey: "order-7",
    });
    await store.outbox.enqueue(keyed("o7-1"));
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--key-fence",
      "subject",
      "--poll",
      "100ms",
      "--status-interval",
      "0",
    ]);
    try {
      await relay.waitForLine(/^relay: started/);
      await eventually(async () => {
        if ((await store.outbox.get("o7-1"))?.state !== "dispatched") throw new Error("not yet");
      });
      // Someone else publishes to the key's subject; the key's next message must not follow it.
      await jetstream(nc).publish(subject, "{}", {
        msgID: "foreign",
      });
      await store.outbox.enqueue(keyed("o7-2"));
      await eventually(async () => {
        if ((await store.outbox.get("o7-2"))?.state !== "dead") throw new Error("not yet");
      });
      relay.kill("SIGTERM");
      assert.equal((await relay.done).code, 0);
    } finally {
      await relay.cleanup();
    }
    assert.match((await store.outbox.get("o7-2"))?.lastError ?? "", /^key_fence: /);
    const blocked = await runCli(["keys", "blocked", ...store.args]);
    assert.match(blocked.stdout, /order-7/);
    assert.deepEqual(await streamIds(nc, stream.name), ["o7-1", "foreign"]);
  } finally {
    await nc.close();
  }
});
