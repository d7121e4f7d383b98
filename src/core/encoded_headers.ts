/**
 * NATS message headers whose encoding is fixed: the header block's text, written by the caller
 * exactly as nats.js's `MsgHdrsImpl#toString()` would write it, and encoded into the shared slab
 * (slab_encoder.ts) when sent. A `publish` of `@nats-io/nats-core` 3.x reads nothing of a
 * message's headers but `encode()`, and building a `MsgHdrsImpl` per message (a Map, key
 * canonicalisation and lookups) cost more than the rest of its headers' handling. Used by the
 * NATS KV stores' writes and the JetStream runtime's publishes.
 *
 * @module
 */

import { encodeText } from "./slab_encoder.ts";

/** A header block given as its text (`""`: no headers, an empty block). */
export class EncodedHeaderBlock {
  readonly #text: string;

  constructor(text: string) {
    this.#text = text;
  }

  /** The block's UTF-8 bytes (a view of a shared slab; never written again). */
  encode(): Uint8Array {
    return encodeText(this.#text);
  }

  /** The block's text, as `MsgHdrsImpl#toString()` gives it. */
  toString(): string {
    return this.#text;
  }
}
