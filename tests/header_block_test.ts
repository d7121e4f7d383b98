/**
 * The runtime's header block (`src/runtime/header_block.ts`) against nats.js's own `headers()`:
 * for any headers, the same bytes or the same error; and, through a real nats-server, the same
 * headers on the stored message from the pipeline publisher as from `js.publish`.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/nats-core";
import { createJetStreamRuntime, type PreparedEvent } from "../mod.ts";
import { headerBlock, type HeaderEntry, natsHeaderMap } from "../src/runtime/header_block.ts";
import { connectNats, createTestStream } from "./kit/mod.ts";

type Outcome = { bytes: string } | { error: string };

function outcome(build: () => { encode(): Uint8Array }): Outcome {
  try {
    return { bytes: Array.from(build().encode()).join(",") };
  } catch (error) {
    return { error: `${(error as Error).name}: ${(error as Error).message}` };
  }
}

function viaNats(entries: readonly HeaderEntry[]): Outcome {
  return outcome(() => {
    const h = natsHeaders();
    for (const [name, value] of entries) h.set(name, value);
    return h as unknown as { encode(): Uint8Array };
  });
}

function viaBlock(entries: readonly HeaderEntry[]): Outcome {
  return outcome(() => headerBlock(entries) as { encode(): Uint8Array });
}

const tokenChar = fc.integer({ min: 33, max: 126 }).filter((c) => c !== 58).map((c) =>
  String.fromCharCode(c)
);
const name = fc.oneof(
  fc.constantFrom("Nats-Msg-Id", "traceparent", "X-Custom", "x-custom", "Trellis-Event-Time"),
  fc.string({ unit: tokenChar, minLength: 1, maxLength: 12 }),
  // Names nats.js refuses or treats specially: empty, a colon, a space, a control or
  // non-ASCII character.
  fc.constantFrom("", "a:b", "a b", "tab\there", "naïve", "line\nbreak"),
);
const value = fc.oneof(
  fc.string({ maxLength: 20 }),
  fc.string({ unit: "grapheme", maxLength: 8 }),
  fc.constantFrom("  padded  ", "\tx\t", "a\r\nb", "cr\r", "lf\n", "", " ", "\u00a0nbsp\u00a0"),
  // Stored headers written behind the validator's back can hold anything.
  fc.constantFrom(7, null, true) as fc.Arbitrary<unknown> as fc.Arbitrary<string>,
);
const entries = fc.array(fc.tuple(name, value), { maxLength: 6 }) as fc.Arbitrary<
  HeaderEntry[]
>;

Deno.test("headerBlock: the same bytes as nats.js's headers(), or the same error", () => {
  fc.assert(
    fc.property(entries, (list) => {
      const all: HeaderEntry[] = [["Nats-Msg-Id", "msg-1"], ...list];
      assert.deepEqual(viaBlock(all), viaNats(all));
    }),
    { numRuns: 2_000 },
  );
});

Deno.test("headerBlock: plain headers skip nats.js's header map; the others go through it", () => {
  const plain = headerBlock([["Nats-Msg-Id", "a"], ["traceparent", "00-ab-cd-01"]]);
  assert.equal(plain.constructor.name, "EncodedHeaderBlock");
  assert.equal(
    String(plain),
    "NATS/1.0\r\nNats-Msg-Id: a\r\ntraceparent: 00-ab-cd-01\r\n\r\n",
  );
  // A name given twice: nats.js's `set` keeps the last value only.
  const twice = headerBlock([["Nats-Msg-Id", "a"], ["X", "1"], ["X", "2"]]);
  assert.notEqual(twice.constructor.name, "EncodedHeaderBlock");
  assert.deepEqual(viaBlock([["X", "1"], ["X", "2"]]), viaNats([["X", "1"], ["X", "2"]]));
  assert.throws(() => headerBlock([["Nats-Msg-Id", "a"], ["X", "a\nb"]]), /\\r or \\n/);
  assert.throws(() => headerBlock([["Nats-Msg-Id", "a"], ["a:b", "x"]]), /not a valid character/);
  assert.deepEqual(natsHeaderMap([["A", " v "]]).toString(), "NATS/1.0\r\nA: v\r\n\r\n");
});

Deno.test("headerBlock: the pipeline stores the same headers as js.publish", async () => {
  const nc = await connectNats();
  try {
    const jsm = await jetstreamManager(nc);
    await using stream = await createTestStream(nc);
    const headers = {
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      "X-Padded": "  kept trimmed  ",
      "X-Unicode": "grüße ✓",
      "x-lower": "1",
    };
    const send = async (publisher: "pipeline" | "js.publish", id: string) => {
      const runtime = createJetStreamRuntime(jetstream(nc), { publisher });
      const event = {
        event: "test.event",
        header: { id, time: new Date().toISOString() },
        subject: `${stream.prefix}.${publisher === "pipeline" ? "p" : "j"}`,
        payload: { id },
        encodedPayload: JSON.stringify({ id, text: "grüße" }),
        headers,
      } as unknown as PreparedEvent;
      const receipt = await runtime.publishPreparedEvent(event);
      return await jsm.streams.getMessage(stream.name, { seq: receipt.seq! });
    };
    const viaPipeline = await send("pipeline", "hb-1");
    const viaJs = await send("js.publish", "hb-2");
    const shape = (m: Awaited<ReturnType<typeof send>>) => ({
      headers: [...m!.header!.keys()].map((k) => [
        k,
        m!.header!.values(k).map((v) => v.replace(/^hb-\d$/, "hb")),
      ]),
      data: new TextDecoder().decode(m!.data).replace(/hb-\d/, "hb"),
    });
    const pipelined = shape(viaPipeline);
    assert.deepEqual(pipelined, shape(viaJs));
    assert.deepEqual(pipelined.headers[0], ["Nats-Msg-Id", ["hb"]]);
    assert.equal(viaPipeline!.header!.get("Nats-Msg-Id"), "hb-1");
    assert.deepEqual(
      pipelined.headers.find(([k]) => k === "X-Padded"),
      ["X-Padded", ["kept trimmed"]],
    );
  } finally {
    await nc.close();
  }
});
