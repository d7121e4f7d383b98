/**
 * JSR readiness, for every entry point in deno.json `exports` (the parts of the JSR score we can
 * check before publishing):
 *
 * - deno.json has a name, a version, a license and a description (at most 250 characters), and
 *   publishes README.md and LICENSE;
 * - `deno doc --lint` is clean for all entry points;
 * - every entry point has a module doc, and the main one has an example;
 * - every exported symbol has a doc comment with an `@example`, and examples import the package
 *   by name (`@outbox/nats`), never by a relative path.
 *
 * No slow types is checked by `deno publish --dry-run` (part of `deno task check`). Provenance
 * (publishing from CI) and runtime compatibility (package settings on jsr.io) are set when the
 * package is published.
 *
 * Usage: deno run -A scripts/check_package.ts
 *
 * @module
 */

import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

interface JsDoc {
  doc?: string;
  tags?: Array<{ kind: string; doc?: string }>;
}

interface DocNode {
  name: string;
  declarations: Array<
    { kind: string; jsDoc?: JsDoc; location: { filename: string; line: number } }
  >;
}

interface DocModule {
  module_doc?: JsDoc;
  symbols: DocNode[];
}

const problems: string[] = [];
const config = JSON.parse(await Deno.readTextFile(join(root, "deno.json")));
for (const field of ["name", "version", "license", "description"]) {
  if (typeof config[field] !== "string" || config[field].length === 0) {
    problems.push(`deno.json: "${field}" is missing`);
  }
}
if ((config.description ?? "").length > 250) {
  problems.push(`deno.json: description has ${config.description.length} characters (JSR: 250)`);
}
for (const file of ["README.md", "LICENSE"]) {
  if (!(config.publish?.include ?? []).includes(file)) {
    problems.push(`deno.json: publish.include lacks ${file}`);
  }
}

const exportsMap: Record<string, string> = typeof config.exports === "string"
  ? { ".": config.exports }
  : config.exports;
const entries = Object.values(exportsMap).map((path) => join(root, path));

const lint = await new Deno.Command(Deno.execPath(), {
  args: ["doc", "--lint", ...entries],
  cwd: root,
  stdout: "piped",
  stderr: "piped",
}).output();
if (!lint.success) {
  problems.push(`deno doc --lint:\n${new TextDecoder().decode(lint.stderr)}`);
}

const json = await new Deno.Command(Deno.execPath(), {
  args: ["doc", "--json", ...entries],
  cwd: root,
  stdout: "piped",
  stderr: "inherit",
}).output();
const modules: Record<string, DocModule> = JSON.parse(new TextDecoder().decode(json.stdout)).nodes;

let symbols = 0;
let documented = 0;
for (const [key, path] of Object.entries(exportsMap)) {
  const url = pathToFileURL(join(root, path)).href;
  const module = modules[url];
  if (!module) {
    problems.push(`${key}: deno doc found no module at ${url}`);
    continue;
  }
  if (!module.module_doc?.doc?.trim()) problems.push(`${key} (${path}): no module doc (@module)`);
  const moduleExamples = (module.module_doc?.tags ?? []).filter((t) => t.kind === "example");
  if (key === "." && moduleExamples.length === 0 && !module.module_doc?.doc?.includes("```")) {
    problems.push(`${key} (${path}): the main entry point's module doc has no example`);
  }
  for (const symbol of module.symbols) {
    for (const declaration of symbol.declarations) {
      symbols += 1;
      const where = `${symbol.name} (${
        declaration.location.filename.replace(`file://${root}/`, "")
      }:${declaration.location.line})`;
      const jsDoc = declaration.jsDoc;
      if (!jsDoc?.doc?.trim()) {
        problems.push(`${key}: ${where} has no doc comment`);
        continue;
      }
      documented += 1;
      const examples = (jsDoc.tags ?? []).filter((tag) => tag.kind === "example");
      if (examples.length === 0) problems.push(`${key}: ${where} has no @example`);
      for (const example of examples) {
        if (/from\s+["']\.\.?\//.test(example.doc ?? "")) {
          problems.push(`${key}: ${where}: examples import "@outbox/nats", not relative paths`);
        }
      }
    }
  }
}

const readme = await Deno.readTextFile(join(root, "README.md"));
if (!readme.includes("```")) problems.push("README.md has no code example");

if (problems.length > 0) {
  console.error(`JSR readiness: ${problems.length} problem(s)\n- ${problems.join("\n- ")}`);
  Deno.exit(1);
}
console.log(
  `JSR readiness: ${entries.length} entry points with module docs, ${documented}/${symbols} ` +
    "exported symbols documented with examples, README with examples, description set",
);
