/** The lint plugin that keeps library code runnable on Node 20 (scripts/lint_node_compat.ts). */

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import plugin from "../scripts/lint_node_compat.ts";

const libraryFile = fileURLToPath(new URL("../src/core/probe.ts", import.meta.url));
const testFile = fileURLToPath(new URL("./probe_test.ts", import.meta.url));

function lint(filename: string, source: string): string[] {
  return Deno.lint.runPlugin(plugin, filename, source).map((d) => d.id);
}

Deno.test("library files: the Deno namespace, import.meta.main and node:sqlite are reported", () => {
  assert.deepEqual(lint(libraryFile, `export const home = Deno.env.get("HOME");`), [
    "outbox/no-deno-global",
  ]);
  assert.deepEqual(lint(libraryFile, `export type K = Deno.Kv;`), ["outbox/no-deno-global"]);
  assert.deepEqual(lint(libraryFile, `export const main = import.meta.main;`), [
    "outbox/no-deno-global",
  ]);
  assert.deepEqual(
    lint(
      libraryFile,
      `import type { DatabaseSync } from "node:sqlite";\nexport type D = DatabaseSync;`,
    ),
    ["outbox/no-node-sqlite-import"],
  );
});

Deno.test("library files: a property named Deno and node: APIs are fine", () => {
  assert.deepEqual(
    lint(
      libraryFile,
      `import { randomUUID } from "node:crypto";\nexport const x = { Deno: randomUUID() };\nexport const y = x.Deno;`,
    ),
    [],
  );
});

Deno.test("tests, scripts and benchmarks may use Deno", () => {
  assert.deepEqual(lint(testFile, `export const home = Deno.env.get("HOME");`), []);
});
