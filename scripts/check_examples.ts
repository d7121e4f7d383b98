/**
 * Type-checks the examples `deno test --doc` skips: the TypeScript code blocks marked `ignore`
 * (they need a NATS or Postgres server, or write files) in the published modules' JSDoc and in
 * README.md. Each block is checked as a module of its own, so it must be complete: its imports,
 * and `declare const name: Type;` for what it assumes exists.
 *
 * Usage: deno run -A scripts/check_examples.ts
 *
 * @module
 */

import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

/** A fenced code block: where it starts, its info string, and its code. */
export interface CodeBlock {
  /** 1-based line of the opening fence. */
  line: number;
  /** The language (first word of the info string). */
  lang: string;
  /** The other words of the info string (`ignore`, ...). */
  attributes: string[];
  /** The code between the fences. */
  code: string;
}

/** Fenced code blocks in markdown text. */
export function markdownBlocks(text: string, firstLine = 1): CodeBlock[] {
  const blocks: CodeBlock[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)```(\S*)(.*)$/.exec(lines[i]);
    if (!open) continue;
    const end = lines.findIndex((line, j) => j > i && /^\s*```\s*$/.test(line));
    if (end < 0) break;
    const [lang, ...attributes] = [open[2], ...open[3].trim().split(/\s+/).filter(Boolean)];
    blocks.push({
      line: firstLine + i,
      lang,
      attributes,
      code: lines.slice(i + 1, end).join("\n"),
    });
    i = end;
  }
  return blocks;
}

/** Fenced code blocks in the JSDoc comments of a TypeScript file. */
export function jsDocBlocks(source: string): CodeBlock[] {
  const blocks: CodeBlock[] = [];
  for (const match of source.matchAll(/\/\*\*([\s\S]*?)\*\//g)) {
    const firstLine = source.slice(0, match.index).split("\n").length;
    const text = match[1].split("\n").map((line) => line.replace(/^\s*\* ?/, "")).join("\n");
    blocks.push(...markdownBlocks(text, firstLine));
  }
  return blocks;
}

const typescript = new Set(["ts", "typescript", "mts", "tsx"]);

async function* sourceFiles(dir: string): AsyncGenerator<string> {
  for await (const entry of Deno.readDir(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory) yield* sourceFiles(path);
    else if (entry.isFile && (entry.name.endsWith(".ts") || entry.name.endsWith(".md"))) yield path;
  }
}

/** The published TypeScript and markdown files (deno.json `publish.include`: README.md, docs/). */
async function documentedFiles(): Promise<string[]> {
  const config = JSON.parse(await Deno.readTextFile(join(root, "deno.json")));
  const found: string[] = [];
  for (const entry of config.publish?.include ?? []) {
    const path = join(root, entry);
    if (entry.endsWith("/")) {
      for await (const file of sourceFiles(path)) found.push(file);
    } else if (entry.endsWith(".ts") || entry.endsWith(".md")) {
      found.push(path);
    }
  }
  return found.sort();
}

if (import.meta.main) {
  const out = await Deno.makeTempDir({ prefix: "outbox-examples-" });
  const written: string[] = [];
  try {
    for (const file of await documentedFiles()) {
      const text = await Deno.readTextFile(file);
      const blocks = file.endsWith(".md") ? markdownBlocks(text) : jsDocBlocks(text);
      for (const block of blocks) {
        if (!typescript.has(block.lang) || !block.attributes.includes("ignore")) continue;
        const name = `${relative(root, file).replaceAll(/[/.]/g, "_")}_line_${block.line}.ts`;
        // `export {}` makes every block a module (top-level await, its own scope).
        await Deno.writeTextFile(join(out, name), `${block.code}\nexport {};\n`);
        written.push(name);
      }
    }
    console.log(`type-checking ${written.length} examples marked ignore (in ${out})`);
    // Run from the repository root so deno.json (imports, the package's own name) applies.
    const status = await new Deno.Command(Deno.execPath(), {
      args: ["check", "--quiet", ...written.map((name) => join(out, name))],
      cwd: root,
      stdout: "inherit",
      stderr: "inherit",
    }).spawn().status;
    if (!status.success) {
      console.error("examples marked ignore must type-check: file names say <file>_line_<n>");
      Deno.exit(1);
    }
  } finally {
    await Deno.remove(out, { recursive: true });
  }
}
