/**
 * The KV operations of the NATS KV stores (`get`, `put`, `update`, `create`, `delete`), sent
 * over a {@link ./reply_mux.ts} instead of `nc.request`, whose per-request timer, promise race
 * and Errors cost more CPU than the rest of a KV write.
 *
 * Only for a `Bucket` of `@nats-io/kv` 3.4 (this package's copy) whose methods are the class's
 * own, on a JetStream client and manager of this package's `@nats-io/jetstream` copy whose
 * methods are not replaced on the instance (nor the connection's `request` and `publish`): each
 * operation runs the bucket's own steps (key encoding and validation, value codec, subjects, entry
 * decoding) with the same headers (written already encoded, byte for byte the bucket's), and only
 * the transport differs. The usual replies (a PubAck, a `STREAM.MSG.GET` message) are read here,
 * any other by the client's own `parseJsResponse`. Any other KV-shaped object (a wrapper,
 * another copy or version) gets its own methods, unchanged.
 *
 * Outcomes are those of `@nats-io/kv` 3.4.0: a PubAck that is not the usual one is parsed by the
 * bucket's JetStream client (`parseJsResponse`: the same `JetStreamApiError` for a lost
 * compare-and-set),
 * `create` retries over a DEL/PURGE tombstone, `get` (a direct get, or `STREAM.MSG.GET` when the
 * bucket does not use direct gets, as `Kvm#open` buckets) returns `null` for a missing key and
 * the tombstone entry for a deleted one, timeouts are the JetStream client's and manager's. A reply whose error
 * nats.js would build differently is left to the bucket: a read is sent again by `kv.get`, and a
 * write answered by "no responders" (no stream took it: nothing applied) by the bucket's own
 * method, so its error is exactly the library's.
 *
 * @module
 */

import { Bucket, type KV, type KvEntry, NoopKvCodecs } from "@nats-io/kv";
import { JetStreamApiError, JetStreamError, PubHeaders } from "@nats-io/jetstream";
import { BaseApiClientImpl, DirectMsgImpl, JetStreamClientImpl } from "@nats-io/jetstream/internal";
import { headers, type Msg, type MsgHdrs } from "@nats-io/nats-core";
import { type ReplyMuxConnection, replyMuxFor } from "./reply_mux.ts";
import { EncodedHeaderBlock } from "../../core/encoded_headers.ts";
import { encodeText } from "../../core/slab_encoder.ts";
import { ApiStoredMessage, DirectMessage, type StoredMessageResponse } from "./stored_messages.ts";

/** The bucket's JetStream client, as this module uses it (`JetStreamClientImpl`). */
interface JsClient {
  nc: ReplyMuxConnection;
  timeout: number;
  parseJsResponse(msg: Msg): { stream: string; seq: number };
}

/** The bucket manager's direct-get API, as this module uses it (`DirectStreamAPIImpl`). */
interface DirectApi {
  nc: ReplyMuxConnection;
  timeout: number;
  opts: { apiPrefix?: string };
}

/** The bucket manager's stream API, as this module uses it (`StreamAPIImpl`). */
interface StreamApi {
  nc: ReplyMuxConnection;
  timeout: number;
  prefix: string;
  parseJsResponse(msg: Msg): StoredMessageResponse;
}

/** The `Bucket` methods whose steps this module reproduces: all must be the class's own. */
const ownMethods = [
  "get",
  "put",
  "_put",
  "update",
  "create",
  "delete",
  "_deleteOrPurge",
  "_doDeleteOrPurge",
  "encodeKey",
  "subjectForKey",
  "bucketName",
  "smToEntry",
] as const;

const empty = new Uint8Array(0);
const kvOperationHeader = "KV-Operation";
/** How many times `create` writes over a tombstone that vanished meanwhile before it gives up. */
const tombstoneRounds = 3;

/** JetStream API codes of a lost compare-and-set (`create` then looks for a tombstone). */
const wrongLastSequence = [10071, 10164];
/** JetStream API code of `STREAM.MSG.GET` for a subject without message. */
const noMessageFound = 10037;
const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** A write that was not sent, or that no stream took: the bucket's own method runs it. */
const notSent: unique symbol = Symbol("not sent");
/** A stream name `validateStreamName` accepts (narrower: anything else goes to the bucket). */
const plainStreamName = /^[-\w]+$/;

