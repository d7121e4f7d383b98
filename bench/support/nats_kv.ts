/**
 * NATS KV for benchmarks: outbox buckets removed at exit, and fast history seeding with
 * concurrent puts.
 *
 * @module
 */

import type { KV } from "@nats-io/kv";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { createOutboxBucket } from "../../mod.ts";
import { outboxRecordKey } from "../../src/stores/nats_kv/keys.ts";
import { encodeJson, type StoredOutboxRecord } from "../../src/stores/nats_kv/records.ts";
import { natsUrl, uniqueName } from "../../tests/kit/mod.ts";
import { cleanUpAtExit } from "./cleanup.ts";
import { payload, subject } from "./records.ts";

/** Creates an outbox bucket (the library's settings) that is destroyed when the process ends. */
export async function createBenchBucket(nc: NatsConnection, label: string): Promise<KV> {
  const name = uniqueName(`outbox_bench_${label}`);
  const kv = await createOutboxBucket(new Kvm(nc), name);
  cleanUpAtExit({ kind: "kv-bucket", natsUrl: await natsUrl(), name });
  return kv;
}

/**
 * Writes `count` dispatched records (`m.<token>`, no active-index marker: exactly what the store
 * leaves after `markDispatched`) with up to `window` puts in flight.
 */
export async function seedKvHistory(
  kv: KV,
  count: number,
  window = 512,
  prefix = "bench",
): Promise<void> {
  const base = Date.now() - 2 * 86_400_000;
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const id = `hist-${i}`;
      const record: StoredOutboxRecord = {
        v: 1,
        id,
        kind: "event.publish",
        name: "order.created",
        subject: subject(prefix, i),
        payload: payload(i),
        headers: {},
        state: "dispatched",
        attempts: 1,
        createdAt: new Date(base + i).toISOString(),
        updatedAt: new Date(base + i + 20).toISOString(),
        seq: i + 1,
      };
      await kv.put(await outboxRecordKey(id), encodeJson(record));
    }
  };
  await Promise.all(Array.from({ length: window }, worker));
}
