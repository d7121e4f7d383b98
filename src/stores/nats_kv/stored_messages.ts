/**
 * Stored messages read by {@link ./kv_requests.ts} as `@nats-io/jetstream` 3.4.0 reads them, for
 * the bucket's `smToEntry`: a direct-get reply (`DirectMsgImpl`: the message with its metadata in
 * headers) and a `STREAM.MSG.GET` response (`StoredMsgImpl`: JSON with base64 data and headers).
 *
 * @module
 */

import type { Bucket } from "@nats-io/kv";
import { DirectMsgHeaders } from "@nats-io/jetstream";
import { headers, Match, type MsgHdrs } from "@nats-io/nats-core";
import { MsgHdrsImpl } from "@nats-io/nats-core/internal";

/** The stored message `Bucket#smToEntry` takes. */
export type StoredMessage = Parameters<Bucket["smToEntry"]>[0];

const empty = new Uint8Array(0);
/** A character above U+007F (the block's binary string then needs UTF-8 decoding). */
const nonAscii = /[\u0080-\uffff]/;
const decoder = new TextDecoder();

abstract class Stored implements StoredMessage {
  abstract readonly subject: string;
  abstract readonly seq: number;
  abstract readonly timestamp: string;
  abstract readonly header: MsgHdrs;
  abstract readonly data: Uint8Array;
  abstract readonly lastSequence: number;
  abstract readonly pending: number;

  get time(): Date {
    return new Date(Date.parse(this.timestamp));
  }

  json<T>(reviver?: (key: string, value: unknown) => unknown): T {
    return JSON.parse(this.string(), reviver);
  }

  string(): string {
    return decoder.decode(this.data);
  }
}

/** A direct-get reply (`DirectMsgImpl`). */
export class DirectMessage extends Stored {
  readonly data: Uint8Array;
  readonly header: MsgHdrs;

  /** The reply's body and (status 0) headers. */
  constructor(data: Uint8Array, header: MsgHdrs) {
    super();
    this.data = data;
    this.header = header;
  }

  get subject(): string {
    return this.header.last(DirectMsgHeaders.Subject);
  }

  get seq(): number {
    return this.#number(DirectMsgHeaders.Sequence, 0);
  }

  get timestamp(): string {
    return this.header.last(DirectMsgHeaders.TimeStamp);
  }

  get stream(): string {
    return this.header.last(DirectMsgHeaders.Stream);
  }

  get lastSequence(): number {
    return this.#number(DirectMsgHeaders.LastSequence, 0);
  }

  get pending(): number {
    return this.#number(DirectMsgHeaders.NumPending, -1);
  }

  #number(name: string, missing: number): number {
    const value = this.header.last(name);
    return typeof value === "string" ? parseInt(value) : missing;
  }
}

/** The `message` of a `STREAM.MSG.GET` response. */
export interface StoredMessageResponse {
  message: { subject: string; seq: number; time: string; data?: string; hdrs?: string };
}

/** A `STREAM.MSG.GET` response (`StoredMsgImpl`). */
export class ApiStoredMessage extends Stored {
  readonly #response: StoredMessageResponse;
  #header: MsgHdrs | undefined;

  /** The parsed response. */
  constructor(response: StoredMessageResponse) {
    super();
    this.#response = response;
  }

  get subject(): string {
    return this.#response.message.subject;
  }

  get seq(): number {
    return this.#response.message.seq;
  }

  get timestamp(): string {
    return this.#response.message.time;
  }

  get lastSequence(): number {
    return 0;
  }

  get pending(): number {
    return 0;
  }

  get data(): Uint8Array {
    const data = this.#response.message.data;
    return data ? fromBase64(data) : empty;
  }

  get header(): MsgHdrs {
    if (this.#header === undefined) {
      const hdrs = this.#response.message.hdrs;
      this.#header = hdrs ? new StoredHeaders(hdrs) as unknown as MsgHdrs : headers();
    }
    return this.#header;
  }
}

/**
 * The base64 header block of a `STREAM.MSG.GET` message, read as `MsgHdrsImpl.decode` reads it
 * for the lookups a KV entry makes (`has`, `get`, `last` of an exact name: its operation and
 * size), without building the MsgHdrsImpl (a Map, every name checked character by character
 * and canonicalised, every lookup listing the names): ~2.5 µs less per read here. Only a block
 * of the usual form (a `NATS/1.0` status line, names of printable ASCII, values without a lone
 * CR or LF) is read so; any other block, any other kind of match and every other method use
 * the MsgHdrsImpl, decoded on first need (which throws what it throws for a malformed block),
 * and after a change (`set`, `append`, `delete`) only it is read.
 */