/** A KV's hot operations: pipelined for a plain `@nats-io/kv` `Bucket`, else the KV's own. */
export class KvRequests {
  readonly #kv: KV;
  readonly #bucket: Bucket | undefined;

  /** Uses `kv`; the pipelined path when it is a plain `Bucket` of this package's copy. */
  constructor(kv: KV) {
    this.#kv = kv;
    this.#bucket = plainBucket(kv);
  }

  /** Whether the operations bypass the KV's methods. */
  get pipelined(): boolean {
    return this.#bucket !== undefined;
  }

  /** `kv.get(key)`. */
  get(key: string): Promise<KvEntry | null> {
    const bucket = this.#bucket;
    return bucket === undefined ? this.#kv.get(key) : this.#get(bucket, key);
  }

  /** `kv.put(key, value)`. */
  put(key: string, value: Uint8Array | string): Promise<number> {
    const bucket = this.#bucket;
    if (bucket === undefined) return this.#kv.put(key, value);
    return this.#put(bucket, key, value, undefined, undefined).then((seq) =>
      seq === notSent ? this.#kv.put(key, value) : seq
    );
  }

  /** `kv.update(key, value, revision)` (throws at once for a revision <= 0, as it does). */
  update(key: string, value: Uint8Array | string, revision: number): Promise<number> {
    const bucket = this.#bucket;
    if (bucket === undefined) return this.#kv.update(key, value, revision);
    if (revision <= 0) throw new Error("version must be greater than 0");
    return this.#put(bucket, key, value, revision, undefined).then((seq) =>
      seq === notSent ? this.#kv.update(key, value, revision) : seq
    );
  }

  /** `kv.create(key, value, markerTTL)`. */
  create(key: string, value: Uint8Array | string, markerTTL?: string): Promise<number> {
    const bucket = this.#bucket;
    if (bucket === undefined) return this.#createOwn(key, value, markerTTL);
    return this.#create(bucket, key, value, markerTTL);
  }

  /**
   * The KV's own `create`, tried again (up to {@linkcode tombstoneRounds} in all) when it loses
   * its write while the key has no live entry: it writes over a tombstone it read, which prune
   * can remove (without writing anything) before the write lands.
   */
  async #createOwn(key: string, value: Uint8Array | string, markerTTL?: string): Promise<number> {
    for (let round = 1;; round++) {
      try {
        return await this.#kv.create(key, value, markerTTL);
      } catch (error) {
        if (round === tombstoneRounds || !lostCreate(error)) throw error;
        if ((await this.#kv.get(key))?.operation === "PUT") throw error;
      }
    }
  }

  /** `kv.delete(key, options)`. */
  delete(key: string, options?: { previousSeq?: number }): Promise<void> {
    const bucket = this.#bucket;
    if (bucket === undefined) return this.#kv.delete(key, options);
    return this.#delete(bucket, key, options);
  }

  /**
   * `kv.delete(key)` of one key without waiting for the server's acknowledgement, for a delete
   * whose outcome nobody waits for (a best-effort cleanup that a later reader repeats if it was
   * lost): on a pipelined bucket the same DEL message as `kv.delete` is published without a reply
   * subject, so neither the server nor this process handles an acknowledgement; it resolves once
   * the message is queued on the connection (it may still be lost with the connection, or refused
   * by the stream: nothing says so). On any other KV object, `kv.delete(key)` (awaited).
   */
  deleteUnconfirmed(key: string): Promise<void> {
    const bucket = this.#bucket;
    if (bucket === undefined || hasWildcards(bucket, key)) return this.#kv.delete(key);
    try {
      const encoded = encodeKey(bucket, key);
      bucket.validateKey(encoded);
      const js = bucket.js as unknown as JsClient;
      js.nc.publish(bucket.subjectForKey(encoded, true), empty, { headers: deleteHeaders() });
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** `Bucket#create`: a put expecting no entry, retried over a DEL/PURGE tombstone. */
  async #create(
    bucket: Bucket,
    key: string,
    value: Uint8Array | string,
    markerTTL: string | undefined,
  ): Promise<number> {
    let seq: number | typeof notSent = notSent;
    let failed = false;
    let firstError: unknown;
    try {
      seq = await this.#put(bucket, key, value, 0, markerTTL);
    } catch (error) {
      failed = true;
      firstError = error;
      if (
        error instanceof JetStreamApiError && !wrongLastSequence.includes(error.code)
      ) throw error;
    }
    if (!failed) return seq === notSent ? await this.#kv.create(key, value, markerTTL) : seq;
    // A tombstone can vanish between the read and the write over it (prune deletes tombstones
    // without writing anything): the write then loses although the key has no entry, and is
    // tried again, from the start.
    for (let round = 1;; round++) {
      const entry = await this.get(key);
      // No entry after a write that failed otherwise (a timeout): that failure stands, as the
      // bucket's own create reports it.
      if (entry === null ? !(firstError instanceof JetStreamApiError) : entry.operation === "PUT") {
        throw firstError;
      }
      const previousSeq = entry?.revision ?? 0;
      try {
        const seq = await this.#put(bucket, key, value, previousSeq, markerTTL);
        return seq === notSent ? await bucket._put(key, value, { previousSeq }, markerTTL) : seq;
      } catch (error) {
        if (round === tombstoneRounds || !lostCreate(error)) throw error;
      }
    }
  }

  /** `Bucket#_put`; `notSent` when the bucket's own call must run (nothing written). */
  async #put(
    bucket: Bucket,
    key: string,
    value: Uint8Array | string,
    previousSeq: number | undefined,
    markerTTL: string | undefined,
  ): Promise<number | typeof notSent> {
    const encoded = encodeKey(bucket, key);
    bucket.validateKey(encoded);
    const data = bucket.codec.value.encode(value);
    let h: MsgHdrs;
    if (markerTTL && previousSeq !== undefined) {
      // As _put does: the TTL header only reaches the message along with a previousSeq one.
      h = headers();
      h.set(PubHeaders.ExpectedLastSubjectSequenceHdr, `${previousSeq}`);
      h.set(PubHeaders.MessageTTL, markerTTL);
    } else {
      // js.publish sends headers even when there are none (an empty block).
      h = previousSeq === undefined ? noHeaders : expectLast(previousSeq);
    }
    return await this.#publish(bucket, bucket.subjectForKey(encoded, true), data, h);
  }

  /** `Bucket#delete` of one key; a wildcard key goes to the bucket (it lists keys). */
  async #delete(
    bucket: Bucket,
    key: string,
    options: { previousSeq?: number } | undefined,
  ): Promise<void> {
    if (hasWildcards(bucket, key)) return await this.#kv.delete(key, options);
    const encoded = encodeKey(bucket, key);
    bucket.validateKey(encoded);
    const h = deleteHeaders(options?.previousSeq);
    const seq = await this.#publish(bucket, bucket.subjectForKey(encoded, true), empty, h);
    if (seq === notSent) await this.#kv.delete(key, options);
  }

  /**
   * `js.publish`: the PubAck's sequence, or `notSent` when nothing was written and the
   * bucket's own call must run ("no responders", or a timeout `nc.request` refuses).
   */
  async #publish(
    bucket: Bucket,
    subject: string,
    data: Uint8Array,
    h: MsgHdrs,
  ): Promise<number | typeof notSent> {
    const js = bucket.js as unknown as JsClient;
    const timeout = js.timeout || 1000;
    if (timeout < 1) return notSent; // nc.request refuses it: the bucket's call says how
    const reply = await replyMuxFor(js.nc).request(subject, data, h, timeout);
    if (isNoResponders(reply)) return notSent;
    const seq = plainAckSeq(reply.data);
    if (seq !== undefined) return seq;
    const ack = plainResponse<{ stream?: unknown; seq?: unknown }>(reply);
    // The usual PubAck is read here; anything else (an error, another shape) by the client's
    // parseJsResponse, which throws what the bucket's call would.
    if (typeof ack?.stream === "string" && ack.stream !== "" && typeof ack.seq === "number") {
      return ack.seq;
    }
    const parsed = js.parseJsResponse(reply);
    if (parsed.stream === "") throw new JetStreamError("invalid ack response");
    return parsed.seq;
  }

  /**
   * `Bucket#get`: a direct get, or `STREAM.MSG.GET` when the bucket does not use direct gets.
   * Any reply but a message or "not found" goes to `kv.get` (a read: running it again is safe).
   */
  async #get(bucket: Bucket, key: string): Promise<KvEntry | null> {
    const encoded = encodeKey(bucket, key);
    bucket.validateKey(encoded);
    const stream = bucket.bucketName();
    const direct = bucket.direct;
    const api = (direct ? bucket.jsm.direct : bucket.jsm.streams) as unknown as
      & DirectApi
      & StreamApi;
    const timeout = api.timeout || 1000;
    if (!plainStreamName.test(stream) || timeout < 1) return await this.#kv.get(key);
    const last = bucket.subjectForKey(encoded);
    const mux = replyMuxFor(api.nc);
    if (direct) {
      const subject = `${api.opts.apiPrefix || "$JS.API"}.DIRECT.GET.${stream}.${last}`;
      const reply = await mux.request(subject, empty, undefined, timeout);
      const status = reply.headers;
      if (status !== undefined && status.code === 0) {
        return entryOf(bucket, new DirectMessage(reply.data, status), encoded);
      }
      const notFound = status?.code === 404 &&
        status.description.toLowerCase() === "message not found";
      return notFound ? null : await this.#kv.get(key);
    }
    const query = encodeText(JSON.stringify({ last_by_subj: last }));
    const reply = await mux.request(
      `${api.prefix}.STREAM.MSG.GET.${stream}`,
      query,
      undefined,
      timeout,
    );
    if (isNoResponders(reply)) return await this.#kv.get(key);
    let response: StoredMessageResponse;
    try {
      const plain = plainResponse<StoredMessageResponse>(reply);
      response = typeof plain?.message === "object" && plain.message !== null
        ? plain
        : api.parseJsResponse(reply);
    } catch (error) {
      if (error instanceof JetStreamApiError && error.code === noMessageFound) return null;
      throw error;
    }
    return entryOf(bucket, new ApiStoredMessage(response), encoded);
  }
}

