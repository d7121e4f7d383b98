/**
 * The pipeline's PubAck reader (`src/runtime/plain_pub_ack.ts`) against `JSON.parse`: whatever
 * replies arrive, in any order, a reply it reads gives the stream and sequence `JSON.parse`
 * gives, and never for a reply with any other field (an error, `duplicate`, `domain`).
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { PlainPubAckReader } from "../src/runtime/plain_pub_ack.ts";

const encoder = new TextEncoder();

const streamName = fc.oneof(
  fc.constantFrom("ORDERS", "orders_2", "S", "ORDERS2"),
  fc.string({ minLength: 1, maxLength: 10 }),
  fc.string({ unit: "grapheme", minLength: 1, maxLength: 4 }),
);
const seq = fc.oneof(
  fc.nat({ max: 1_000 }),
  fc.constantFrom(0, 1, 9, 10, 99_999_999_999_999, 999_999_999_999_999, 2 ** 53 - 1, 2 ** 53),
);
const reply = fc.oneof(
  // The usual shapes, with the spacing nats-server versions use.
  fc.tuple(streamName, seq, fc.constantFrom("", " ")).map(([stream, n, space]) =>
    `{"stream":${JSON.stringify(stream)},${space}"seq":${n}}`
  ),
  fc.tuple(streamName, seq).map(([stream, n]) =>
    `{"stream":${JSON.stringify(stream)},"seq":${n},"duplicate":true}`
  ),
  fc.tuple(streamName, seq).map(([stream, n]) =>
    `{"stream":${JSON.stringify(stream)},"seq":${n},"domain":"hub"}`
  ),
  fc.tuple(streamName, seq).map(([stream, n]) => `{"seq":${n},"stream":${JSON.stringify(stream)}}`),
  fc.tuple(streamName, seq).map(([stream, n]) =>
    `{"stream":${JSON.stringify(stream)},"seq":${n} }`
  ),
  fc.constant('{"error":{"code":503,"err_code":10077,"description":"no suitable peers"}}'),
  fc.constant('{"stream":"ORDERS","seq":0012}'),
  fc.constant('{"stream":"ORDERS","seq":12.5}'),
  fc.constant('{"stream":"ORDERS","seq":-3}'),
  fc.constant('{"stream":"ORDERS","seq":1e3}'),
  fc.constant('{"stream":"ORDERS","seq":}'),
  fc.constant(""),
);

/** What the pipeline's slow path resolves with for `text`, or `undefined`. */
function parsed(text: string): { stream: string; seq: number; plain: boolean } | undefined {
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (body === null || typeof body !== "object" || body.error !== undefined) return undefined;
  if (typeof body.stream !== "string" || typeof body.seq !== "number") return undefined;
  const keys = Object.keys(body);
  return {
    stream: body.stream,
    seq: body.seq,
    plain: keys.length === 2 && keys[0] === "stream" && keys[1] === "seq",
  };
}

Deno.test("PlainPubAckReader: reads only plain PubAcks, with JSON.parse's stream and sequence", () => {
  fc.assert(
    fc.property(fc.array(reply, { minLength: 1, maxLength: 30 }), (texts) => {
      const reader = new PlainPubAckReader();
      for (const text of texts) {
        const data = encoder.encode(text);
        const read = reader.read(data);
        const expected = parsed(text);
        if (read !== undefined) {
          assert.ok(expected?.plain, `read ${text}`);
          assert.deepEqual(read, { stream: expected.stream, seq: expected.seq });
          assert.ok(Number.isSafeInteger(read.seq));
        } else if (expected !== undefined) {
          // The slow path: the pipeline then lets the reader learn the reply.
          reader.learn(data, JSON.parse(text));
        }
      }
    }),
    { numRuns: 3_000 },
  );
});

Deno.test("PlainPubAckReader: after one plain PubAck, the next of that stream is read from its bytes", () => {
  const reader = new PlainPubAckReader();
  const first = encoder.encode('{"stream":"ORDERS", "seq":41}');
  assert.equal(reader.read(first), undefined);
  reader.learn(first, JSON.parse('{"stream":"ORDERS", "seq":41}'));
  assert.deepEqual(reader.read(encoder.encode('{"stream":"ORDERS", "seq":42}')), {
    stream: "ORDERS",
    seq: 42,
  });
  // Another stream, spacing, a duplicate: JSON.parse's.
  assert.equal(reader.read(encoder.encode('{"stream":"ORDERS2", "seq":42}')), undefined);
  assert.equal(reader.read(encoder.encode('{"stream":"ORDERS","seq":42}')), undefined);
  assert.equal(
    reader.read(encoder.encode('{"stream":"ORDERS", "seq":42,"duplicate":true}')),
    undefined,
  );
});
