/**
 * Bucket-wide reads for administration (stats, listings, prune, repair) and removal of entries
 * without leaving tombstones where the KV object allows it. Claims never use these.
 *
 * @module
 */

import { isWrongLastSequence } from "./errors.ts";
import type { KV, KvEntry } from "@nats-io/kv";

/**
 * Calls `visit` with the latest entry of every key matching `filter` (deletes and purges
 * included; check `operation`), as of the scan's start: streams the bucket through one
 * consumer up to the stream's last sequence when the scan began. (nats.js's `history()` alone
 * ends only once it caught up with the stream, which never happens while other processes keep
 * writing: a scan of a busy bucket ran for minutes.) When the bucket keeps more than one
 * revision per key, entries are buffered to keep only the latest. A key rewritten during the
 * scan may be missing from it (its old revision is gone, its new one is past the snapshot).
 */
export async function scanLatest(
  kv: KV,
  filter: string,
  visit: (entry: KvEntry) => void | Promise<void>,
): Promise<void> {
  const status = await kv.status();
  const keepsHistory = status.history > 1;
  const lastSeq = status.streamInfo.state.last_seq;
  const latest = new Map<string, KvEntry>();
  const iterator = await kv.history({ key: filter });
  try {
    for await (const entry of iterator) {
      if (entry.revision > lastSeq) break; // written after the scan began
      if (keepsHistory) latest.set(entry.key, entry);
      else await visit(entry);
      if (entry.revision === lastSeq) break;
    }
  } finally {
    iterator.stop();
  }
  for (const entry of latest.values()) await visit(entry);
}

/** The parts of `@nats-io/kv`'s `Bucket` that allow purging a subject without a tombstone. */
interface RawPurgeCapable {
  jsm: {
    streams: {
      purge(stream: string, options: { filter: string; seq: number }): Promise<{ purged: number }>;
    };
  };
  stream: string;
  encodeKey(key: string): string;
  subjectForKey(key: string): string;
}

/**
 * Removes the messages of one key up to and including `revision`, without writing a tombstone,
 * when the KV object is a `Bucket` (it exposes its JetStream manager); later revisions are kept,
 * so this is a compare-and-delete. Returns how many messages were removed, or `undefined` when
 * the KV object offers no such access.
 */
export function rawPurger(
  kv: KV,
): ((key: string, revision: number) => Promise<number>) | undefined {
  const candidate = kv as unknown as Partial<RawPurgeCapable>;
  if (
    typeof candidate.jsm?.streams?.purge !== "function" || typeof candidate.stream !== "string" ||
    typeof candidate.encodeKey !== "function" || typeof candidate.subjectForKey !== "function"
  ) {
    return undefined;
  }
  const bucket = candidate as RawPurgeCapable;
  return async (key, revision) => {
    const filter = bucket.subjectForKey(bucket.encodeKey(key));
    const response = await bucket.jsm.streams.purge(bucket.stream, { filter, seq: revision + 1 });
    return response.purged;
  };
}

/**
 * Removes `key` if it is still at `revision` (what a scan saw): without a tombstone through
 * `purge` (from {@linkcode rawPurger}) when there is one, else with a revision-checked KV purge.
 * Returns `false` when the key changed since.
 */
export async function removeIfUnchanged(
  kv: KV,
  purge: ((key: string, revision: number) => Promise<number>) | undefined,
  key: string,
  revision: number,
): Promise<boolean> {
  if (purge) return await purge(key, revision) > 0;
  try {
    await kv.purge(key, { previousSeq: revision });
    return true;
  } catch (error) {
    if (isWrongLastSequence(error)) return false;
    throw error;
  }
}

/**
 * How many removals a prune keeps in flight. Each is a JetStream API request, and the server
 * answers those one at a time: a whole batch at once (1,000 by default) queued so long on a busy
 * server that the last requests timed out. Internal.
 */
export const removalsInFlight = 32;

/**
 * `fn` over `items` with at most `limit` calls in flight; results in input order. The first
 * rejection rejects the whole (calls already started still run to their end). Internal.
 */
export async function mapInFlight<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await fn(items[index]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}
