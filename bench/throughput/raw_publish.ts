/**
 * Scenarios (a) and (p): raw JetStream publishing with no store. `count` messages (the same
 * payloads, subjects and `Nats-Msg-Id`s as the outbox scenarios), at most `window` PubAcks
 * awaited at once, published with `js.publish` (a) or with the library's `PubAckPipeline` (p,
 * the ceiling for the dispatcher: one reply subscription, no per-message request machinery,
 * headers and payload encoded as `createJetStreamRuntime` encodes them).
 *
 * Also (fi): nats-server 2.14+'s fast-ingest batches (`startFastIngest` from nats.js, a stream
 * with `allow_batched`), for comparison only: the server acknowledges progress every
 * `ackInterval` messages instead of each message, and a batch that loses a message is aborted
 * (`allowGaps: false`). Batches of `batchSize` messages, one after the other.
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
import { startFastIngest } from "@nats-io/jetstream/internal";
import { connect } from "@nats-io/transport-node";
import { PubAckPipeline } from "../../mod.ts";
import { encodeText } from "../../src/core/slab_encoder.ts";
import { headerBlock } from "../../src/runtime/header_block.ts";
import { payload, subject } from "../support/records.ts";
import { readConfig, report, timed } from "./child.ts";

/** Configuration of the raw publish scenario. */
export interface RawPublishConfig {
  natsUrl: string;
  /** nats.js `noAsyncTraces` connection option (no stack captured per request). */
  noAsyncTraces?: boolean;
  prefix: string;
  tag: string;
  count: number;
  window: number;
  /** `js.publish` (a), `pipeline` (p) or `fast-ingest` (fi). @default {"js.publish"} */
  publisher?: "js.publish" | "pipeline" | "fast-ingest";
  /** fast-ingest: messages per batch. @default {1000} */
  batchSize?: number;
  /** fast-ingest: the `ackInterval` asked of the server (it may change it). @default {10} */
  ackInterval?: number;
}

/** Sends messages `from` to `to - 1` as one fast-ingest batch and waits for its final ack. */
async function fastIngestBatch(
  nc: Parameters<typeof startFastIngest>[0],
  config: RawPublishConfig,
  payloads: readonly string[],
  from: number,
  to: number,
): Promise<void> {
  const msgID = (i: number) => `${config.tag}-${i}`;
  const batch = await startFastIngest(nc, subject(config.prefix, from), payloads[from], {
    allowGaps: false,
    ackInterval: config.ackInterval ?? 10,
    msgID: msgID(from),
  });
  for (let i = from + 1; i < to - 1; i++) {
    await batch.add(subject(config.prefix, i), payloads[i], { msgID: msgID(i) });
  }
  if (to - 1 > from) {
    await batch.last(subject(config.prefix, to - 1), payloads[to - 1], { msgID: msgID(to - 1) });
  } else {
    await batch.end();
  }
}

if (import.meta.main) {
  const config = readConfig<RawPublishConfig>();
  const nc = await connect({ servers: config.natsUrl, noAsyncTraces: config.noAsyncTraces });
  const js = jetstream(nc);
  const pipeline = new PubAckPipeline(nc, { window: config.window });
  const publish = config.publisher === "pipeline"
    // As createJetStreamRuntime sends through it: header block and payload encoded into the
    // shared slab (src/runtime/header_block.ts), not through nats.js's header map.
    ? (subject: string, payload: string, id: string) =>
      pipeline.publish(subject, encodeText(payload), headerBlock([["Nats-Msg-Id", id]]), 5_000)
    : (subject: string, payload: string, id: string) => js.publish(subject, payload, { msgID: id });
  // Payloads are built before the clock starts, as the outbox scenarios read them from a store.
  const payloads = Array.from({ length: config.count }, (_, i) => payload(i));
  let next = 0;
  const batchSize = config.batchSize ?? 1_000;
  const { seconds, cpuSeconds, mainThreadCpuSeconds } = await timed(async () => {
    if (config.publisher === "fast-ingest") {
      for (let from = 0; from < config.count; from += batchSize) {
        await fastIngestBatch(nc, config, payloads, from, Math.min(config.count, from + batchSize));
      }
      return;
    }
    const worker = async () => {
      while (next < config.count) {
        const i = next++;
        await publish(subject(config.prefix, i), payloads[i], `${config.tag}-${i}`);
      }
    };
    await Promise.all(Array.from({ length: config.window }, worker));
  });
  await nc.close();
  report({ messages: config.count, seconds, cpuSeconds, mainThreadCpuSeconds });
}
