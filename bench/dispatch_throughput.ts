/**
 * Dispatcher throughput on the memory store versus raw `js.publish`, against a real JetStream.
 *
 * Usage: deno run -A tests/kit/run.ts deno run -A bench/dispatch_throughput.ts [count] [window]
 *
 * Prints messages per second for:
 * - raw js.publish, one at a time (await each PubAck: the reference's pattern),
 * - raw js.publish with `window` PubAcks in flight (the broker's practical ceiling here),
 * - OutboxDispatcher over MemoryOutboxRepository (claim, publish, batched marks, pipelined).
 *
 * @module
 */

import { headers } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "../mod.ts";
import { connectNats, createTestStream } from "../tests/kit/mod.ts";

const count = Number(Deno.args[0] ?? 20_000);
const window = Number(Deno.args[1] ?? 100);
const nc = await connectNats();
const js = jetstream(nc);
const payload = JSON.stringify({ orderId: 42, note: "x".repeat(100) });

async function timed(label: string, n: number, run: () => Promise<void>): Promise<void> {
  const start = performance.now();
  await run();
  const seconds = (performance.now() - start) / 1000;
  console.log(`${label.padEnd(58)} ${Math.round(n / seconds).toString().padStart(7)} msg/s`);
}

function publishOne(prefix: string, i: number, tag: string) {
  const h = headers();
  h.set("X-Test", "v");
  return js.publish(`${prefix}.e${i % 4}`, payload, { msgID: `${tag}-${i}`, headers: h });
}

try {
  console.log(`${count} messages, window ${window}, NATS ${nc.getServer()}`);
  {
    await using stream = await createTestStream(nc);
    const n = Math.min(count, 5_000);
    await timed(`raw js.publish, sequential (${n})`, n, async () => {
      for (let i = 0; i < n; i++) await publishOne(stream.prefix, i, "seq");
    });
  }
  {
    await using stream = await createTestStream(nc);
    await timed(`raw js.publish, ${window} in flight`, count, async () => {
      let next = 0;
      const worker = async () => {
        while (next < count) await publishOne(stream.prefix, next++, "win");
      };
      await Promise.all(Array.from({ length: window }, worker));
    });
  }
  for (const limit of [100, 250]) {
    await using stream = await createTestStream(nc);
    const outbox = new MemoryOutboxRepository();
    await outbox.enqueueMany(
      Array.from({ length: count }, (_, i) => ({
        id: `disp-${limit}-${i}`,
        kind: "event.publish" as const,
        name: "bench",
        subject: `${stream.prefix}.e${i % 4}`,
        payload,
        headers: { "X-Test": "v" },
      })),
    );
    await timed(
      `OutboxDispatcher, memory store, limit ${limit}, window ${window}`,
      count,
      async () => {
        const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(js), {
          limit,
          maxInFlight: window,
          idleRetryMs: false,
        });
        await dispatcher.whenIdle();
        await dispatcher.stop();
      },
    );
    const stats = await outbox.stats();
    if (stats.dispatched !== count) throw new Error(`only ${stats.dispatched} dispatched`);
  }
} finally {
  await nc.close();
}
