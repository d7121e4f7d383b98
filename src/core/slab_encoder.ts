/**
 * UTF-8 encoding of outgoing NATS messages (the NATS KV stores' writes, the JetStream runtime's
 * publishes: header blocks, records, payloads) into views of a shared buffer instead of a new
 * buffer per string: `TextEncoder#encode` makes a fresh
 * off-heap `ArrayBuffer` per call (~0.75 µs here for a header block or a record, and garbage
 * for the collector to finalise), where `encodeInto` at the end of a 64 KiB slab costs a third
 * of that and a short ASCII string copied by hand less still.
 *
 * Bytes are only ever appended: a slab region is never written twice, so a view stays valid
 * for as long as anyone holds it (nats.js keeps it until its next flush). A full slab is
 * replaced, not reused; it is freed once no view of it is left. Only for bytes that are sent
 * and dropped: a view kept for long keeps its whole slab alive.
 *
 * @module
 */

const slabBytes = 64 * 1024;
/** Strings longer than this get a buffer of their own (they would waste most of a slab). */
const largestSlabbed = slabBytes / 8;
/** Up to this many UTF-16 units an ASCII string is copied by hand (faster than `encodeInto`). */
const handCopied = 256;

const encoder = new TextEncoder();
let slab = new Uint8Array(slabBytes);
let used = 0;

/** `new TextEncoder().encode(text)`, the same bytes, usually as a view of a shared slab. */
export function encodeText(text: string): Uint8Array {
  const length = text.length;
  // At most 3 bytes per UTF-16 unit (a surrogate pair, 2 units, is 4 bytes).
  const room = length * 3;
  if (room > largestSlabbed) return encoder.encode(text);
  if (used + room > slabBytes) {
    slab = new Uint8Array(slabBytes);
    used = 0;
  }
  const start = used;
  if (length <= handCopied) {
    let i = 0;
    for (; i < length; i++) {
      const unit = text.charCodeAt(i);
      if (unit > 0x7f) break;
      slab[start + i] = unit;
    }
    if (i === length) {
      used = start + length;
      return slab.subarray(start, used);
    }
  }
  const { written } = encoder.encodeInto(text, slab.subarray(start, start + room));
  used = start + written;
  return slab.subarray(start, used);
}
