/** The installed package's memory stores pass the conformance suite on Node. */

import { MemoryInboxRepository, MemoryOutboxRepository } from "@outbox/nats";
import { testConformance } from "./conformance.ts";

testConformance({
  name: "node memory",
  canCorrupt: false,
  open() {
    return Promise.resolve({
      outbox: new MemoryOutboxRepository(),
      inbox: new MemoryInboxRepository(),
      close: () => Promise.resolve(),
    });
  },
});
