/**
 * Builds the npm package into `npm/`: ESM JavaScript and `.d.ts` compiled by TypeScript's own
 * compiler (pinned below; dnt lives on JSR, which is not reachable everywhere), a package.json
 * derived from deno.json, README, docs/ and LICENSE.
 *
 * - Name, version, description, license and `exports` come from deno.json.
 * - Dependencies come from the npm specifiers deno.json maps our bare imports to, as caret ranges
 *   of the pinned versions (so npm can share one copy with the application's nats.js): packages
 *   the emitted JavaScript imports become `dependencies`; packages only the declarations mention
 *   (driver types such as `@nats-io/kv`) become optional `peerDependencies`; `@opentelemetry/api`
 *   is a (non-optional) peer, because its global registry only works with the application's copy.
 * - `./cli` (when exported) also becomes the `outbox-nats` executable (`bin/outbox-nats.js`).
 * - The library is compiled against Node's types only, so any use of a Deno global fails the
 *   build, and the emitted files are scanned for what Node 22 cannot run (`Deno.`,
 *   `import.meta.main`, `node:sqlite`, which Node 22 has only from 22.5, `npm:` / `jsr:` specifiers): no shim is needed, and none
 *   is shipped.
 *
 * Usage: deno run -A scripts/build_npm.ts [--out npm]
 *
 * @module
 */

import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

/** Pinned build tools. */
export const buildTools: Record<string, string> = {
  typescript: "5.9.3",
  "@types/node": "22.20.7",
};

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const outArg = Deno.args.indexOf("--out");
const outDir = join(root, outArg >= 0 ? Deno.args[outArg + 1] : "npm");

interface DenoJson {
  name: string;
  version: string;
  description: string;
  license: string;
  exports: Record<string, string>;
  imports: Record<string, string>;
}

const config: DenoJson = JSON.parse(await Deno.readTextFile(join(root, "deno.json")));

/**
 * Runtime imports published as peers rather than dependencies: the OpenTelemetry API finds the
 * SDK through a global registry, so the library must use the application's copy of it.
 */
const runtimePeers = new Set(["@opentelemetry/api"]);

/** `npm:<name>@<version>[/path]` -> name and version. */
function npmSpecifier(spec: string): { name: string; version: string } | undefined {
  const match = /^npm:(@?[^@/]+(?:\/[^@/]+)?)@([^/]+)/.exec(spec);
  return match ? { name: match[1], version: match[2] } : undefined;
}

async function run(cmd: string, args: string[], cwd: string): Promise<void> {
  const status = await new Deno.Command(cmd, { args, cwd, stdout: "inherit", stderr: "inherit" })
    .spawn().status;
  if (!status.success) throw new Error(`${cmd} ${args.join(" ")} failed in ${cwd}`);
}

async function copyTree(from: string, to: string): Promise<void> {
  await Deno.mkdir(to, { recursive: true });
  for await (const entry of Deno.readDir(from)) {
    const source = join(from, entry.name);
    const target = join(to, entry.name);
    if (entry.isDirectory) await copyTree(source, target);
    else if (entry.isFile && entry.name.endsWith(".ts")) await Deno.copyFile(source, target);
  }
}

async function* files(dir: string, suffix: string): AsyncGenerator<string> {
  for await (const entry of Deno.readDir(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory && entry.name !== "node_modules") yield* files(path, suffix);
    else if (entry.isFile && entry.name.endsWith(suffix)) yield path;
  }
}

/** Bare package names imported by the files under `dir` ending in `suffix`. */
async function importedPackages(dir: string, suffix: string): Promise<Set<string>> {
  const found = new Set<string>();
  const pattern = /(?:from\s+|import\s*\(\s*|import\s+)["']([^"'./][^"']*)["']/g;
  for await (const file of files(dir, suffix)) {
    // Doc comments hold examples that import the package itself: ignore comments.
    const text = (await Deno.readTextFile(file)).replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/^\s*\/\/.*$/gm, "");
    for (const match of text.matchAll(pattern)) {
      const spec = match[1];
      if (spec.startsWith("node:")) continue;
      const name = spec.startsWith("@")
        ? spec.split("/").slice(0, 2).join("/")
        : spec.split("/")[0];
      found.add(name);
    }
  }
  return found;
}