/** The bucket's entry for `message`; `null` when it is another key's (as `Bucket#get`). */
function entryOf(
  bucket: Bucket,
  message: DirectMessage | ApiStoredMessage,
  encoded: string,
): KvEntry | null {
  const entry = bucket.smToEntry(message);
  return (entry as { rawKey?: string }).rawKey === encoded ? entry : null;
}

/**
 * `Bucket#encodeKey(key)`: `key` itself when the bucket's key codec is `NoopKvCodecs`' (the
 * default: `encode(k) { return k; }` maps every token to itself, so splitting the key on its
 * dots, encoding each token and joining them gives the key back), else the bucket's own.
 */
function encodeKey(bucket: Bucket, key: string): string {
  const encode = bucket.codec?.key?.encode;
  if (typeof encode !== "function") return bucket.encodeKey(key);
  let identity = identities.get(encode);
  if (identity === undefined) {
    identity = Function.prototype.toString.call(encode) === identitySource;
    identities.set(encode, identity);
  }
  return identity ? key : bucket.encodeKey(key);
}

/** The source text of `NoopKvCodecs().key.encode` (an identity: it uses nothing but its argument). */
const identitySource = Function.prototype.toString.call(NoopKvCodecs().key.encode);
/** Key `encode` functions seen, and whether their source is {@linkcode identitySource}. */
const identities = new WeakMap<object, boolean>();

