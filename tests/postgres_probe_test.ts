/**
 * A Postgres URL pointing at something that is not Postgres fails fast, in one line naming host
 * and port: NATS's port (it greets with INFO), a silent server (within the timeout), a server
 * that hangs up, a closed port. The real Postgres passes. The CLI says the same, in one line.
 */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:net";
import { checkPostgresServer, PostgresServerError } from "../mod.ts";
import { runCli } from "./helpers/cli.ts";
import { freePort, natsUrl, postgresUrl } from "./kit/mod.ts";

/** A TCP server on 127.0.0.1 that does `onConnection` with each socket. */
async function fakeServer(
  onConnection: (socket: import("node:net").Socket) => void,
): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<import("node:net").Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => sockets.delete(socket));
    onConnection(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

async function natsPort(): Promise<number> {
  const url = (await natsUrl()).split(",")[0].replace(/^(nats|tls):/, "http:");
  return Number(new URL(url).port || 4222);
}

Deno.test("checkPostgresServer: the real Postgres passes", async () => {
  await checkPostgresServer(await postgresUrl());
});

Deno.test("checkPostgresServer: NATS's port is named, at once, as not Postgres", async () => {
  const port = await natsPort();
  const started = performance.now();
  await assert.rejects(
    checkPostgresServer(`postgres://user:s3cret@127.0.0.1:${port}/app`, { timeoutMs: 5_000 }),
    (error: unknown) => {
      assert.ok(error instanceof PostgresServerError);
      assert.equal(error.host, "127.0.0.1");
      assert.equal(error.port, port);
      assert.match(
        error.message,
        new RegExp(
          `^127\\.0\\.0\\.1:${port} is not a Postgres server\\? it answered 'INFO .*\\(NATS\\)$`,
        ),
      );
      assert.doesNotMatch(error.message, /s3cret/);
      return true;
    },
  );
  assert.ok(performance.now() - started < 4_000, "no wait for the timeout");
});

Deno.test("checkPostgresServer: a silent server fails within the timeout", async () => {
  const server = await fakeServer(() => {});
  try {
    const started = performance.now();
    await assert.rejects(
      checkPostgresServer(`postgres://127.0.0.1:${server.port}/app`, { timeoutMs: 300 }),
      new RegExp(
        `^PostgresServerError: 127\\.0\\.0\\.1:${server.port} is not a Postgres server\\? no Postgres answer within 300 ms$`,
      ),
    );
    assert.ok(performance.now() - started < 3_000);
  } finally {
    await server.close();
  }
});

Deno.test("checkPostgresServer: a server that hangs up, and a closed port", async () => {
  const server = await fakeServer((socket) => socket.end());
  try {
    await assert.rejects(
      checkPostgresServer(`postgresql://127.0.0.1:${server.port}/app`),
      /is not a Postgres server\? it closed the connection without answering/,
    );
  } finally {
    await server.close();
  }
  const closed = freePort();
  await assert.rejects(
    checkPostgresServer(`postgres://127.0.0.1:${closed}/app`),
    new RegExp(`cannot connect to 127\\.0\\.0\\.1:${closed}: ECONNREFUSED`),
  );
});

Deno.test("cli: a Postgres URL at NATS's port fails in one line instead of hanging", async () => {
  const port = await natsPort();
  // Bounded: before the fix the CLI never returned.
  const result = await runCli(
    ["status", "--store", `postgres://u:s3cret@127.0.0.1:${port}/app`],
    {},
    {
      timeoutMs: 30_000,
    },
  );
  assert.equal(result.code, 1, result.stderr);
  const lines = result.stderr.trim().split("\n");
  assert.equal(lines.length, 1, result.stderr);
  assert.match(
    lines[0],
    new RegExp(
      `^outbox-nats: cannot connect to Postgres at .*: 127\\.0\\.0\\.1:${port} is not a Postgres server\\?`,
    ),
  );
  assert.doesNotMatch(result.stderr, /s3cret/);
});
