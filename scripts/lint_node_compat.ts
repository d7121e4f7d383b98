/**
 * A `deno lint` plugin that keeps the published library runnable on Node (>= 22), where the npm build
 * runs. It applies to the files deno.json publishes (`publish.include`); tests, benchmarks and
 * scripts may use Deno freely.
 *
 * - `outbox/no-deno-global`: no `Deno` namespace (values or types) and no `import.meta.main`.
 * - `outbox/no-node-sqlite-import`: no static import of `node:sqlite`, not even of its types (Node
 *   22+ only); take the database from the caller, as `nodeSqliteExecutor` does.
 *
 * The npm build enforces the same (it compiles against Node's types and scans its output); this
 * rule reports it in the editor and in `deno task check`, before a build.
 *
 * @module
 */

const root = new URL("../", import.meta.url);

/** Absolute path prefixes (directories end in "/") and files of the published library. */
function libraryPaths(): string[] {
  const config = JSON.parse(Deno.readTextFileSync(new URL("deno.json", root)));
  const include: string[] = config.publish?.include ?? [];
  return include
    .filter((entry) => entry.endsWith("/") || /\.[cm]?[jt]sx?$/.test(entry))
    .map((entry) => decodeURIComponent(new URL(entry, root).pathname));
}

const library = libraryPaths();

function isLibrary(filename: string): boolean {
  return library.some((path) => path.endsWith("/") ? filename.startsWith(path) : filename === path);
}

/** The lint plugin (registered in deno.json `lint.plugins`). */
const plugin: Deno.lint.Plugin = {
  name: "outbox",
  rules: {
    "no-deno-global": {
      create(context) {
        if (!isLibrary(context.filename)) return {};
        return {
          Identifier(node) {
            if (node.name !== "Deno") return;
            const parent = node.parent;
            // `{ Deno: 1 }` keys and `x.Deno` members are not the global.
            if (parent.type === "MemberExpression" && parent.property === node) return;
            if (parent.type === "Property" && parent.key === node && !parent.shorthand) return;
            context.report({
              node,
              message: "Library code runs on Node too: do not use the Deno namespace.",
              hint: "Take what you need from the caller, or use a web or node: API.",
            });
          },
          MemberExpression(node) {
            if (
              node.object.type === "MetaProperty" && node.property.type === "Identifier" &&
              node.property.name === "main"
            ) {
              context.report({
                node,
                message: "import.meta.main is Deno-only; library code runs on Node too.",
              });
            }
          },
        };
      },
    },
    "no-node-sqlite-import": {
      create(context) {
        if (!isLibrary(context.filename)) return {};
        return {
          ImportDeclaration(node) {
            if (node.source.value === "node:sqlite") {
              context.report({
                node,
                message:
                  "node:sqlite is missing before Node 22.5 (flagged until 22.13): take the database from the caller.",
              });
            }
          },
        };
      },
    },
  },
};

export default plugin;