/**
 * `Bucket#hasWildcards(key)` without splitting `key`: a key with no `*` and no `>` has no
 * wildcard token; one starting or ending with a dot, or with either character, goes to the
 * bucket's (which throws for a bad key as before).
 */
function hasWildcards(bucket: Bucket, key: string): boolean {
  if (
    bucket.hasWildcards === moduleHasWildcards && key.indexOf("*") === -1 &&
    key.indexOf(">") === -1 && key.charCodeAt(0) !== dot &&
    key.charCodeAt(key.length - 1) !== dot
  ) return false;
  return bucket.hasWildcards(key);
}

/**
 * `@nats-io/kv`'s own `hasWildcards` (a field every `Bucket` gets in its constructor, not a
 * prototype method), from a bucket made only to read it.
 */
const moduleHasWildcards = new Bucket("reference", undefined as never, undefined as never)
  .hasWildcards;
const dot = 0x2e;
const quote = 0x22;
const backslash = 0x5c;
/**
 * `{"stream":"` and `"seq":` as bytes: the usual PubAck, `{"stream":"<name>","seq":<n>}` (2.11
 * and later) or `{"stream":"<name>", "seq":<n>}` (2.9 and 2.10 write a space after the comma).
 */
const ackHead = encoder.encode(`{"stream":"`);
const ackSeq = encoder.encode(`"seq":`);
const comma = 0x2c;
const space = 0x20;

