/**
 * The in-process index of active outbox messages, kept current by one long-lived watch on the
 * markers (`q.>`). Claims pick candidates here (FIFO, skipping messages known not to be due)
 * instead of listing the bucket, so a claim reads about `limit` records however many dispatched
 * records the bucket keeps. The same watch wakes dispatchers when work appears in any process.
 *
 * The index is only a guide: every claim re-reads the record and writes it with a revision CAS.
 * A stale due-time hint costs one extra read (too early) or delays a retry until the record's
 * own lease expiry (too late, only after a crash between the record write and its marker write).
 *
 * @module
 */

import type { KV, KvWatchEntry } from "@nats-io/kv";
import { KvRequests } from "./kv_requests.ts";
import { NatsKvIndexError } from "./errors.ts";
import { decodeToken, isKeyEntryKey, markerPrefix, recordKeyOf, syncKey, tokenOf } from "./keys.ts";
import { type KeyEntry, type Marker, type RecordCodec, recordCodec } from "./records.ts";

/** One active message as the index knows it. */
export interface ActiveEntry {
  /** `q.<token>` */
  markerKey: string;
  /** `m.<token>` */
  recordKey: string;
  /** The message id, from the marker (or the key); `undefined` when neither can tell. */
  id: string | undefined;
  /** Enqueue order: the marker's `seq`, else the revision of the marker's first write. */
  order: number;
  /** Revision of the marker entry as last seen. */
  markerRevision: number;
  /** Server time of that marker write, epoch ms. */
  markerWrittenMs: number;
  /** When the message is due, epoch ms (`-Infinity`: now); a hint, see the module doc. */
  dueMs: number;
  /** Record revision the hint comes from (0: unknown); newer information wins. */
  hintRevision: number;
  /** The message's ordering key, from the marker. */
  key?: string;
  /**
   * The marker's copy of the record and the record revision it is (`Marker.r`, `Marker.rev`),
   * kept while nothing newer is known about the record (see `ActiveIndex.copyOf`).
   */
  copy?: RecordCopy;
  removed: boolean;
  /**
   * Whether the entry is in the claim's FIFO: unkeyed entries always, keyed ones once they head
   * their key (the messages waiting behind a head are kept per key only, so a claim never walks
   * a key's backlog).
   */
  queued?: boolean;
}

/** A marker's copy of its record (not validated yet), the revision it is, and its size. */
export interface RecordCopy {
  revision: number;
  record: unknown;
  bytes: number;
}

/**
 * Most bytes of marker values whose record copies the index keeps: beyond it (a large backlog)
 * markers are indexed without their copy, and claims read those records.
 */
export const maxCopyBytes = 32 * 1024 * 1024;

/** An ordering key's entry as the index last saw it. */
export interface KeyState {
  /** The key entry's KV key (`q._k.<token>`). */
  entryKey: string;
  /** The entry's revision. */
  revision: number;
  /** The decoded entry (head, last stream sequence). */
  value: KeyEntry;
}

/** What a work listener is told: a message became active (or was rescheduled). */
export interface ActiveWork {
  /** The message id (empty when the marker could not be decoded and the key is hashed). */
  id: string;
  /** When it is due, if not now (a failed message waiting for its retry). */
  dueAt?: string;
}

type WatchIterator = Awaited<ReturnType<KV["watch"]>>;

interface Waiter {
  revision: number;
  resolve(): void;
  reject(error: unknown): void;
}

