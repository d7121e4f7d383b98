/**
 * Outbox records for the store tests: a fresh `event.publish` record, with or without an ordering
 * key, and fresh ordering keys. Next to the conformance cases that use it, so the Node run
 * (scripts/test_node.ts copies tests/conformance/) has it too.
 *
 * @module
 */

import type { OutboxRecord } from "../../mod.ts";

let counter = 0;

/**
 * A fresh `event.publish` record of `orderingKey` (`undefined`: unkeyed), its id
 * `<prefix>-<n>-<random>`; `overrides` replace its other fields (its id, say).
 */
export function keyedRecord(
  prefix: string,
  orderingKey: string | undefined,
  overrides: Partial<OutboxRecord> = {},
): OutboxRecord {
  counter += 1;
  const record: OutboxRecord = {
    id: `${prefix}-${counter}-${Math.random().toString(36).slice(2, 8)}`,
    kind: "event.publish",
    name: "order.updated",
    subject: "orders.updated",
    payload: JSON.stringify({ n: counter }),
    headers: {},
    ...overrides,
  };
  if (orderingKey !== undefined) record.orderingKey = orderingKey;
  return record;
}

/** A fresh ordering key, `<name>-<random>`. */
export function uniqueKey(name: string): string {
  return `${name}-${Math.random().toString(36).slice(2, 8)}`;
}
