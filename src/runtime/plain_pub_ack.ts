/**
 * Reading the usual PubAck, `{"stream":"<name>","seq":<n>}`, from its bytes without a
 * `TextDecoder` and `JSON.parse` per reply (~0.5 µs here, against ~0.05 µs for this).
 *
 * The reader learns a reply's text up to its sequence (`{"stream":"ORDERS","seq":`, with the
 * spacing the server uses) from a reply `JSON.parse` read in full and found plain: exactly the
 * fields `stream` (a string) and `seq` (a number), in that order. A later reply that starts with
 * the same bytes and continues with a JSON integer and the closing brace only is that stream's
 * PubAck with that sequence; anything else (an error, `duplicate`, `domain`, another stream, a
 * sequence of more than 15 digits) is left to `JSON.parse`.
 *
 * @module
 */

/** A PubAck read from its bytes. */
export interface PlainPubAck {
  stream: string;
  seq: number;
}

const closingBrace = 0x7d;
const zero = 0x30;
const nine = 0x39;
const seqField = new TextEncoder().encode('"seq":');

/** The learnt reply prefix and its stream; one per reader. */
export class PlainPubAckReader {
  #prefix: Uint8Array | undefined;
  #stream = "";

  /** The PubAck in `data` when it has the learnt shape, else `undefined`. */
  read(data: Uint8Array): PlainPubAck | undefined {
    const prefix = this.#prefix;
    if (prefix === undefined) return undefined;
    const length = data.length;
    const start = prefix.length;
    // At least one digit and the brace.
    if (length < start + 2 || data[length - 1] !== closingBrace) return undefined;
    for (let i = 0; i < start; i++) if (data[i] !== prefix[i]) return undefined;
    const digits = length - 1 - start;
    if (digits > 15 || (digits > 1 && data[start] === zero)) return undefined;
    let seq = 0;
    for (let at = start; at < length - 1; at++) {
      const c = data[at];
      if (c < zero || c > nine) return undefined;
      seq = seq * 10 + c - zero;
    }
    return { stream: this.#stream, seq };
  }

  /**
   * Learns the shape of `data`, a reply `JSON.parse` read as `body`, when `body` is exactly
   * `{ stream, seq }` and the bytes end with that sequence and the closing brace.
   */
  learn(data: Uint8Array, body: Record<string, unknown>): void {
    const keys = Object.keys(body);
    if (
      keys.length !== 2 || keys[0] !== "stream" || keys[1] !== "seq" ||
      typeof body.stream !== "string" || body.stream === "" ||
      !Number.isSafeInteger(body.seq) || (body.seq as number) < 0
    ) return;
    const digits = String(body.seq);
    const end = data.length - 1 - digits.length;
    if (end < seqField.length || data[data.length - 1] !== closingBrace) return;
    for (let i = 0; i < digits.length; i++) {
      if (data[end + i] !== digits.charCodeAt(i)) return;
    }
    for (let i = 0; i < seqField.length; i++) {
      if (data[end - seqField.length + i] !== seqField[i]) return;
    }
    this.#prefix = data.slice(0, end);
    this.#stream = body.stream;
  }
}
