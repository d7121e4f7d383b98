/**
 * Store URLs: which storage a command works on. `postgres://...` / `postgresql://...`,
 * `sqlite:<path>` and `nats-kv://<bucket>`.
 *
 * @module
 */

import { CliUsageError } from "./errors.ts";
import { redactUrl } from "./format.ts";

/** A parsed store URL. */
export type StoreTarget =
  | { kind: "postgres"; url: string; label: string }
  | { kind: "sqlite"; path: string; label: string }
  | { kind: "nats-kv"; bucket: string; label: string };

const bucketName = /^[A-Za-z0-9_-]+$/;

/**
 * Parses a store URL. `bucket` (the `--bucket` option) names the NATS KV bucket when the URL is
 * just `nats-kv:` or `nats-kv://`. Throws {@linkcode CliUsageError} for an unknown scheme or a
 * malformed URL.
 */
export function parseStoreUrl(url: string, bucket?: string): StoreTarget {
  const text = url.trim();
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(text)?.[1]?.toLowerCase();
  if (scheme === "postgres" || scheme === "postgresql") {
    try {
      const parsed = new URL(text);
      if (parsed.hostname === "" && !parsed.searchParams.has("host")) {
        throw new Error("no host");
      }
    } catch {
      throw new CliUsageError(
        `invalid Postgres URL ${
          JSON.stringify(redactUrl(text))
        }; expected postgres://user:password@host:5432/database`,
      );
    }
    return { kind: "postgres", url: text, label: redactUrl(text) };
  }
  if (scheme === "sqlite") {
    let path = text.slice("sqlite:".length);
    // sqlite:///abs/path.db and sqlite://relative.db are accepted as well as sqlite:path.
    if (path.startsWith("//")) path = path.slice(2);
    if (path.length === 0) {
      throw new CliUsageError(
        'SQLite store URL needs a file path: sqlite:<path>, for example "sqlite:./app.db"',
      );
    }
    if (path === ":memory:") {
      throw new CliUsageError("sqlite::memory: is not a store: every command opens a new database");
    }
    return { kind: "sqlite", path, label: `sqlite:${path}` };
  }
  if (scheme === "nats-kv") {
    const rest = text.slice("nats-kv:".length).replace(/^\/\//, "");
    const fromUrl = rest.split(/[/?#]/, 1)[0];
    if (fromUrl && bucket && fromUrl !== bucket) {
      throw new CliUsageError(
        `the store URL names bucket "${fromUrl}" but --bucket says "${bucket}"; give one of them`,
      );
    }
    const name = fromUrl || bucket;
    if (!name) {
      throw new CliUsageError(
        "NATS KV store needs a bucket: nats-kv://<bucket> or --bucket <name>",
      );
    }
    if (!bucketName.test(name)) {
      throw new CliUsageError(
        `invalid NATS KV bucket name ${
          JSON.stringify(name)
        }; use letters, digits, "_" and "-" only`,
      );
    }
    return { kind: "nats-kv", bucket: name, label: `nats-kv://${name}` };
  }
  const shown = scheme ? `"${scheme}:"` : "none";
  throw new CliUsageError(
    `unsupported store URL scheme (${shown}) in ${
      JSON.stringify(redactUrl(text))
    }; use postgres://..., postgresql://..., sqlite:<path> or nats-kv://<bucket>`,
  );
}
