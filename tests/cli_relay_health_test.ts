/**
 * The relay's liveness and readiness endpoints (issue #19 item 1): a server without JetStream
 * is "not ready" and spends no attempts; a subject without a stream is a clear per-subject
 * error, and dead-lettering makes the relay "degraded" (still ready). The endpoint binds
 * 127.0.0.1 unless told otherwise.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { CliProcess, postgresStore, seedRecords } from "./helpers/cli.ts";
import {
  connectNats,
  createTestStream,
  eventually,
  NatsServer,
  natsUrl,
  uniqueName,
} from "./kit/mod.ts";

async function get(
  port: number,
  path: string,
): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: response.status, body: await response.json() };
}

function endpoint(line: string): { host: string; port: number } {
  const match = /health endpoint on http:\/\/([^:]+):(\d+)\//.exec(line);
  assert.ok(match, line);
  return { host: match[1], port: Number(match[2]) };
}

Deno.test("cli relay health: against a server without JetStream /readyz is 503 (jetstream_not_enabled), /livez 200, nothing goes dead", async () => {
  await using server = await NatsServer.start({ jetstream: false });
  await using store = await postgresStore();
  const records = seedRecords(uniqueName("nojs"), 3);
  await store.outbox.enqueueMany(records);
  const relay = new CliProcess([
    "relay",
    ...store.args,
    "--nats",
    server.url,
    "--max-attempts",
    "1",
    "--poll",
    "50ms",
    "--health",
    "0",
    "--status-interval",
    "0",
  ]);
  try {
    const { host, port } = endpoint(await relay.waitForLine(/health endpoint on/));
    assert.equal(host, "127.0.0.1", "binds loopback unless told otherwise");
    await relay.waitForLine(/^relay: JetStream unavailable, paused: .*jetstream_not_enabled/);
    const ready = await eventually(async () => {
      const answer = await get(port, "/readyz");
      if (answer.body.status !== "paused") throw new Error(`status ${answer.body.status}`);
      return answer;
    });
    assert.equal(ready.status, 503);
    assert.equal(ready.body.ready, false);
    assert.equal((ready.body.breakerError as { code: string }).code, "jetstream_not_enabled");
    const live = await get(port, "/livez");
    assert.equal(live.status, 200);
    assert.equal(live.body.status, "alive");
    // The breaker keeps probing; with --max-attempts 1 a spent attempt would have killed them.
    for (const record of records) {
      const stored = await store.outbox.get(record.id);
      assert.notEqual(stored?.state, "dead", record.id);
    }
    assert.equal((await store.outbox.stats()).dead, 0);
    relay.kill("SIGTERM");
    const result = await relay.done;
    assert.equal(result.code, 0, result.stderr);
    assert.doesNotMatch(result.stderr, /relay: dead:/);
  } finally {
    await relay.cleanup();
  }
});

Deno.test("cli relay health: no stream for a subject is a clear per-subject error; dead-lettering makes the relay degraded but ready", async () => {
  await using store = await postgresStore();
  const subject = `${uniqueName("nostream")}.created`;
  const [record] = seedRecords(uniqueName("ns"), 1).map((item) => ({ ...item, subject }));
  await store.outbox.enqueue(record);
  const relay = new CliProcess([
    "relay",
    ...store.args,
    "--nats",
    await natsUrl(),
    "--max-attempts",
    "1",
    "--health",
    "0",
    "--health-host",
    "127.0.0.1",
    "--status-interval",
    "0",
  ]);
  try {
    const { port } = endpoint(await relay.waitForLine(/health endpoint on/));
    const dead = await relay.waitForLine(/^relay: dead: /);
    assert.match(
      dead,
      new RegExp(
        `no_stream: no JetStream stream captures the subject '${subject.replaceAll(".", "\\.")}'`,
      ),
    );
    assert.doesNotMatch(dead, /not enabled/i);
    const degraded = await eventually(async () => {
      const answer = await get(port, "/readyz");
      if (answer.body.status !== "degraded") throw new Error(`status ${answer.body.status}`);
      return answer;
    });
    assert.equal(degraded.status, 200, "degraded is still ready");
    assert.match((degraded.body.reasons as string[]).join("; "), /messages went dead/);
    assert.equal((await get(port, "/health")).status, 200, "any other path: the readiness report");
    relay.kill("SIGTERM");
    assert.equal((await relay.done).code, 0);
  } finally {
    await relay.cleanup();
  }
});

Deno.test("cli relay health: a full stream waits on its own: degraded (ready) with the paused stream listed, ready again once it has room", async () => {
  await using store = await postgresStore();
  const nc = await connectNats();
  try {
    const jsm = await jetstreamManager(nc);
    await using full = await createTestStream(nc, { max_msgs: 1, discard: "new" as never });
    await jetstream(nc).publish(`${full.prefix}.seed`, "{}");
    const records = seedRecords(uniqueName("full"), 2).map((item) => ({
      ...item,
      subject: `${full.prefix}.e`,
    }));
    await store.outbox.enqueueMany(records);
    const relay = new CliProcess([
      "relay",
      ...store.args,
      "--nats",
      await natsUrl(),
      "--max-attempts",
      "1",
      "--poll",
      "100ms",
      "--health",
      "0",
      "--status-interval",
      "0",
    ]);
    try {
      const { port } = endpoint(await relay.waitForLine(/health endpoint on/));
      await relay.waitForLine(
        new RegExp(`^relay: stream '${full.name}' unavailable, its messages wait`),
      );
      const degraded = await eventually(async () => {
        const answer = await get(port, "/readyz");
        if (answer.body.status !== "degraded") throw new Error(`status ${answer.body.status}`);
        return answer;
      });
      assert.equal(degraded.status, 200);
      assert.equal(degraded.body.breaker, "closed");
      const [paused] = degraded.body.pausedScopes as Array<Record<string, unknown>>;
      assert.equal(paused.kind, "stream");
      assert.equal(paused.stream, full.name);
      assert.equal(paused.code, "api_10077");
      const info = await jsm.streams.info(full.name);
      await jsm.streams.update(full.name, { ...info.config, max_msgs: 100 });
      await relay.waitForLine(new RegExp(`^relay: stream '${full.name}' available again`));
      await eventually(async () => {
        if ((await jsm.streams.info(full.name)).state.messages !== 3) throw new Error("not yet");
      });
      const ready = await eventually(async () => {
        const answer = await get(port, "/readyz");
        if (answer.body.status !== "ready") throw new Error(`status ${answer.body.status}`);
        return answer;
      });
      assert.deepEqual(ready.body.pausedScopes, []);
      assert.equal((await store.outbox.stats()).dead, 0, "nothing dead although --max-attempts 1");
      relay.kill("SIGTERM");
      assert.equal((await relay.done).code, 0);
    } finally {
      await relay.cleanup();
    }
  } finally {
    await nc.close();
  }
});