/** See the module doc. */
export class ActiveIndex {
  /** The entry decoders, loaded before the watch starts (see records.ts). */
  #codec: RecordCodec | undefined;
  readonly #kv: KV;
  /** The hot operations (pipelined for a plain `Bucket`). */
  readonly #requests: KvRequests;
  readonly #syncTimeoutMs: number;
  #entries = new Map<string, ActiveEntry>();
  #sorted: ActiveEntry[] = [];
  #removedInSorted = 0;
  /** Ordering keys: their entry (`q._k.<token>`), by key. */
  #keyStates = new Map<string, KeyState>();
  /** Which ordering key a key entry's KV key belongs to (deletes carry no value). */
  #keyOfEntry = new Map<string, string>();
  /** Active entries of each ordering key, in enqueue order. */
  #byKey = new Map<string, ActiveEntry[]>();
  /**
   * Ordering keys whose entry names a head that has no active entry here (see `unmarkedHeads`),
   * with the number of sync barriers started when that began, and when (this process's clock).
   */
  #unmarked = new Map<string, Unmarked>();
  /** Sync barriers started so far. */
  #barriersStarted = 0;
  /** The highest number (in start order) of a sync barrier that completed. */
  #barrierDone = 0;
  #iterator: WatchIterator | undefined;
  #loop: Promise<void> | undefined;
  #starting: Promise<boolean> | undefined;
  #generation = 0;
  #lastRevision = 0;
  #lastEventMs = 0;
  #serverTimeMs = 0;
  #live = false;
  #closed = false;
  #waiters = new Set<Waiter>();
  /** The rebuild under way (`restart`), while it runs. */
  #restarting: Promise<void> | undefined;
  #listeners = new Set<(work: ActiveWork) => void>();
  /** Bytes of the marker values whose copies the entries keep. */
  #copyBytes = 0;

  constructor(kv: KV, syncTimeoutMs: number) {
    this.#kv = kv;
    this.#requests = new KvRequests(kv);
    this.#syncTimeoutMs = syncTimeoutMs;
  }

