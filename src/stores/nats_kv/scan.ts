/**
 * Bucket-wide reads for administration (stats, listings, prune, repair) and removal of entries
 * without leaving tombstones where the KV object allows it. Claims never use these.
 *
 * @module
 */

import { isWrongLastSequence, jetStreamErrorCode, messageNotFoundCodes } from "./errors.ts";
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

/** The parts of `@nats-io/kv`'s `Bucket` that allow deleting one stored message. */
interface RawDeleteCapable {
  jsm: {
    streams: {
      deleteMessage(stream: string, seq: number, erase?: boolean): Promise<boolean>;
    };
  };
  stream: string;
}

/** Removes an entry of a key if it is still at `revision`; `false` when it changed since. */
export type Remover = (key: string, revision: number) => Promise<boolean>;

/**
 * Removes revision `revision` of a key without writing a tombstone, when the KV object is a
 * `Bucket` (it exposes its JetStream manager): a delete of exactly that stream message, so a later
 * revision is kept (a compare-and-delete). In a bucket that keeps history, the key's older
 * revisions are deleted first, so the key never shows an older value, and a later revision it
 * still holds means the key changed. Returns `false` when the message is gone or the key changed
 * (rewritten, or removed by another prune), or `undefined` when the KV object offers no such
 * access.
 *
 * Never a stream purge filtered on the key's subject: on nats-server 2.9.10 (measured) such a
 * purge, and a KV purge (a rollup), moves every consumer whose filter covers that subject (a
 * claimer's watch on the markers, an admin scan of the records) to the end of the stream, or to
 * the subject's remaining message, so it never delivers what it had not delivered yet: claimers
 * missed markers and left their messages pending until a process restarted
 * (nats-io/nats-server#3838 narrowed which consumers a filtered purge moves). A consumer only
 * skips a deleted message.
 */
export function rawRemover(kv: KV): Remover | undefined {
  const candidate = kv as unknown as Partial<RawDeleteCapable>;
  if (
    typeof candidate.jsm?.streams?.deleteMessage !== "function" ||
    typeof candidate.stream !== "string"
  ) {
    return undefined;
  }
  const bucket = candidate as RawDeleteCapable;
  let keepsHistory: Promise<boolean> | undefined;
  const deleteStored = async (seq: number): Promise<boolean> => {
    try {
      return await bucket.jsm.streams.deleteMessage(bucket.stream, seq, false);
    } catch (error) {
      if (messageNotFoundCodes.includes(jetStreamErrorCode(error) ?? 0)) return false; // gone
      throw error;
    }
  };
  return async (key, revision) => {
    keepsHistory ??= kv.status().then((status) => status.history > 1);
    let changed = false;
    if (await keepsHistory) {
      const older: number[] = [];
      const iterator = await kv.history({ key });
      for await (const entry of iterator) {
        if (entry.revision < revision) older.push(entry.revision);
        else if (entry.revision > revision) changed = true;
      }
      for (const seq of older) await deleteStored(seq);
    }
    // A later revision (kept by the history) is a change since the scan: the key stays.
    const deleted = await deleteStored(revision);
    return deleted && !changed;
  };
}

/**
 * Removes `key` if it is still at `revision` (what a scan saw): without a tombstone through
 * `remove` (from {@linkcode rawRemover}) when there is one, else with a revision-checked KV delete
 * (a tombstone stays; not a KV purge, which moves watches as a filtered purge does: see
 * {@linkcode rawRemover}). Returns `false` when the key changed since.
 */
export async function removeIfUnchanged(
  kv: KV,
  remove: Remover | undefined,
  key: string,
  revision: number,
): Promise<boolean> {
  if (remove) return await remove(key, revision);
  try {
    await kv.delete(key, { previousSeq: revision });
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
