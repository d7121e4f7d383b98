/**
 * NATS connections and JetStream streams for tests.
 *
 * @module
 */

import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type StreamConfig } from "@nats-io/jetstream";
import { natsUrl } from "./services.ts";
import { uniqueName } from "./names.ts";

/** Connects to the test NATS server (or `url`: comma-separated for a cluster's nodes). */
export async function connectNats(
  url?: string,
  options: Record<string, unknown> = {},
): Promise<NatsConnection> {
  return await connect({ servers: (url ?? await natsUrl()).split(","), ...options });
}

/** A stream with a unique name capturing `<prefix>.>`; deleted by `dispose`. */
export interface TestStream extends AsyncDisposable {
  name: string;
  /** The subject prefix: publish to `${prefix}.anything`. */
  prefix: string;
}

/** Creates a unique stream on `nc`'s server; remove it with `await using` or `[Symbol.asyncDispose]`. */
export async function createTestStream(
  nc: NatsConnection,
  config: Partial<StreamConfig> = {},
): Promise<TestStream> {
  const name = uniqueName("stream");
  const prefix = uniqueName("subj");
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name, subjects: [`${prefix}.>`], ...config });
  return {
    name,
    prefix,
    async [Symbol.asyncDispose]() {
      if (nc.isClosed()) return;
      await jsm.streams.delete(name).catch(() => {});
    },
  };
}
