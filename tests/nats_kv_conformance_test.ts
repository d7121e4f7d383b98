import { testConformance } from "./conformance/deno.ts";
import { openKvFixture } from "./nats_kv_fixture.ts";

// Both ways of writing markers: without copies of their records (the default) and with them
// (`markerCopies`: claims compare-and-set the record from the marker's copy without reading it).
for (const markerCopies of [false, true]) {
  testConformance({
    name: markerCopies ? "nats kv (marker copies)" : "nats kv",
    canCorrupt: true,
    async open() {
      const fixture = await openKvFixture({ markerCopies });
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
}
