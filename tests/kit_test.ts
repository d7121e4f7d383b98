/**
 * The test kit itself: private servers really start, bind, die, and come back; resolution
 * starts local servers when the env URLs are unset.
 */

import assert from "node:assert/strict";
import postgres from "postgres";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  connectNats,
  freePort,
  isPortFree,
  NatsServer,
  PostgresServer,
  resolveNats,
  resolvePostgres,
} from "./kit/mod.ts";
import { eventually } from "./kit/mod.ts";
import { natsUrlEnv, postgresUrlEnv } from "./kit/services.ts";

Deno.test("kit: private NATS survives kill -9 and restarts on the same port and store", async () => {
  await using server = await NatsServer.start();
  assert.equal(isPortFree(server.port), false, "the server bound its port");
  const nc = await connectNats(server.url, {
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "kit", subjects: ["kit.>"] });
    const js = jetstream(nc);
    await js.publish("kit.a", "one", { msgID: "m-1" });
    const firstPid = server.pid;
    await server.kill("SIGKILL");
    assert.equal(isPortFree(server.port), true, "killed server released the port");
    await server.restart();
    assert.notEqual(server.pid, firstPid);
    const info = await eventually(() => jsm.streams.info("kit"));
    assert.equal(info.state.messages, 1, "JetStream store kept across restart");
    const ack = await js.publish("kit.a", "one", { msgID: "m-1" });
    assert.equal(ack.duplicate, true, "duplicate window survives restart");
  } finally {
    await nc.close();
  }
});

Deno.test("kit: a paused NATS answers nothing until resumed", async () => {
  await using server = await NatsServer.start();
  const nc = await connectNats(server.url);
  try {
    server.pause();
    // SIGSTOP reaches every thread of the server asynchronously: wait until the kernel reports
    // the process stopped before asking (a PING sent in between could still be answered).
    if (Deno.build.os === "linux") {
      await eventually(async () => {
        const stat = await Deno.readTextFile(`/proc/${server.pid}/stat`);
        assert.equal(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0], "T");
      }, { timeoutMs: 5_000, intervalMs: 10 });
    }
    const rtt = nc.rtt().then(() => "answered", () => "failed");
    let timer: ReturnType<typeof setTimeout> | undefined;
    const first = await Promise.race([
      rtt,
      new Promise<string>((resolve) => timer = setTimeout(() => resolve("silent"), 300)),
    ]);
    clearTimeout(timer);
    assert.equal(first, "silent");
    server.resume();
    assert.equal(await rtt, "answered");
  } finally {
    await nc.close();
  }
});

Deno.test("kit: starting on a busy port fails with a clear error", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: freePort() });
  try {
    await assert.rejects(
      NatsServer.start({ port: (listener.addr as Deno.NetAddr).port }),
      /already in use/,
    );
  } finally {
    listener.close();
  }
});

Deno.test("kit: private Postgres restarts and survives kill -9", async () => {
  await using server = await PostgresServer.start();
  const connect = () => postgres(server.url, { max: 1, onnotice: () => {} });
  let sql = connect();
  try {
    await sql`CREATE TABLE kit (v int)`;
    await sql`INSERT INTO kit VALUES (1)`;
    await server.restart();
    await sql.end();
    sql = connect();
    assert.deepEqual([...await sql`SELECT v FROM kit`], [{ v: 1 }]);
    await sql.end();
    await server.kill("SIGKILL");
    assert.equal(isPortFree(server.port), true);
    await server.start();
    sql = connect();
    assert.deepEqual([...await sql`SELECT v FROM kit`], [{ v: 1 }]);
  } finally {
    await sql.end();
  }
});

Deno.test("kit: with the env URLs unset, resolution starts local servers", async () => {
  const saved = [Deno.env.get(natsUrlEnv), Deno.env.get(postgresUrlEnv)];
  Deno.env.delete(natsUrlEnv);
  Deno.env.delete(postgresUrlEnv);
  try {
    const [nats, pg] = await Promise.all([resolveNats(), resolvePostgres()]);
    try {
      assert.equal(nats.source, "local");
      assert.equal(pg.source, "local");
      const nc = await connectNats(nats.url);
      const jsm = await jetstreamManager(nc);
      assert.ok((await jsm.getAccountInfo()).limits, "JetStream is enabled");
      await nc.close();
      const sql = postgres(pg.url, { max: 1 });
      assert.deepEqual([...await sql`SELECT 1 AS one`], [{ one: 1 }]);
      await sql.end();
    } finally {
      await Promise.all([nats.stop(), pg.stop()]);
    }
  } finally {
    if (saved[0]) Deno.env.set(natsUrlEnv, saved[0]);
    if (saved[1]) Deno.env.set(postgresUrlEnv, saved[1]);
  }
});

Deno.test("kit: with no env URL and no local Postgres binaries, resolution starts the npm-shipped Postgres 18", async () => {
  const names = [postgresUrlEnv, "OUTBOX_POSTGRES_BIN_DIR"];
  const saved = new Map(names.map((name) => [name, Deno.env.get(name)]));
  Deno.env.delete(postgresUrlEnv);
  Deno.env.set("OUTBOX_POSTGRES_BIN_DIR", "/nonexistent/bin");
  try {
    const pg = await resolvePostgres();
    try {
      assert.equal(pg.source, "embedded");
      const sql = postgres(pg.url, { max: 1 });
      try {
        const [{ server_version_num }] = await sql`SHOW server_version_num`;
        assert.equal(Math.floor(Number(server_version_num) / 10000), 18);
      } finally {
        await sql.end();
      }
    } finally {
      await pg.stop();
    }
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) Deno.env.delete(name);
      else Deno.env.set(name, value);
    }
  }
});

Deno.test("kit: with no env URL, no binaries and no Docker engine, resolution says what to install", async () => {
  const names = [
    natsUrlEnv,
    postgresUrlEnv,
    "OUTBOX_NATS_SERVER_BIN",
    "OUTBOX_POSTGRES_BIN_DIR",
    "OUTBOX_EMBEDDED_POSTGRES",
    "PATH",
  ];
  const saved = new Map(names.map((name) => [name, Deno.env.get(name)]));
  for (const name of [natsUrlEnv, postgresUrlEnv]) Deno.env.delete(name);
  Deno.env.set("OUTBOX_NATS_SERVER_BIN", "/nonexistent/nats-server");
  Deno.env.set("OUTBOX_POSTGRES_BIN_DIR", "/nonexistent/bin");
  Deno.env.set("OUTBOX_EMBEDDED_POSTGRES", "off");
  Deno.env.set("PATH", "/nonexistent"); // no docker client either
  try {
    await assert.rejects(resolveNats(), (error: Error) => {
      assert.equal(error.name, "KitError");
      assert.match(error.message, /set OUTBOX_TEST_NATS_URL, install nats-server/);
      return true;
    });
    await assert.rejects(resolvePostgres(), (error: Error) => {
      assert.equal(error.name, "KitError");
      assert.match(error.message, /set OUTBOX_TEST_POSTGRES_URL, install PostgreSQL/);
      return true;
    });
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) Deno.env.delete(name);
      else Deno.env.set(name, value);
    }
  }
});
