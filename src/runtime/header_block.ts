/**
 * The header block of a runtime publish, encoded once, as nats.js would encode it.
 *
 * nats.js builds a message's headers as a `MsgHdrsImpl` (a Map of arrays; every `set` looks the
 * key up twice, validates it character by character into a new array and tests the value with a
 * regular expression) and `publish` then reads nothing of it but `encode()`, which joins the
 * block into a string and makes a new off-heap buffer of it. Per published message that cost
 * ~2 µs here, more than the pipeline's own bookkeeping. {@linkcode headerBlock} writes the same
 * text directly, as an `EncodedHeaderBlock` (`core/encoded_headers.ts`: encoded into the shared
 * slab when sent).
 *
 * The text is `MsgHdrsImpl#toString()`'s for the same `set` calls in the same order: `NATS/1.0`,
 * then `\r\n<name>: <value>` per header (names as given, values trimmed), then `\r\n\r\n`. Any
 * header nats.js would refuse or treat specially (a name that is empty or has a character
 * outside `!`..`~` or a colon, a value that is not a string or holds CR or LF, a name given
 * twice) is handed to nats.js's own `headers()` instead, so it throws (or encodes) exactly what
 * it did before.
 *
 * @module
 */

import { headers as natsHeaders } from "@nats-io/nats-core";
import { EncodedHeaderBlock } from "../core/encoded_headers.ts";
import type { PubAckHeaders } from "./pub_ack_pipeline.ts";

/** A header as the runtime sets it: name, value. */
export type HeaderEntry = readonly [name: string, value: string];

/**
 * The headers `entries` set in order, for a publish through nats.js (`nc.publish(subject, data,
 * { headers })`): an object whose `encode()` gives the bytes `MsgHdrsImpl` would; a real
 * `MsgHdrsImpl` when any entry needs nats.js's own handling (it throws what `set` throws).
 * Not for `js.publish`, which may add headers of its own: give it {@linkcode natsHeaderMap}.
 */
export function headerBlock(entries: readonly HeaderEntry[]): PubAckHeaders {
  let text = "NATS/1.0";
  for (let i = 0; i < entries.length; i++) {
    const [name, value] = entries[i];
    if (!plainName(name) || typeof value !== "string" || hasLineBreak(value)) {
      return natsHeaderMap(entries);
    }
    for (let j = 0; j < i; j++) if (entries[j][0] === name) return natsHeaderMap(entries);
    text += `\r\n${name}: ${value.trim()}`;
  }
  return new EncodedHeaderBlock(`${text}\r\n\r\n`);
}

/** The headers `entries` set in order on a nats.js `headers()` (what `js.publish` takes). */
export function natsHeaderMap(entries: readonly HeaderEntry[]): PubAckHeaders {
  const map = natsHeaders();
  for (const [name, value] of entries) map.set(name, value);
  return map;
}

/** A name nats.js takes as is: 1+ characters, each `!`..`~` except `:`. */
function plainName(name: string): boolean {
  const length = name.length;
  if (length === 0) return false;
  for (let i = 0; i < length; i++) {
    const c = name.charCodeAt(i);
    if (c < 33 || c > 126 || c === 58) return false;
  }
  return true;
}

function hasLineBreak(value: string): boolean {
  return value.includes("\r") || value.includes("\n");
}
