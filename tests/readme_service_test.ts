/**
 * The README's complete Postgres service (service, dispatcher woken by LISTEN/NOTIFY, inbox
 * consumer) runs as written: extracted, run with `deno run` against a fresh database and a
 * private NATS server (it creates the stream ORDERS), twice, printing the invoiced order.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { createTestDatabase, NatsServer } from "./kit/mod.ts";
import { natsServerBinary } from "./kit/nats_server.ts";

const root = new URL("../", import.meta.url).pathname;

/** The first ```ts block under the README heading `heading`. */
async function readmeBlock(heading: string): Promise<string> {
  const readme = await Deno.readTextFile(join(root, "README.md"));
  const start = readme.indexOf(`\n${heading}\n`);
  assert.ok(start >= 0, `README has no heading ${heading}`);
  const match = /^```ts[^\n]*\n([\s\S]*?)^```$/m.exec(readme.slice(start));
  assert.ok(match, `no ts block under ${heading}`);
  return match[1];
}

Deno.test({
  name: "README: the complete Postgres service runs as written, twice",
  ignore: natsServerBinary() === undefined,
  async fn() {
    const code = await readmeBlock("## A complete service on Postgres");
    // Inside the repository, so deno.json maps "@outbox/nats" and the npm packages.
    const dir = join(root, ".tmp", "readme_examples");
    await Deno.mkdir(dir, { recursive: true });
    const file = join(dir, `service_${crypto.randomUUID()}.ts`);
    await Deno.writeTextFile(file, code);
    await using database = await createTestDatabase();
    const nats = await NatsServer.start();
    try {
      const ids: string[] = [];
      for (let run = 0; run < 2; run++) {
        const output = await new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", "--quiet", file],
          cwd: root,
          env: { DATABASE_URL: database.url, NATS_URL: nats.url, NO_COLOR: "1" },
          stdout: "piped",
          stderr: "piped",
          signal: AbortSignal.timeout(60_000),
        }).output();
        const stdout = new TextDecoder().decode(output.stdout);
        const stderr = new TextDecoder().decode(output.stderr);
        assert.equal(output.code, 0, `run ${run + 1}: ${stderr}`);
        const match = /^invoiced order (\d+)$/m.exec(stdout);
        assert.ok(match, `run ${run + 1} printed: ${stdout}\n${stderr}`);
        ids.push(match[1]);
      }
      assert.notEqual(ids[0], ids[1]);
    } finally {
      await nats.stop();
      await Deno.remove(file);
    }
  },
});
