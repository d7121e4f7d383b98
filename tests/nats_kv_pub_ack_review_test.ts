/**
 * Review of the PubAck read from its bytes (`plainAckSeq`, `src/stores/nats_kv/kv_requests.ts`)
 * against the server under test: the usual acknowledgement of a KV write must take the byte
 * path on every server line (nats-server 2.9 and 2.10 write `{"stream":"KV_x", "seq":1}`, with
 * a space; 2.11+ without), and an error or duplicate acknowledgement must never.
 */

import assert from "node:assert/strict";
import { jetstream } from "@nats-io/jetstream";
import { headers } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { plainAckSeq } from "../src/stores/nats_kv/kv_requests.ts";
import { connectNats, uniqueName } from "./kit/mod.ts";

Deno.test("pub ack review: the server's own PubAck of a KV write is read from its bytes", async () => {
  const nc = await connectNats();
  const name = uniqueName("ack");
  const kv = await new Kvm(jetstream(nc)).create(name, { history: 1 });
  const decoder = new TextDecoder();
  try {
    const send = async (h?: Record<string, string>) => {
      const hdrs = headers();
      for (const [k, v] of Object.entries(h ?? {})) hdrs.set(k, v);
      const reply = await nc.request(`$KV.${name}.a`, new Uint8Array([1]), {
        headers: hdrs,
        timeout: 5_000,
      });
      return { data: reply.data, json: JSON.parse(decoder.decode(reply.data)) };
    };
    const first = await send({ "Nats-Msg-Id": "m1" });
    assert.equal(plainAckSeq(first.data), first.json.seq, decoder.decode(first.data));
    const second = await send();
    assert.equal(plainAckSeq(second.data), second.json.seq, decoder.decode(second.data));
    // Never a sequence for an error (a failed CAS) or a duplicate.
    const cas = await send({ "Nats-Expected-Last-Subject-Sequence": String(first.json.seq) });
    assert.equal(cas.json.error?.err_code, 10071);
    assert.equal(plainAckSeq(cas.data), undefined);
    const duplicate = await send({ "Nats-Msg-Id": "m1" });
    assert.equal(duplicate.json.duplicate, true);
    assert.equal(plainAckSeq(duplicate.data), undefined);
  } finally {
    await kv.destroy().catch(() => {});
    await nc.close();
  }
});
