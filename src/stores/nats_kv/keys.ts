/**
 * Reversible KV keys for any message id.
 *
 * NATS KV keys are dot-separated tokens of `[-/=\w]`. Every id (and inbox consumer) becomes ONE
 * token: `b` + base64url(UTF-8) when that is at most {@linkcode maxDirectTokenChars} long, else
 * `h` + base64url(SHA-256(UTF-8)). The prefix letter says which: `b` tokens decode back to the
 * id; `h` tokens do not, so records under them also store the full id, and readers verify it.
 *
 * @module
 */

/**
 * Longest base64url token used as is (ids up to 768 UTF-8 bytes). Longer ids are hashed so a key
 * stays well inside NATS protocol limits (a subject travels in control lines of 4 KiB by default).
 */
export const maxDirectTokenChars = 1024;

/** Key of the canonical outbox record of a message. */
export const recordPrefix = "m";
/** Key of the active-index marker that exists while a message is pending, claimed or failed. */
export const markerPrefix = "q";
/** Key of an inbox entry: `i.<consumer token>.<id token>`. */
export const inboxPrefix = "i";
/**
 * Written by a claimer to learn when its watch on `q.>` has caught up (a barrier); never an id
 * token, which always starts with `b` or `h`.
 */
export const syncKey = `${markerPrefix}._sync`;
/**
 * Prefix of the per-ordering-key entries (`q._k.<key token>`): who the key's head is. Under the
 * markers' prefix so the claimers' one watch on `q.>` sees them; never an id token either.
 */
export const keyEntryPrefix = `${markerPrefix}._k`;

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** base64url without padding. */
export function toBase64Url(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** Inverse of {@linkcode toBase64Url}; `undefined` for text that is not base64url. */
export function fromBase64Url(text: string): Uint8Array | undefined {
  if (!/^[A-Za-z0-9_-]*$/.test(text) || text.length % 4 === 1) return undefined;
  let binary: string;
  try {
    binary = atob(text.replaceAll("-", "+").replaceAll("_", "/"));
  } catch {
    return undefined;
  }
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Encodes `text` as one KV key token (see the module doc). */
export async function encodeToken(text: string): Promise<string> {
  const bytes = encoder.encode(text);
  const direct = toBase64Url(bytes);
  if (direct.length + 1 <= maxDirectTokenChars) return `b${direct}`;
  const digest = await globalThis.crypto.subtle.digest("SHA-256", bytes);
  return `h${toBase64Url(new Uint8Array(digest))}`;
}

/** The text of a `b` token; `undefined` for hashed or foreign tokens. */
export function decodeToken(token: string): string | undefined {
  if (!token.startsWith("b")) return undefined;
  const bytes = fromBase64Url(token.slice(1));
  if (!bytes) return undefined;
  try {
    return decoder.decode(bytes);
  } catch {
    return undefined;
  }
}

/** The record key of outbox message `id`. */
export async function outboxRecordKey(id: string): Promise<string> {
  return `${recordPrefix}.${await encodeToken(id)}`;
}

/** The key entry of ordering key `key` (`q._k.<token>`). */
export async function keyEntryKey(key: string): Promise<string> {
  return `${keyEntryPrefix}.${await encodeToken(key)}`;
}

/** Whether `key` is a per-ordering-key entry (see {@linkcode keyEntryPrefix}). */
export function isKeyEntryKey(key: string): boolean {
  return key.startsWith(`${keyEntryPrefix}.`);
}

/** The marker key for a record key (`m.<token>` -> `q.<token>`). */
export function markerKeyOf(recordKey: string): string {
  return `${markerPrefix}.${tokenOf(recordKey)}`;
}

/** The record key for a marker key (`q.<token>` -> `m.<token>`). */
export function recordKeyOf(markerKey: string): string {
  return `${recordPrefix}.${tokenOf(markerKey)}`;
}

/** The last token of a key. */
export function tokenOf(key: string): string {
  return key.slice(key.lastIndexOf(".") + 1);
}

/** The inbox key of (`consumer`, `messageId`). */
export async function inboxKey(consumer: string, messageId: string): Promise<string> {
  const [scope, id] = await Promise.all([encodeToken(consumer), encodeToken(messageId)]);
  return `${inboxPrefix}.${scope}.${id}`;
}
