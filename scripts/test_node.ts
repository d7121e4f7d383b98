/**
 * Builds the npm package, installs the packed tarball into a scratch Node project (as a user's
 * `npm install` would), compiles tests/node/ there, and runs them with `node --test` against the
 * INSTALLED package. Servers come from OUTBOX_TEST_NATS_URL / OUTBOX_TEST_POSTGRES_URL (run it
 * through tests/kit/run.ts, as `deno task test:node` does).
 *
 * - Versions: every package the Node tests use is pinned in deno.json `imports` (one list for
 *   Deno and Node).
 * - The scratch project (`.tmp/node-test`) keeps its node_modules between runs, so a repeated run
 *   installs only the new tarball (its file name carries a hash of its content); a clean
 *   checkout installs everything (better-sqlite3 compiles from source where no prebuilt binary
 *   fits).
 * - The README's Node quick start is extracted and run as written (tests/node/quickstart.spec.ts)
 *   against a private nats-server when one can be started.
 *
 * @module
 */

import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { NatsServer } from "../tests/kit/nats_server.ts";

/** Packages the Node tests import; their versions come from deno.json. */
const testPackages = [
  "@nats-io/nats-core",
  "@nats-io/transport-node",
  "@nats-io/jetstream",
  "@nats-io/kv",
  "better-sqlite3",
  "@types/better-sqlite3",
  "pg",
  "@types/pg",
  "postgres",
];

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

/** deno.json's pinned npm version of `name`. */
function pinnedVersions(names: string[]): Record<string, string> {
  const imports: Record<string, string> =
    JSON.parse(Deno.readTextFileSync(join(root, "deno.json"))).imports;
  const versions: Record<string, string> = {};
  for (const name of names) {
    const match = /^npm:(@?[^@]+)@([^/]+)$/.exec(imports[name] ?? "");
    if (!match || match[1] !== name) throw new Error(`deno.json does not pin ${name} (npm:)`);
    versions[name] = match[2];
  }
  return versions;
}

/** The first ```js block under the README heading that starts with `heading`. */
function readmeBlock(readme: string, heading: string): string {
  const start = readme.split("\n").findIndex((line) => line.startsWith(heading));
  if (start < 0) throw new Error(`README has no heading "${heading}"`);
  const rest = readme.split("\n").slice(start + 1).join("\n");
  const match = /^```js[^\n]*\n([\s\S]*?)^```$/m.exec(rest);
  if (!match) throw new Error(`README: no js code block under "${heading}"`);
  return match[1];
}

/** A NATS server for the quick start, which creates a stream with a fixed name. */
async function quickstartNats(): Promise<{ url: string; stop(): Promise<void> }> {
  try {
    const server = await NatsServer.start();
    return { url: server.url, stop: () => server.stop() };
  } catch (error) {
    // No local nats-server binary: use the shared server and remove the quick start's stream
    // before and after (its fixed message id would be deduplicated by a leftover stream).
    const url = Deno.env.get("OUTBOX_TEST_NATS_URL");
    if (!url) throw error;
    console.warn(`quick start: ${(error as Error).message}; using ${url}`);
    const removeStream = async () => {
      const nc = await connect({ servers: url });
      try {
        await (await jetstreamManager(nc)).streams.delete("ORDERS").catch(() => false);
      } finally {
        await nc.close();
      }
    };
    await removeStream();
    return { url, stop: removeStream };
  }
}

const started = performance.now();
await run(Deno.execPath(), ["run", "-A", join(root, "scripts", "build_npm.ts")], root);
// The build's pinned compiler and Node types (importing build_npm.ts would run the build again).
const buildDeps: Record<string, string> = JSON.parse(
  await Deno.readTextFile(join(root, ".tmp", "npm-build", "package.json")),
).devDependencies;
const buildTools = { typescript: buildDeps.typescript, "@types/node": buildDeps["@types/node"] };

// The scratch project: node_modules survive; everything else is rewritten.
await Deno.mkdir(scratch, { recursive: true });
for await (const entry of Deno.readDir(scratch)) {
  if (!["node_modules", "package-lock.json"].includes(entry.name)) {
    await Deno.remove(join(scratch, entry.name), { recursive: true });
  }
}
const packed =
  (await run("npm", ["pack", "--silent", "--pack-destination", scratch], join(root, "npm"), true))
    .trim().split("\n").at(-1)!;
const digest = new Uint8Array(
  await crypto.subtle.digest("SHA-256", await Deno.readFile(join(scratch, packed))),
);
const hash = Array.from(digest.slice(0, 6), (b) => b.toString(16).padStart(2, "0")).join("");
const tarball = packed.replace(/\.tgz$/, `-${hash}.tgz`);
await Deno.rename(join(scratch, packed), join(scratch, tarball));
await Deno.writeTextFile(
  join(scratch, "package.json"),
  JSON.stringify(
    {
      private: true,
      type: "module",
      dependencies: {
        "@outbox/nats": `file:./${tarball}`,
        ...buildTools,
        ...pinnedVersions(testPackages),
      },
    },
    null,
    2,
  ),
);
await run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error"], scratch);
const installed = performance.now();

// Tests: tests/node/*.ts plus the shared conformance cases, compiled against the installed package.
await copyDir(join(root, "tests", "node"), join(scratch, "tests", "node"));
await copyDir(join(root, "tests", "conformance"), join(scratch, "tests", "conformance"));
await Deno.remove(join(scratch, "tests", "conformance", "deno.ts"));
// The cases import the library's types from the repository root; point them at the package.
for await (const entry of Deno.readDir(join(scratch, "tests", "conformance"))) {
  if (!entry.isFile || !entry.name.endsWith(".ts")) continue;
  const file = join(scratch, "tests", "conformance", entry.name);
  await Deno.writeTextFile(
    file,
    (await Deno.readTextFile(file)).replace(`from "../../mod.ts"`, `from "@outbox/nats"`),
  );
}
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

// The README's Node quick start, as written, next to the installed package.
const quickstartDir = join(scratch, "quickstart");
await Deno.mkdir(quickstartDir, { recursive: true });
await Deno.writeTextFile(
  join(quickstartDir, "quickstart.mjs"),
  readmeBlock(await Deno.readTextFile(join(root, "README.md")), "### Node quick start"),
);

const nodeVersion = (await run("node", ["--version"], scratch, true)).trim();
console.log(`node ${nodeVersion}: running the Node suite against the installed @outbox/nats`);
const files: string[] = [];
for await (const entry of Deno.readDir(join(scratch, "dist", "tests", "node"))) {
  if (entry.name.endsWith(".spec.js")) files.push(join("dist", "tests", "node", entry.name));
}
files.sort();
const nats = await quickstartNats();
let code = 1;
try {
  const status = await new Deno.Command("node", {
    args: ["--test", "--test-concurrency=1", ...files],
    cwd: scratch,
    env: {
      OUTBOX_QUICKSTART_DIR: quickstartDir,
      OUTBOX_QUICKSTART_NATS_URL: nats.url,
    },
    stdout: "inherit",
    stderr: "inherit",
  }).spawn().status;
  code = status.code;
} finally {
  await nats.stop();
}
const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
console.log(
  `test:node: build + install ${seconds(installed - started)}, total ${
    seconds(performance.now() - started)
  }`,
);
Deno.exit(code);