  /**
   * Starts the watch if it is not running and waits until its first snapshot is complete.
   * Resolves `true` when this call (re)built the index, which then reflects every marker
   * written before the call.
   */
  ready(): Promise<boolean> {
    if (this.#closed) return Promise.reject(new NatsKvIndexError("The outbox was closed"));
    if (this.#starting) return this.#starting.then(() => false);
    const starting = this.#start();
    this.#starting = starting;
    starting.catch(() => {
      if (this.#starting === starting) this.#starting = undefined;
    });
    return starting;
  }

  /**
   * A barrier: resolves once the index reflects every marker written before the call. Writes
   * one small entry (`q._sync`) and waits for the watch to deliver it. On timeout the watch is
   * rebuilt once before giving up with {@linkcode NatsKvIndexError}.
   */
  async sync(): Promise<void> {
    if (await this.ready()) return;
    try {
      await this.#barrier();
    } catch (error) {
      if (this.#closed) throw error;
      // A rebuild already under way (another caller's) may have started before this call.
      const joined = this.#restarting !== undefined;
      await this.restart();
      if (joined) await this.#barrier();
    }
  }

  /**
   * Stops the current watch and builds the index again from a fresh snapshot. Calls made while
   * one runs share it (a second one would stop the first's watch while it starts).
   */
  restart(): Promise<void> {
    this.#restarting ??= (async () => {
      try {
        await this.#stopWatch();
        this.#starting = undefined;
        await this.ready();
      } finally {
        this.#restarting = undefined;
      }
    })();
    return this.#restarting;
  }

  /**
   * Up to `max` entries that may be due at `nowMs`, oldest first, except those `skip` names.
   * A keyed entry is a candidate only while the index knows it as its key's head: the messages
   * waiting behind a head are never read by a claim.
   */
  candidates(nowMs: number, max: number, skip: (entry: ActiveEntry) => boolean): ActiveEntry[] {
    this.#compact();
    const out: ActiveEntry[] = [];
    for (const entry of this.#sorted) {
      if (out.length >= max) break;
      if (entry.removed || entry.dueMs > nowMs || skip(entry)) continue;
      if (entry.key !== undefined && this.#keyStates.get(entry.key)?.value.head !== entry.id) {
        continue;
      }
      out.push(entry);
    }
    return out;
  }

  /** The last revision of the watched entries the index has applied (its position in the stream). */
  revision(): number {
    return this.#lastRevision;
  }

  /** An ordering key's entry as of {@linkcode ActiveIndex.revision}, or `undefined`. */
  keyState(key: string): KeyState | undefined {
    return this.#keyStates.get(key);
  }

  /** Every ordering key's entry the index holds. */
  keyStates(): KeyState[] {
    return [...this.#keyStates.values()];
  }

  /** Active entries of ordering key `key`, in enqueue order. */
  keyEntries(key: string): readonly ActiveEntry[] {
    return this.#byKey.get(key) ?? [];
  }

  /**
   * The oldest entry of every ordering key that has active entries but no head the index knows
   * (a keyed enqueue that crashed or threw between its marker write and its join).
   */
  headless(): ActiveEntry[] {
    const out: ActiveEntry[] = [];
    for (const [key, entries] of this.#byKey) {
      if (entries.length > 0 && this.#keyStates.get(key)?.value.head === undefined) {
        out.push(entries[0]);
      }
    }
    return out;
  }

  /**
   * The entries of the ordering keys whose head has no marker in the index: a dead head (blocked
   * on purpose), an active head whose marker write failed, or a settled message named head by a
   * hand-over whose index still held its marker while the marker's delete was on its way (late,
   * or lost: this process forgets a dispatched marker as it deletes it). No claim reads such a
   * head through its marker, so the caller reads its record instead. Kept up to date as entries
   * come and go: costs nothing while every head has its marker.
   *
   * With `settled`, only the keys that have been so since before a sync barrier that completed,
   * or for {@linkcode unmarkedSettleMs} (claims that are always full run no barrier): not those
   * this process made so a moment ago by forgetting the marker of a head it has just handed
   * over, while its index has not seen that hand-over yet (a sync started afterwards brings it
   * in, and the key leaves the list; a watch that lags longer costs the caller a read and a lost
   * compare-and-set).
   */
  unmarkedHeads(settled = false): KeyState[] {
    const out: KeyState[] = [];
    const nowMs = Date.now();
    for (const [key, since] of this.#unmarked) {
      if (
        settled && since.barrier >= this.#barrierDone && nowMs - since.atMs < unmarkedSettleMs
      ) continue;
      const state = this.#keyStates.get(key);
      if (state) out.push(state);
    }
    return out;
  }

  /** The oldest active entry of `key` other than message `except`: the key's next message. */
  nextOf(key: string, except: string): ActiveEntry | undefined {
    for (const entry of this.#byKey.get(key) ?? []) {
      if (entry.id !== except && entry.id !== undefined) return entry;
    }
    return undefined;
  }

  /**
   * Resolves once the index has applied every watched entry up to `revision` (an entry under
   * `q.>` that exists, so the watch delivers it or a later one). On a stalled watch: rebuilt
   * once, then {@linkcode NatsKvIndexError}.
   */
  async caughtUp(revision: number): Promise<void> {
    if (await this.ready() || this.#lastRevision >= revision) return;
    try {
      await this.#wait(revision);
    } catch (error) {
      if (this.#closed) throw error;
      await this.restart();
    }
  }

  /** The entry for a marker key. */
  get(markerKey: string): ActiveEntry | undefined {
    return this.#entries.get(markerKey);
  }

  /** Records what a read or write taught us about a message's due time. */
  hint(markerKey: string, dueMs: number, recordRevision: number): void {
    const entry = this.#entries.get(markerKey);
    if (!entry || recordRevision < entry.hintRevision) return;
    entry.dueMs = dueMs;
    entry.hintRevision = recordRevision;
    if (entry.copy !== undefined && recordRevision > entry.copy.revision) this.#dropCopy(entry);
  }

  /**
   * The marker's copy of the entry's record (`Marker.r`) while it is the newest revision of the
   * record this index knows of (a claim, a mark or a newer marker since drop it); `undefined`
   * otherwise. Still only as good as a read: the caller's compare-and-set on its revision fails
   * when the record changed since.
   */
  copyOf(entry: ActiveEntry): RecordCopy | undefined {
    const copy = entry.copy;
    return copy !== undefined && entry.hintRevision <= copy.revision ? copy : undefined;
  }

  /** Forgets the entry's record copy (a compare-and-set on its revision failed). */
  dropCopy(markerKey: string): void {
    const entry = this.#entries.get(markerKey);
    if (entry) this.#dropCopy(entry);
  }

  #dropCopy(entry: ActiveEntry): void {
    if (entry.copy === undefined) return;
    this.#copyBytes -= entry.copy.bytes;
    entry.copy = undefined;
  }

  /** The copy a marker carries, if it has one and the budget has room for it. */
  #copyIn(marker: Marker | undefined, bytes: number): RecordCopy | undefined {
    if (marker?.r === undefined || marker.rev === undefined) return undefined;
    if (this.#copyBytes + bytes > maxCopyBytes) return undefined;
    this.#copyBytes += bytes;
    return { revision: marker.rev, record: marker.r, bytes };
  }

  /**
   * Records the revision of a marker this process just wrote, before its watch event arrives, so
   * a conditional delete soon after uses the right revision.
   */
  wroteMarker(markerKey: string, revision: number): void {
    const entry = this.#entries.get(markerKey);
    if (entry && revision > entry.markerRevision) entry.markerRevision = revision;
  }

  /**
   * Removes the entry of a marker this process deleted (or found useless). With
   * `markerRevision` (the marker revision the caller observed), only when the index has not
   * seen a newer write of that marker since (a requeue's new marker stays); without it, for a
   * marker that can never come back (a dispatched message), whatever the entry.
   */
  forget(markerKey: string, markerRevision?: number): void {
    const entry = this.#entries.get(markerKey);
    if (!entry) return;
    if (markerRevision !== undefined && entry.markerRevision > markerRevision) return;
    this.#remove(entry);
  }

  /**
   * The latest server time the watch has shown (the newest entry it delivered, the claims'
   * sync barriers included), epoch ms; 0 before any. Ages of markers are measured against it,
   * never against this process's clock.
   */
  serverTimeMs(): number {
    return this.#serverTimeMs;
  }

  /** Number of active entries. */
  get size(): number {
    return this.#entries.size;
  }

  /** Active entries (unordered snapshot). */
  entries(): ActiveEntry[] {
    return [...this.#entries.values()];
  }

  /** Calls `listener` for every marker written after the index became live, by any process. */
  addListener(listener: (work: ActiveWork) => void): void {
    this.#listeners.add(listener);
  }

  /** Stops calling `listener`. */
  removeListener(listener: (work: ActiveWork) => void): void {
    this.#listeners.delete(listener);
  }

  /** Stops the watch for good. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#listeners.clear();
    await this.#stopWatch();
  }

  async #start(): Promise<boolean> {
    this.#codec ??= await recordCodec();
    if (this.#iterator) await this.#stopWatch();
    const generation = ++this.#generation;
    this.#entries = new Map();
    this.#sorted = [];
    this.#removedInSorted = 0;
    this.#keyStates = new Map();
    this.#keyOfEntry = new Map();
    this.#byKey = new Map();
    this.#unmarked = new Map();
    this.#copyBytes = 0;
    this.#lastRevision = 0;
    this.#live = false;
    const iterator = await this.#kv.watch({ key: `${markerPrefix}.>` });
    if (this.#closed || generation !== this.#generation) {
      iterator.stop();
      throw new NatsKvIndexError("The outbox index was stopped while starting");
    }
    this.#iterator = iterator;
    this.#loop = this.#consume(iterator, generation);
    try {
      await this.#barrier();
    } catch (error) {
      if (generation === this.#generation) await this.#stopWatch();
      throw error;
    }
    this.#live = true;
    return true;
  }

  async #consume(iterator: WatchIterator, generation: number): Promise<void> {
    let failure: unknown;
    try {
      for await (const entry of iterator) {
        if (generation !== this.#generation) break;
        this.#apply(entry);
      }
    } catch (error) {
      failure = error;
    }
    if (generation !== this.#generation) return;
    // The watch ended on its own (stream deleted, consumer gone): forget it; the next claim
    // builds the index again.
    this.#iterator = undefined;
    this.#loop = undefined;
    this.#starting = undefined;
    this.#generation += 1;
    const error = new NatsKvIndexError("The watch on the outbox markers stopped", {
      cause: failure,
    });
    for (const waiter of this.#waiters) waiter.reject(error);
    this.#waiters.clear();
  }

  async #stopWatch(): Promise<void> {
    this.#generation += 1;
    const iterator = this.#iterator;
    const loop = this.#loop;
    this.#iterator = undefined;
    this.#loop = undefined;
    const error = new NatsKvIndexError("The watch on the outbox markers was stopped");
    for (const waiter of this.#waiters) waiter.reject(error);
    this.#waiters.clear();
    iterator?.stop();
    await loop;
  }

  async #barrier(): Promise<void> {
    const number = ++this.#barriersStarted;
    const revision = await this.#requests.put(syncKey, `${Date.now()}`);
    await this.#wait(revision);
    if (number > this.#barrierDone) this.#barrierDone = number;
  }

  async #wait(revision: number): Promise<void> {
    if (this.#lastRevision >= revision) return;
    // Closed while the caller's write was in flight: no watch will deliver it (close() rejected
    // the waiters it found, not this one).
    if (this.#closed) throw new NatsKvIndexError("The outbox was closed");
    await new Promise<void>((resolve, reject) => {
      // Gives up only when the watch stalls: a long snapshot that keeps delivering is waited for.
      const check = () => {
        const idleMs = Date.now() - Math.max(this.#lastEventMs, startedMs);
        if (idleMs < this.#syncTimeoutMs) {
          timer = setTimeout(check, this.#syncTimeoutMs - idleMs);
          return;
        }
        this.#waiters.delete(waiter);
        reject(
          new NatsKvIndexError(
            `The watch on the outbox markers delivered nothing for ${this.#syncTimeoutMs} ms`,
          ),
        );
      };
      const startedMs = Date.now();
      let timer = setTimeout(check, this.#syncTimeoutMs);
      const waiter: Waiter = {
        revision,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
      this.#waiters.add(waiter);
    });
  }

  #apply(entry: KvWatchEntry): void {
    this.#lastEventMs = Date.now();
    const written = entry.created.getTime();
    if (written > this.#serverTimeMs) this.#serverTimeMs = written;
    if (entry.revision > this.#lastRevision) this.#lastRevision = entry.revision;
    if (isKeyEntryKey(entry.key)) this.#applyKeyEntry(entry);
    else if (entry.key !== syncKey) {
      if (entry.operation === "PUT") this.#upsert(entry);
      else {
        const known = this.#entries.get(entry.key);
        if (known && entry.revision > known.markerRevision) this.#remove(known);
      }
    }
    for (const waiter of this.#waiters) {
      if (waiter.revision <= this.#lastRevision) {
        this.#waiters.delete(waiter);
        waiter.resolve();
      }
    }
  }

  #applyKeyEntry(watched: KvWatchEntry): void {
    const value = watched.operation === "PUT"
      ? this.#codec!.decodeKeyEntry(watched.value)
      : undefined;
    const previousKey = this.#keyOfEntry.get(watched.key);
    if (!value) {
      // Deleted (or damaged, which no claim can trust): the key has no head the index knows.
      if (previousKey !== undefined) {
        this.#keyStates.delete(previousKey);
        this.#unmarked.delete(previousKey);
      }
      this.#keyOfEntry.delete(watched.key);
      return;
    }
    const before = this.#keyStates.get(value.key)?.value.head;
    this.#keyOfEntry.set(watched.key, value.key);
    this.#keyStates.set(value.key, {
      entryKey: watched.key,
      revision: watched.revision,
      value,
    });
    if (value.head === undefined) this.#unmarked.delete(value.key);
    else if (value.head !== before || this.#unmarked.has(value.key)) {
      // The new head joins the claim's FIFO (usually the first of its key's entries).
      const head = this.#byKey.get(value.key)?.find((entry) => entry.id === value.head);
      if (head) {
        this.#enqueue(head);
        this.#unmarked.delete(value.key);
      } else if (value.head !== before || !this.#unmarked.has(value.key)) {
        this.#unmarked.set(value.key, this.#unmarkedNow());
      }
    }
    if (!this.#live || value.head === undefined || value.head === before) return;
    // A hand-over: the key's next message became claimable.
    this.#notify({ id: value.head });
  }

  #notify(work: ActiveWork): void {
    for (const listener of this.#listeners) {
      try {
        listener(work);
      } catch {
        // A listener's failure is its own; the index keeps going.
      }
    }
  }

  #upsert(watched: KvWatchEntry): void {
    const marker = this.#codec!.decodeMarker(watched.value);
    const id = marker?.id ?? decodeToken(tokenOf(watched.key));
    const dueMs = marker?.due === undefined ? -Infinity : Date.parse(marker.due);
    const known = this.#entries.get(watched.key);
    if (known) {
      // Equal: the event of a write this process already noted (wroteMarker); apply it anyway.
      if (watched.revision < known.markerRevision) return;
      known.markerRevision = watched.revision;
      known.markerWrittenMs = watched.created.getTime();
      // A rewritten marker replaces the copy (a newer one, or none).
      this.#dropCopy(known);
      const copy = this.#copyIn(marker, watched.value.length);
      const order = marker?.seq ?? known.order;
      if (order !== known.order || marker?.key !== known.key) {
        this.#remove(known);
        this.#insert({ ...known, order, key: marker?.key, removed: false, queued: false, copy });
      } else known.copy = copy;
      this.hint(watched.key, dueMs, marker?.rev ?? 0);
    } else {
      this.#insert({
        markerKey: watched.key,
        recordKey: recordKeyOf(watched.key),
        id,
        order: marker?.seq ?? watched.revision,
        markerRevision: watched.revision,
        markerWrittenMs: watched.created.getTime(),
        dueMs,
        hintRevision: marker?.rev ?? 0,
        key: marker?.key,
        copy: this.#copyIn(marker, watched.value.length),
        removed: false,
      });
    }
    if (!this.#live || this.#listeners.size === 0) return;
    const work: ActiveWork = { id: id ?? "" };
    if (marker?.due !== undefined) work.dueAt = marker.due;
    this.#notify(work);
  }

  #insert(entry: ActiveEntry): void {
    this.#entries.set(entry.markerKey, entry);
    if (entry.key === undefined || this.#keyStates.get(entry.key)?.value.head === entry.id) {
      this.#enqueue(entry);
    }
    if (entry.key === undefined) return;
    const queue = this.#byKey.get(entry.key);
    if (queue) insertSorted(queue, entry);
    else this.#byKey.set(entry.key, [entry]);
    if (entry.id !== undefined && this.#keyStates.get(entry.key)?.value.head === entry.id) {
      this.#unmarked.delete(entry.key);
    }
  }

  /** Puts an entry into the claim's FIFO (once). */
  #enqueue(entry: ActiveEntry): void {
    if (entry.queued || entry.removed) return;
    entry.queued = true;
    insertSorted(this.#sorted, entry);
  }

  #remove(entry: ActiveEntry): void {
    if (entry.removed) return;
    entry.removed = true;
    this.#dropCopy(entry);
    if (entry.queued) this.#removedInSorted += 1;
    if (this.#entries.get(entry.markerKey) === entry) this.#entries.delete(entry.markerKey);
    if (entry.key === undefined) return;
    const queue = this.#byKey.get(entry.key);
    const at = queue?.indexOf(entry) ?? -1;
    if (at < 0) return;
    queue!.splice(at, 1);
    if (queue!.length === 0) this.#byKey.delete(entry.key);
    if (entry.id !== undefined && this.#keyStates.get(entry.key)?.value.head === entry.id) {
      this.#unmarked.set(entry.key, this.#unmarkedNow());
    }
  }

  /** When a key's head loses its marker here: now, in barriers started and in time. */
  #unmarkedNow(): Unmarked {
    return { barrier: this.#barriersStarted, atMs: Date.now() };
  }

  #compact(): void {
    if (this.#removedInSorted < 64 || this.#removedInSorted * 2 < this.#sorted.length) return;
    this.#sorted = this.#sorted.filter((entry) => !entry.removed);
    this.#removedInSorted = 0;
  }
}

/** When a key's head lost its marker in the index (see `ActiveIndex.unmarkedHeads`). */
interface Unmarked {
  /** Sync barriers started by then. */
  barrier: number;
  /** This process's clock, epoch ms. */
  atMs: number;
}

/**
 * How long a key's head must have had no marker in the index before `unmarkedHeads(true)` lists
 * it without a sync barrier since: far longer than a watch takes to deliver this process's own
 * hand-over.
 */
const unmarkedSettleMs = 1_000;

/** Inserts `entry` into `sorted` (enqueue order); usually an append. */
function insertSorted(sorted: ActiveEntry[], entry: ActiveEntry): void {
  const last = sorted[sorted.length - 1];
  if (!last || before(last, entry)) {
    sorted.push(entry);
    return;
  }
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    if (before(sorted[mid], entry)) low = mid + 1;
    else high = mid;
  }
  sorted.splice(low, 0, entry);
}

function before(a: ActiveEntry, b: ActiveEntry): boolean {
  return a.order < b.order || (a.order === b.order && a.markerKey < b.markerKey);
}