class StoredHeaders {
  readonly #base64: string;
  #full: MsgHdrs | undefined;
  /** Names and values in order; `null` when the block is not of the usual form. */
  #pairs: string[] | null | undefined;

  constructor(base64: string) {
    this.#base64 = base64;
  }

  #decoded(): MsgHdrs {
    return this.#full ??= MsgHdrsImpl.decode(fromBase64(this.#base64));
  }

  /** The block's names and values (`[name, value, name, value, ...]`), or `null`. */
  #read(match: unknown): string[] | null {
    if (match !== undefined && match !== Match.Exact) return null;
    if (this.#pairs !== undefined) return this.#pairs;
    // As MsgHdrsImpl.decode: the text (TextDecoder, replacement characters), split on CRLF.
    let binary: string;
    try {
      binary = atob(this.#base64);
    } catch {
      return this.#pairs = null; // the MsgHdrsImpl path fails as it did
    }
    const text = nonAscii.test(binary) ? decoder.decode(fromBase64(this.#base64)) : binary;
    const lines = text.split("\r\n");
    if (lines[0] !== "NATS/1.0") return this.#pairs = null;
    const pairs: string[] = [];
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i];
      const colon = line.indexOf(":");
      if (colon === -1) continue; // decode skips it (an empty line too)
      const name = line.slice(0, colon);
      for (let c = 0; c < name.length; c++) {
        const code = name.charCodeAt(c);
        if (code < 33 || code > 126) return this.#pairs = null; // decode throws
      }
      const value = line.slice(colon + 1).trim();
      if (value.includes("\r") || value.includes("\n")) return this.#pairs = null; // so does it
      pairs.push(name, value);
    }
    return this.#pairs = pairs;
  }

  /** The index of the first name `k` in `pairs`, or -1. */
  static #first(pairs: string[], k: string): number {
    for (let i = 0; i < pairs.length; i += 2) if (pairs[i] === k) return i;
    return -1;
  }

  get(k: string, match?: Match): string {
    const pairs = this.#read(match);
    if (pairs === null) return this.#decoded().get(k, match);
    const at = StoredHeaders.#first(pairs, k);
    return at === -1 ? "" : pairs[at + 1];
  }

  last(k: string, match?: Match): string {
    const pairs = this.#read(match);
    if (pairs === null) return this.#decoded().last(k, match);
    for (let i = pairs.length - 2; i >= 0; i -= 2) if (pairs[i] === k) return pairs[i + 1];
    return "";
  }

  has(k: string, match?: Match): boolean {
    const pairs = this.#read(match);
    if (pairs === null) return this.#decoded().has(k, match);
    return StoredHeaders.#first(pairs, k) !== -1;
  }

  get hasError(): boolean {
    return this.#decoded().hasError;
  }

  get status(): string {
    return this.#decoded().status;
  }

  get code(): number {
    return this.#decoded().code;
  }

  get description(): string {
    return this.#decoded().description;
  }

  set(k: string, v: string, match?: Match): void {
    this.#decoded().set(k, v, match);
    this.#pairs = null;
  }

  append(k: string, v: string, match?: Match): void {
    this.#decoded().append(k, v, match);
    this.#pairs = null;
  }

  delete(k: string, match?: Match): void {
    this.#decoded().delete(k, match);
    this.#pairs = null;
  }

  keys(): string[] {
    return this.#decoded().keys();
  }

  values(k: string, match?: Match): string[] {
    return this.#decoded().values(k, match);
  }

  [Symbol.iterator](): Iterator<[string, string[]]> {
    return this.#decoded()[Symbol.iterator]();
  }
}

/** `Uint8Array.fromBase64`, where the runtime has it (native: a third of the loop's cost). */
const nativeFromBase64 = (Uint8Array as { fromBase64?: (text: string) => Uint8Array }).fromBase64
  ?.bind(Uint8Array);

function fromBase64(text: string): Uint8Array {
  if (nativeFromBase64 !== undefined) return nativeFromBase64(text);
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}
