/**
 * Builds the npm package, installs the packed tarball into a scratch Node project (as a user's
 * `npm install` would), compiles tests/node/ there, and runs them with `node --test` against the
 * INSTALLED package. Servers come from OUTBOX_TEST_NATS_URL / OUTBOX_TEST_POSTGRES_URL (run it
 * through tests/kit/run.ts, as `deno task test:node` does).
 *
 * @module
 */

import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { buildTools } from "./build_npm.ts";

/** Packages the Node tests use, pinned (better-sqlite3 13 needs Node 22; 12 runs on Node 20). */
const testDeps: Record<string, string> = {
  ...buildTools,
  "@nats-io/transport-node": "3.4.0",
  "@nats-io/jetstream": "3.4.0",
  "@nats-io/kv": "3.4.0",
  "better-sqlite3": "12.4.1",
  "@types/better-sqlite3": "7.6.13",
  pg: "8.16.3",
  "@types/pg": "8.15.5",
  postgres: "3.4.9",
};

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const scratch = join(root, ".tmp", "node-test");

async function run(cmd: string, args: string[], cwd: string, quiet = false): Promise<string> {
  const output = await new Deno.Command(cmd, {
    args,
    cwd,
    stdout: quiet ? "piped" : "inherit",
    stderr: "inherit",
  }).output();
  if (!output.success) throw new Error(`${cmd} ${args.join(" ")} failed in ${cwd}`);
  return quiet ? new TextDecoder().decode(output.stdout) : "";
}

async function copyDir(from: string, to: string): Promise<void> {
  await Deno.mkdir(to, { recursive: true });
  for await (const entry of Deno.readDir(from)) {
    if (entry.isDirectory) await copyDir(join(from, entry.name), join(to, entry.name));
    else if (entry.isFile) await Deno.copyFile(join(from, entry.name), join(to, entry.name));
  }
}

await run(Deno.execPath(), ["run", "-A", join(root, "scripts", "build_npm.ts")], root);

await Deno.remove(scratch, { recursive: true }).catch(() => {});
await Deno.mkdir(scratch, { recursive: true });
const tarball =
  (await run("npm", ["pack", "--silent", "--pack-destination", scratch], join(root, "npm"), true))
    .trim().split("\n").at(-1)!;
await Deno.writeTextFile(
  join(scratch, "package.json"),
  JSON.stringify(
    {
      private: true,
      type: "module",
      dependencies: { "@outbox/nats": `file:./${tarball}`, ...testDeps },
    },
    null,
    2,
  ),
);
await run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error"], scratch);

// Tests: tests/node/*.ts plus the shared conformance cases, compiled against the installed package.
await copyDir(join(root, "tests", "node"), join(scratch, "tests", "node"));
await copyDir(join(root, "tests", "conformance"), join(scratch, "tests", "conformance"));
await Deno.remove(join(scratch, "tests", "conformance", "deno.ts"));
// The cases import the library's types from the repository root; point them at the package.
const cases = join(scratch, "tests", "conformance", "cases.ts");
await Deno.writeTextFile(
  cases,
  (await Deno.readTextFile(cases)).replace(`from "../../mod.ts"`, `from "@outbox/nats"`),
);
await Deno.writeTextFile(
  join(scratch, "tsconfig.json"),
  JSON.stringify({
    compilerOptions: {
      target: "ES2022",
      lib: ["ES2024"],
      module: "NodeNext",
      moduleResolution: "NodeNext",
      types: ["node"],
      strict: true,
      rewriteRelativeImportExtensions: true,
      allowImportingTsExtensions: true,
      verbatimModuleSyntax: true,
      skipLibCheck: true,
      outDir: "dist",
      rootDir: ".",
    },
    include: ["tests/**/*.ts"],
  }),
);
await run(join(scratch, "node_modules", ".bin", "tsc"), ["-p", "."], scratch);

const nodeVersion = (await run("node", ["--version"], scratch, true)).trim();
console.log(`node ${nodeVersion}: running the Node suite against the installed @outbox/nats`);
const files: string[] = [];
for await (const entry of Deno.readDir(join(scratch, "dist", "tests", "node"))) {
  if (entry.name.endsWith(".spec.js")) files.push(join("dist", "tests", "node", entry.name));
}
files.sort();
const status = await new Deno.Command("node", {
  args: ["--test", "--test-concurrency=1", ...files],
  cwd: scratch,
  stdout: "inherit",
  stderr: "inherit",
}).spawn().status;
Deno.exit(status.code);
