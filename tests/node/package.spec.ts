/**
 * The installed package.json says what the README and docs/development.md (shipped in the
 * package) say: the Node versions (`engines.node`, the install line) and how `@nats-io/kv` is
 * declared.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

// The suite runs in the scratch project (scripts/test_node.ts), where the package is installed.
const root = join(process.cwd(), "node_modules", "@outbox", "nats");
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
const readme = readFileSync(join(root, "README.md"), "utf8");
// The npm build's page, shipped next to the README it is linked from.
const development = readFileSync(join(root, "docs", "development.md"), "utf8");

test("package: engines.node is what the README says, and the running Node satisfies it", () => {
  const documented = /`engines\.node` is `([^`]+)`/.exec(development)?.[1];
  assert.equal(pkg.engines?.node, documented);
  assert.equal(pkg.engines.node, ">=22");
  assert.match(readme, /npm install @outbox\/nats +# Node 22\+/);
  assert.ok(Number(process.versions.node.split(".")[0]) >= 22, process.version);
});

test("package: @nats-io/kv is a dependency, as the README says", () => {
  assert.match(development, /among them `@nats-io\/kv`, which the `outbox-nats` CLI uses/);
  assert.ok(pkg.dependencies?.["@nats-io/kv"], JSON.stringify(pkg.dependencies));
  assert.equal(pkg.peerDependencies?.["@nats-io/kv"], undefined);
});
