import { testConformance } from "./conformance/deno.ts";
import { openKvFixture } from "./nats_kv_fixture.ts";

testConformance({
  name: "nats kv",
  canCorrupt: true,
  async open() {
    const fixture = await openKvFixture();
    return {
      outbox: fixture.outbox(),
      inbox: fixture.inbox(),
      peers: [{
        outbox: fixture.outbox({ kv: fixture.peerKv }),
        inbox: fixture.inbox({ kv: fixture.peerInboxKv }),
      }],
      corrupt: (id) => fixture.corrupt(id),
      close: () => fixture.close(),
    };
  },
});
