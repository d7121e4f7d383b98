import { MemoryInboxRepository, MemoryOutboxRepository } from "../mod.ts";
import { testConformance } from "./conformance/deno.ts";

testConformance({
  name: "memory",
  canCorrupt: false,
  open() {
    const outbox = new MemoryOutboxRepository();
    const inbox = new MemoryInboxRepository();
    return Promise.resolve({ outbox, inbox, close: () => Promise.resolve() });
  },
});