/**
 * The sequence of the usual PubAck, `{"stream":"<name>","seq":<n>}` exactly, or with one space
 * after the comma (a non-empty stream name without escapes, a JSON integer without leading
 * zeros), read from its bytes; `undefined` for any other reply (an error, a `duplicate` or
 * `domain` field, other spacing), which the caller parses as JSON. For this shape `JSON.parse`
 * gives the same stream and sequence.
 */
export function plainAckSeq(data: Uint8Array): number | undefined {
  const length = data.length;
  if (length < ackHead.length + 1 + 2 + ackSeq.length + 2) return undefined;
  for (let i = 0; i < ackHead.length; i++) if (data[i] !== ackHead[i]) return undefined;
  let at = ackHead.length;
  const nameStart = at;
  while (at < length && data[at] !== quote) {
    if (data[at] === backslash || data[at] < 0x20) return undefined;
    at++;
  }
  if (at === nameStart || data[at + 1] !== comma) return undefined;
  at += data[at + 2] === space ? 3 : 2;
  for (let i = 0; i < ackSeq.length; i++, at++) if (data[at] !== ackSeq[i]) return undefined;
  const digitsStart = at;
  let seq = 0;
  while (at < length && data[at] >= 0x30 && data[at] <= 0x39) seq = seq * 10 + data[at++] - 0x30;
  const digits = at - digitsStart;
  if (digits === 0 || digits > 15 || (digits > 1 && data[digitsStart] === 0x30)) return undefined;
  return at === length - 1 && data[at] === 0x7d ? seq : undefined;
}

/**
 * A JetStream API reply's JSON when it parses and has no `error` (what `parseJsResponse`
 * returns for it, without the TextDecoder it builds per reply); else `undefined`, and the
 * caller's `parseJsResponse` reads it (and throws what it throws).
 */
function plainResponse<T>(reply: Msg): T | undefined {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(reply.data));
  } catch {
    return undefined;
  }
  if (value === null || typeof value !== "object" || "error" in value) return undefined;
  return value as T;
}

/** What `headers()` with no header encodes to (an empty block; js.publish sends it). */
const noHeaders = encoded("");

/** `Nats-Expected-Last-Subject-Sequence: <seq>` (a compare-and-set on the key's revision). */
function expectLast(seq: number): MsgHdrs {
  return encoded(`NATS/1.0\r\n${PubHeaders.ExpectedLastSubjectSequenceHdr}: ${seq}\r\n\r\n`);
}

/**
 * Headers whose encoding is `text`, as `publish` takes them: it reads only `encode()` (the
 * sources hash below covers the `publish` of this package's nats-core).
 */
function encoded(text: string): MsgHdrs {
  return new EncodedHeaderBlock(text) as unknown as MsgHdrs;
}

/** The headers of a KV delete (`KV-Operation: DEL`), with its compare-and-set when given. */
function deleteHeaders(previousSeq?: number): MsgHdrs {
  const expect = previousSeq
    ? `${PubHeaders.ExpectedLastSubjectSequenceHdr}: ${previousSeq}\r\n`
    : "";
  return encoded(`NATS/1.0\r\n${kvOperationHeader}: DEL\r\n${expect}\r\n`);
}

