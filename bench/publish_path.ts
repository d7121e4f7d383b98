/**
 * Client CPU per message of the runtime's publish path alone: `createJetStreamRuntime`'s
 * `publishPreparedEvent` through its `PubAckPipeline`, 256 in flight, over a stand-in connection
 * that does with each message what nats.js's `publish` does with it before the socket (encodes
 * the header block and, when given as text, the payload) and answers every publish with a plain
 * PubAck from a callback a timer later, as the reply subscription does. No broker, no store and
 * no socket, so the figure is repeatable where `bench:throughput`'s vary by ±10% on a shared
 * machine; nats.js's own framing, socket writes and reply parsing are not in it.
 *
 * Usage: `deno run -A bench/publish_path.ts [--count=200000] [--baseline=DIR]`, where DIR is a
 * checkout of another version (`git archive <rev> | tar -x -C DIR`, then `deno install` in it):
 * both run in turn, each in its own process, 5 rounds after a warm-up; the median is printed.
 *
 * @module
 */

import process from "node:process";

const args = new Map(
  Deno.args.filter((a) => a.startsWith("--")).map((a) => {
    const [k, v = "true"] = a.slice(2).split("=");
    return [k, v] as const;
  }),
);
const count = Number(args.get("count") ?? 200_000);
const window = 256;

if (args.has("measure")) {
  console.log(JSON.stringify(await measure(args.get("measure")!, count)));
  Deno.exit(0);
}

const here = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const roots = [here, ...(args.has("baseline") ? [args.get("baseline")!] : [])];
for (const root of roots) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL(import.meta.url).pathname, `--measure=${root}`, `--count=${count}`],
    cwd: root,
    stdout: "piped",
  });
  const { stdout, success } = await child.output();
  if (!success) throw new Error(`the measurement of ${root} failed`);
  const result = JSON.parse(new TextDecoder().decode(stdout).trim().split("\n").pop()!);
  console.log(
    `${root === here ? "this checkout" : root}: ${result.median.toFixed(2)} µs CPU/msg (min ${
      result.min.toFixed(2)
    }, max ${result.max.toFixed(2)}; ${count} messages x 5 rounds)`,
  );
}

async function measure(
  root: string,
  n: number,
): Promise<{ median: number; min: number; max: number }> {
  const { createJetStreamRuntime } = await import(`file://${root}/mod.ts`);
  const encoder = new TextEncoder();
  let seq = 0;
  let callback:
    | ((error: Error | null, msg: { subject: string; data: Uint8Array }) => void)
    | undefined;
  const replies: string[] = [];
  let scheduled = false;
  const answer = () => {
    scheduled = false;
    for (const reply of replies.splice(0)) {
      callback!(null, {
        subject: reply,
        data: encoder.encode(`{"stream":"BENCH","seq":${++seq}}`),
      });
    }
  };
  const nc = {
    publish(
      _subject: string,
      payload: string | Uint8Array,
      options: { reply: string; headers: { encode(): Uint8Array } },
    ) {
      options.headers.encode();
      if (typeof payload === "string") encoder.encode(payload);
      replies.push(options.reply);
      if (!scheduled) {
        scheduled = true;
        setTimeout(answer, 0);
      }
    },
    subscribe(_subject: string, options: { callback: typeof callback }) {
      callback = options.callback;
      return { unsubscribe() {}, closed: new Promise(() => {}), isClosed: () => false };
    },
    isClosed: () => false,
    isDraining: () => false,
    closed: () => new Promise(() => {}),
  };
  const js = {
    publish: () => Promise.reject(new Error("not used")),
    jetstreamManager: () => new Promise(() => {}),
    getConnection: () => nc,
  };
  const runtime = createJetStreamRuntime(js, { pubAckWindow: window });
  const payload = JSON.stringify({ type: "order.created", orderId: 1, note: "x".repeat(150) });
  const events = Array.from({ length: 1_000 }, (_, i) => ({
    event: "order.created",
    subject: `bench.s${i % 16}`,
    header: { id: `bench-msg-${i}`, time: "2026-12-02T00:00:00.000Z" },
    payload: {},
    encodedPayload: payload,
    headers: {},
  }));
  const run = async (total: number) => {
    let next = 0;
    const worker = async () => {
      while (next < total) {
        await runtime.publishPreparedEvent(events[next++ % events.length], { timeoutMs: 5_000 });
      }
    };
    await Promise.all(Array.from({ length: window }, worker));
  };
  await run(50_000);
  const rounds: number[] = [];
  for (let round = 0; round < 5; round++) {
    const before = process.cpuUsage();
    await run(n);
    const used = process.cpuUsage(before);
    rounds.push((used.user + used.system) / n);
  }
  rounds.sort((a, b) => a - b);
  return { median: rounds[2], min: rounds[0], max: rounds[4] };
}
