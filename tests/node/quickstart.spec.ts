/**
 * The README's Node quick start, extracted by scripts/test_node.ts and run as written with
 * `node`, next to the installed package, in an empty directory (it creates orders.db and
 * billing.db there) against a NATS server of its own (it creates the stream ORDERS); then run
 * again in the same directory, as a user would.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

test("node: the README's Node quick start runs as written, and again in the same directory", async () => {
  const dir = process.env.OUTBOX_QUICKSTART_DIR;
  const url = process.env.OUTBOX_QUICKSTART_NATS_URL;
  assert.ok(dir && url, "OUTBOX_QUICKSTART_DIR and _NATS_URL are set (scripts/test_node.ts)");
  const cwd = mkdtempSync(join(dir, "run-"));
  try {
    const runQuickstart = promisify(execFile);
    const ids: string[] = [];
    for (const run of [1, 2]) {
      const result: { stdout: string } = await runQuickstart(process.execPath, [
        join(dir, "quickstart.mjs"),
      ], {
        cwd,
        env: { ...process.env, NATS_URL: url },
        timeout: 60_000,
      });
      const stdout: string = String(result.stdout);
      const match: RegExpExecArray | null = /^invoiced order (\d+)$/m.exec(stdout);
      assert.ok(match, `run ${run} printed: ${stdout}`);
      ids.push(match[1]);
    }
    assert.notEqual(ids[0], ids[1], "each run bills a new order");
  } finally {
    rmSync(cwd, { recursive: true, force: true });
  }
});