/** `kv` as a `Bucket` when it is one whose methods are all the class's own. */
function plainBucket(kv: KV): Bucket | undefined {
  if (Object.getPrototypeOf(kv) !== Bucket.prototype) return undefined;
  const bucket = kv as Bucket;
  for (const name of ownMethods) {
    if (bucket[name] !== Bucket.prototype[name]) return undefined;
  }
  // The JetStream client and the manager's APIs are this package's copy, with the methods the
  // bucket's own calls would run unreplaced (a tracing wrapper of js.publish, say, must see
  // every write): the pipelined path reproduces those methods, it would skip a replacement.
  const js = bucket.js as unknown as Partial<JsClient> | undefined;
  if (
    js === undefined || Object.getPrototypeOf(js) !== JetStreamClientImpl.prototype ||
    hasOwn(js, clientMethods) || typeof js.parseJsResponse !== "function" || !isConnection(js.nc)
  ) return undefined;
  const direct = (bucket.jsm as { direct?: Partial<DirectApi> } | undefined)?.direct;
  if (
    !(direct instanceof BaseApiClientImpl) || hasOwn(direct, apiMethods) ||
    !isConnection(direct.nc) || typeof direct.opts !== "object"
  ) return undefined;
  const streams = (bucket.jsm as { streams?: Partial<StreamApi> }).streams;
  if (
    !(streams instanceof BaseApiClientImpl) || hasOwn(streams, apiMethods) ||
    !isConnection(streams.nc) || typeof streams.parseJsResponse !== "function"
  ) return undefined;
  // The same for the connection's request, which the reply mux stands in for, and its publish,
  // which gets the writes' headers already encoded (see EncodedHeaderBlock).
  if (hasOwn(js.nc, ["request", "publish"])) return undefined;
  // And the code it reproduces is the release it was written and tested against.
  if (sourcesHash(js.nc, direct, streams) !== testedSourcesHash) return undefined;
  return bucket;
}

/**
 * A hash of the source text of every method the pipelined path reproduces or stands in for, as
 * `@nats-io/kv`, `@nats-io/jetstream` and `@nats-io/nats-core` 3.4.0 ship them (the same text
 * in Deno and Node). Another release (an npm caret range may deduplicate to one), or a bundler
 * rewriting them, hashes differently and keeps the bucket's own methods: check what changed in
 * those methods before updating it.
 */
const testedSourcesHash = "da247d5e:17713";

function sourcesHash(nc: object, direct: object, streams: object): string {
  const methods: unknown[] = [
    ...ownMethods.map((name) => Bucket.prototype[name]),
    JetStreamClientImpl.prototype.publish,
    JetStreamClientImpl.prototype._publish,
    BaseApiClientImpl.prototype.parseJsResponse,
    BaseApiClientImpl.prototype._request,
    (Object.getPrototypeOf(direct) as { getMessage?: unknown }).getMessage,
    (Object.getPrototypeOf(streams) as { getMessage?: unknown }).getMessage,
    (Object.getPrototypeOf(nc) as { request?: unknown }).request,
    (Object.getPrototypeOf(nc) as { publish?: unknown }).publish,
    (Object.getPrototypeOf((nc as { protocol?: object }).protocol ?? {}) as { publish?: unknown })
      .publish,
    DirectMsgImpl,
  ];
  let hash = 0x811c9dc5;
  let length = 0;
  for (const method of methods) {
    if (typeof method !== "function") return "missing";
    const text = Function.prototype.toString.call(method);
    length += text.length + 1;
    for (let i = 0; i < text.length; i++) {
      hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193);
    }
    hash = Math.imul(hash ^ 0, 0x01000193);
  }
  return `${(hash >>> 0).toString(16)}:${length}`;
}

/** The JetStream client's methods a bucket's write runs (`js.publish`). */
const clientMethods = ["publish", "_publish", "parseJsResponse", "_request"];
/** The manager APIs' methods a bucket's get runs (`getMessage`). */
const apiMethods = ["getMessage", "_request", "parseJsResponse"];

function hasOwn(target: object, names: readonly string[]): boolean {
  return names.some((name) => Object.hasOwn(target, name));
}

function isConnection(nc: unknown): nc is ReplyMuxConnection {
  const candidate = nc as Partial<ReplyMuxConnection> | undefined;
  return typeof candidate?.publish === "function" && typeof candidate.subscribe === "function" &&
    typeof candidate.closed === "function";
}

function isNoResponders(msg: Msg): boolean {
  return msg.data.length === 0 && msg.headers?.code === 503;
}

/** A create that lost its compare-and-set (the key had an entry, or the tombstone it read moved). */
function lostCreate(error: unknown): boolean {
  return error instanceof JetStreamApiError && wrongLastSequence.includes(error.code);
}