// 1. A scratch build directory with the sources and the pinned compiler.
const work = join(root, ".tmp", "npm-build");
await Deno.remove(work, { recursive: true }).catch(() => {});
await Deno.mkdir(work, { recursive: true });
await Deno.copyFile(join(root, "mod.ts"), join(work, "mod.ts"));
for (const entry of Object.values(config.exports)) {
  const file = entry.replace(/^\.\//, "");
  if (file !== "mod.ts") {
    await Deno.mkdir(dirname(join(work, file)), { recursive: true });
    await Deno.copyFile(join(root, file), join(work, file));
  }
}
await copyTree(join(root, "src"), join(work, "src"));

const mapped = new Map<string, { name: string; version: string }>();
for (const [bare, spec] of Object.entries(config.imports)) {
  const npm = npmSpecifier(spec);
  if (npm) mapped.set(bare, npm);
}
const sourcePackages = await importedPackages(work, ".ts");
const buildDeps: Record<string, string> = { ...buildTools };
for (const name of sourcePackages) {
  const npm = mapped.get(name);
  if (!npm) throw new Error(`src imports "${name}", which deno.json does not map to npm:`);
  buildDeps[npm.name] = npm.version;
}
await Deno.writeTextFile(
  join(work, "package.json"),
  JSON.stringify({ private: true, type: "module", devDependencies: buildDeps }, null, 2),
);
await run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error"], work);

// 2. Compile against Node's types only (no Deno globals), rewriting .ts imports to .js.
await Deno.remove(outDir, { recursive: true }).catch(() => {});
const tsconfig = {
  compilerOptions: {
    target: "ES2022",
    lib: ["ES2024"],
    module: "NodeNext",
    moduleResolution: "NodeNext",
    types: ["node"],
    strict: true,
    declaration: true,
    sourceMap: false,
    rewriteRelativeImportExtensions: true,
    allowImportingTsExtensions: true,
    verbatimModuleSyntax: true,
    skipLibCheck: true,
    outDir,
    rootDir: ".",
  },
  include: ["mod.ts", ...Object.values(config.exports), "src/**/*.ts"],
};
await Deno.writeTextFile(join(work, "tsconfig.json"), JSON.stringify(tsconfig, null, 2));
await run(join(work, "node_modules", ".bin", "tsc"), ["-p", "."], work);

// 2b. The CLI's executable for package.json "bin" (when deno.json exports ./cli).
const bin: Record<string, string> = {};
if (config.exports["./cli"]) {
  const cliModule = config.exports["./cli"].replace(/^\.\//, "").replace(/\.ts$/, ".js");
  const binFile = "bin/outbox-nats.js";
  await Deno.mkdir(join(outDir, "bin"), { recursive: true });
  await Deno.writeTextFile(
    join(outDir, binFile),
    [
      "#!/usr/bin/env node",
      "// The outbox-nats executable: runs the CLI with the process's arguments.",
      'import process from "node:process";',
      `import { main } from "../${cliModule}";`,
      "",
      "process.exitCode = await main(process.argv.slice(2));",
      "// The command reported its outcome; a late error of a connection it gave up on is not news.",
      'process.on("uncaughtException", () => {});',
      'process.on("unhandledRejection", () => {});',
      "// Commands close what they open; should anything still hold the event loop, exit anyway.",
      "setTimeout(() => process.exit(), 2_000).unref();",
      "",
    ].join("\n"),
  );
  await Deno.chmod(join(outDir, binFile), 0o755);
  bin["outbox-nats"] = binFile;
}

// 3. Nothing Node 22 cannot run, in the JavaScript or the declarations.
const nodeIncompatible: Array<[RegExp, string]> = [
  [/\bDeno\s*\./, "a Deno global"],
  [/import\.meta\.main\b/, "import.meta.main"],
  [/["']node:sqlite["']/, "node:sqlite (Node 22+ only; take the database from the caller)"],
  [/["'](?:npm|jsr):/, "an npm: or jsr: specifier"],
];
/**
 * Uses that are guarded at run time, by file: the CLI runs itself when `import.meta.main` is
 * true (undefined, so false, on Node), and loads SQLite with
 * `process.getBuiltinModule("node:sqlite")`, falling back to better-sqlite3 where it is missing;
 * the SQLite worker executor's thread loads it the same way and reports a clear error where it is
 * missing (its executor's open then rejects with it).
 */
const guarded: Record<string, string[]> = {
  "cli.js": ["import.meta.main"],
  "src/cli/sqlite.js": ["node:sqlite (Node 22+ only; take the database from the caller)"],
  "src/cli/sqlite.d.ts": ["node:sqlite (Node 22+ only; take the database from the caller)"],
  "src/stores/sql/sqlite_worker_thread.js": [
    "node:sqlite (Node 22+ only; take the database from the caller)",
  ],
};
const problems: string[] = [];
for (const suffix of [".js", ".d.ts"]) {
  for await (const file of files(outDir, suffix)) {
    const text = (await Deno.readTextFile(file)).replace(/\/\*[\s\S]*?\*\//g, "");
    const name = relative(outDir, file);
    for (const [pattern, what] of nodeIncompatible) {
      if (pattern.test(text) && !guarded[name]?.includes(what)) problems.push(`${name}: ${what}`);
    }
  }
}
if (problems.length > 0) {
  throw new Error(`the npm build would not run on Node 22:\n  ${problems.join("\n  ")}`);
}

// 4. package.json from deno.json.
const emitted = await importedPackages(outDir, ".js");
const runtime = [...emitted].filter((p) => !runtimePeers.has(p)).sort();
const declared = await importedPackages(outDir, ".d.ts");
const optionalPeers = [...declared].filter((p) => !emitted.has(p)).sort();
const peers = [...emitted].filter((p) => runtimePeers.has(p)).concat(optionalPeers).sort();
const rangeOf = (name: string) => {
  const npm = mapped.get(name);
  if (!npm) throw new Error(`no npm version for ${name}`);
  return `^${npm.version}`;
};
const exportsMap: Record<string, { types: string; default: string }> = {};
for (const [key, entry] of Object.entries(config.exports)) {
  const js = entry.replace(/\.ts$/, ".js");
  exportsMap[key] = { types: js.replace(/\.js$/, ".d.ts"), default: js };
}
const pkg = {
  name: config.name,
  version: config.version,
  description: config.description,
  license: config.license,
  type: "module",
  engines: { node: ">=22" },
  exports: exportsMap,
  main: exportsMap["."].default,
  ...(Object.keys(bin).length > 0 ? { bin } : {}),
  types: exportsMap["."].types,
  files: ["**/*.js", "**/*.d.ts", "README.md", "docs/*.md", "LICENSE"],
  sideEffects: false,
  dependencies: Object.fromEntries(runtime.map((n) => [n, rangeOf(n)])),
  peerDependencies: Object.fromEntries(peers.map((n) => [n, rangeOf(n)])),
  peerDependenciesMeta: Object.fromEntries(optionalPeers.map((n) => [n, { optional: true }])),
};
await Deno.writeTextFile(join(outDir, "package.json"), JSON.stringify(pkg, null, 2) + "\n");
await Deno.copyFile(join(root, "README.md"), join(outDir, "README.md"));
// The README links to docs/: ship the pages with it.
await Deno.mkdir(join(outDir, "docs"), { recursive: true });
for await (const entry of Deno.readDir(join(root, "docs"))) {
  if (entry.isFile && entry.name.endsWith(".md")) {
    await Deno.copyFile(join(root, "docs", entry.name), join(outDir, "docs", entry.name));
  }
}
await Deno.copyFile(join(root, "LICENSE"), join(outDir, "LICENSE"));
console.log(`built ${pkg.name}@${pkg.version} into ${relative(root, outDir)}/`);
