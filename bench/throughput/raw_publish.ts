/**
 * Scenario (a): raw JetStream publishing, the broker-side limit. `count` messages (the same
 * payloads, subjects and `Nats-Msg-Id`s as the outbox scenarios) published with `js.publish`,
 * at most `window` PubAcks awaited at once.
 *
 * @module
 */

import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
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
}

if (import.meta.main) {
  const config = readConfig<RawPublishConfig>();
  const nc = await connect({ servers: config.natsUrl, noAsyncTraces: config.noAsyncTraces });
  const js = jetstream(nc);
  // Payloads are built before the clock starts, as the outbox scenarios read them from a store.
  const payloads = Array.from({ length: config.count }, (_, i) => payload(i));
  let next = 0;
  const { seconds, cpuSeconds } = await timed(async () => {
    const worker = async () => {
      while (next < config.count) {
        const i = next++;
        await js.publish(subject(config.prefix, i), payloads[i], { msgID: `${config.tag}-${i}` });
      }
    };
    await Promise.all(Array.from({ length: config.window }, worker));
  });
  await nc.close();
  report({ messages: config.count, seconds, cpuSeconds });
}
