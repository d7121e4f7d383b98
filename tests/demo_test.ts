/**
 * First contact: `deno task demo`'s error paths are one line (exit 2 for usage, 1 for a NATS
 * server without JetStream), and a fresh clone's first `deno task` prints no warning box (no npm
 * package with a build script in deno.json).
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { freePort } from "./kit/mod.ts";
import { natsServerBinary } from "./kit/nats_server.ts";

const root = new URL("../", import.meta.url).pathname;

async function demo(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", join(root, "scripts", "demo.ts"), ...args],
    cwd: root,
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  const text = new TextDecoder();
  return {
    code: output.code,
    stdout: text.decode(output.stdout),
    stderr: text.decode(output.stderr),
  };
}

function assertOneLine(stderr: string, pattern: RegExp): void {
  const lines = stderr.split("\n").filter((line) => line.length > 0);
  assert.equal(lines.length, 1, `one line on stderr, got:\n${stderr}`);
  assert.match(lines[0], pattern);
  assert.doesNotMatch(stderr, /^\s+at /m, "no stack trace");
}

Deno.test("demo: usage errors are one line with exit code 2", async () => {
  for (
    const [args, pattern] of [
      [["--bogus"], /^demo: Unknown option '--bogus'; usage: deno task demo/],
      [["--orders", "-3"], /^demo: --orders must be a positive integer/],
      [["--orders", "many"], /^demo: --orders must be a positive integer, got "many"/],
      [["--orders"], /^demo: Option '--orders <value>' argument missing/],
    ] as Array<[string[], RegExp]>
  ) {
    const result = await demo(args);
    assert.equal(result.code, 2, `${args.join(" ")}: ${result.stderr}`);
    assertOneLine(result.stderr, pattern);
  }
  const help = await demo(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /^usage: deno task demo/);
});

Deno.test({
  name: "demo: a NATS server without JetStream is one line with exit code 1",
  ignore: natsServerBinary() === undefined,
  async fn() {
    const port = freePort();
    const server = new Deno.Command(natsServerBinary()!, {
      args: ["-a", "127.0.0.1", "-p", String(port)], // no -js
      stdout: "null",
      stderr: "null",
    }).spawn();
    try {
      // Wait until it accepts connections.
      for (let i = 0; i < 100; i++) {
        try {
          (await Deno.connect({ hostname: "127.0.0.1", port })).close();
          break;
        } catch {
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      }
      const result = await demo(["--orders", "5"], { NATS_URL: `nats://127.0.0.1:${port}` });
      assert.equal(result.code, 1, result.stderr);
      assertOneLine(
        result.stderr,
        new RegExp(
          `^demo: the NATS server at nats://127\\.0\\.0\\.1:${port} does not have JetStream enabled \\(start it with -js\\)`,
        ),
      );
    } finally {
      server.kill("SIGTERM");
      await server.status;
    }
  },
});

Deno.test("fresh clone: the first deno task prints no warning box (no npm build scripts)", async () => {
  // A fresh DENO_DIR is a fresh clone's cache: every npm package of deno.json is fetched.
  const denoDir = await Deno.makeTempDir({ prefix: "outbox_fresh_deno_dir_" });
  try {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["task", "demo", "--help"],
      cwd: root,
      env: { DENO_DIR: denoDir, NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(120_000),
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    assert.doesNotMatch(stderr, /Warning|Ignored build scripts|lifecycle scripts/i, stderr);
  } finally {
    await Deno.remove(denoDir, { recursive: true });
  }
});
