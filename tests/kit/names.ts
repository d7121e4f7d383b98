/**
 * Unique names for streams, buckets, tables and databases, so tests never collide (also when
 * several test processes share one server).
 *
 * @module
 */

let counter = 0;

/** `prefix_<time>_<random>_<n>`: lowercase letters, digits and `_`; valid everywhere we use it. */
export function uniqueName(prefix = "t"): string {
  counter += 1;
  const random = crypto.getRandomValues(new Uint32Array(1))[0].toString(36);
  return `${prefix}_${Date.now().toString(36)}_${random}_${counter}`.toLowerCase();
}
