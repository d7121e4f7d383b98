/**
 * Scenarios (a) and (p): raw JetStream publishing with no store. `count` messages (the same
 * payloads, subjects and `Nats-Msg-Id`s as the outbox scenarios), at most `window` PubAcks
 * awaited at once, published with `js.publish` (a) or with the library's `PubAckPipeline` (p,
 * the ceiling for the dispatcher: one reply subscription, no per-message request machinery,
 * headers and payload encoded as `createJetStreamRuntime` encodes them).
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
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
  /** `js.publish` (a) or `pipeline` (p). @default {"js.publish"} */
  publisher?: "js.publish" | "pipeline";
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
  const { seconds, cpuSeconds, mainThreadCpuSeconds } = await timed(async () => {
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
