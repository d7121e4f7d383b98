/**
 * The installed package's NATS KV stores pass the conformance suite on Node: unique buckets on
 * the test server, repositories on two connections, corruption written straight into the bucket.
 */

import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import {
  createInboxBucket,
  createOutboxBucket,
  NatsKvInboxRepository,
  NatsKvOutboxRepository,
} from "@outbox/nats";
import type { ConformanceFixture } from "../conformance/cases.ts";
import { testConformance } from "./conformance.ts";
import { natsUrl, uniqueName } from "./servers.ts";

/** The documented record key of a short id: `m.b` + base64url(UTF-8 id). */
function recordKey(id: string): string {
  return `m.b${Buffer.from(id, "utf8").toString("base64url")}`;
}

testConformance({
  name: "node nats kv",
  canCorrupt: true,
  async open(): Promise<ConformanceFixture> {
    const nc = await connect({ servers: natsUrl() });
    const peerNc = await connect({ servers: natsUrl() });
    const outboxBucket = uniqueName("node_kvo");
    const inboxBucket = uniqueName("node_kvi");
    const kv = await createOutboxBucket(new Kvm(nc), outboxBucket);
    const inboxKv = await createInboxBucket(new Kvm(nc), inboxBucket, { retentionMs: 0 });
    const peerKv = await new Kvm(peerNc).open(outboxBucket);
    const peerInboxKv = await new Kvm(peerNc).open(inboxBucket);
    const outbox = new NatsKvOutboxRepository(kv);
    const peerOutbox = new NatsKvOutboxRepository(peerKv);
    return {
      outbox,
      inbox: new NatsKvInboxRepository(inboxKv),
      peers: [{ outbox: peerOutbox, inbox: new NatsKvInboxRepository(peerInboxKv) }],
      async corrupt(id) {
        await kv.put(recordKey(id), "{not json");
      },
      async close() {
        await Promise.all([outbox.close(), peerOutbox.close()]);
        await kv.destroy().catch(() => {});
        await inboxKv.destroy().catch(() => {});
        await peerNc.close();
        await nc.close();
      },
    };
  },
});
