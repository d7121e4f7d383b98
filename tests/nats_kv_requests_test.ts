/**
 * The pipelined KV operations of the NATS KV stores (`src/stores/nats_kv/kv_requests.ts`)
 * against a real server: every outcome (value, revision shape, error class, code, message and
 * cause chain) is compared with the same operation through the bucket's own method, and the
 * transport failures (timeout, late reply, closed connection, reconnect) are exercised on a
 * private server.
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { headers, Match, type MsgHdrs } from "@nats-io/nats-core";
import { MsgHdrsImpl } from "@nats-io/nats-core/internal";
import { Base64KeyCodec, Bucket, type KV, type KvCodecs, Kvm, NoopKvCodecs } from "@nats-io/kv";
import fc from "fast-check";
import { JetStreamClientImpl } from "@nats-io/jetstream/internal";
import type { NatsConnection } from "@nats-io/transport-node";
import { KvRequests, plainAckSeq } from "../src/stores/nats_kv/kv_requests.ts";
import { encodeText } from "../src/core/slab_encoder.ts";
import { ApiStoredMessage } from "../src/stores/nats_kv/stored_messages.ts";
import { countingKv, newCounts } from "./nats_kv_fixture.ts";
import { connectNats, eventually, NatsServer, sleep, uniqueName } from "./kit/mod.ts";

interface Outcome {
  value?: unknown;
  error?: { names: string[]; message: string; code?: unknown };
}

/** What `run` resolved with, or the error's class names down its cause chain, message and code. */
async function outcome(run: () => Promise<unknown>): Promise<Outcome> {
  try {
    return { value: await run() };
  } catch (error) {
    const names: string[] = [];
    for (let e = error as Error | undefined; e instanceof Error; e = e.cause as Error) {
      names.push(`${e.constructor.name}/${e.name}`);
    }
    const e = error as Error & { code?: unknown };
    return { error: { names, message: e.message, code: e.code } };
  }
}

/** An entry as the stores read it (`created` and `revision` included). */
function entryShape(entry: Awaited<ReturnType<KV["get"]>>) {
  if (entry === null) return null;
  return {
    key: entry.key,
    bucket: entry.bucket,
    operation: entry.operation,
    value: [...entry.value],
    revision: entry.revision,
    created: entry.created.toISOString(),
    length: entry.length,
  };
}

async function withBucket(
  run: (kv: KV, requests: KvRequests, nc: NatsConnection) => Promise<void>,
  options: { allowDirect?: boolean; timeoutMs?: number; codec?: KvCodecs } = {},
): Promise<void> {
  const nc = await connectNats();
  const kv = await new Kvm(jetstream(nc, { timeout: options.timeoutMs ?? 5_000 })).create(
    uniqueName("kvr"),
    {
      history: 1,
      allow_direct: options.allowDirect ?? true,
      ...(options.codec ? { codec: options.codec } : {}),
    },
  );
  try {
    await run(kv, new KvRequests(kv), nc);
  } finally {
    await kv.destroy().catch(() => {});
    await nc.close();
  }
}

Deno.test("kv requests: a plain Bucket is pipelined; wrappers and other KV objects use their own methods", async () => {
  await withBucket(async (kv) => {
    assert.equal(new KvRequests(kv).pipelined, true);
    const counts = newCounts();
    const counted = new KvRequests(countingKv(kv, counts));
    assert.equal(counted.pipelined, false);
    const revision = await counted.put("a", "1");
    await counted.update("a", "2", revision);
    await counted.create("b", "3");
    await counted.delete("b");
    assert.equal((await counted.get("a"))?.string(), "2");
    assert.deepEqual(counts.calls, { put: 1, update: 1, create: 1, delete: 1, get: 1 });
  });
  // Any KV-shaped object: its own methods, nothing else touched.
  const calls: string[] = [];
  const fake = {
    get: (key: string) => (calls.push(`get ${key}`), Promise.resolve(null)),
    put: (key: string) => (calls.push(`put ${key}`), Promise.resolve(7)),
    update: (
      key: string,
      _v: unknown,
      r: number,
    ) => (calls.push(`update ${key} ${r}`), Promise.resolve(8)),
    create: (key: string) => (calls.push(`create ${key}`), Promise.resolve(9)),
    delete: (key: string) => (calls.push(`delete ${key}`), Promise.resolve()),
  } as unknown as KV;
  const requests = new KvRequests(fake);
  assert.equal(requests.pipelined, false);
  assert.equal(await requests.get("k"), null);
  assert.equal(await requests.put("k", "v"), 7);
  assert.equal(await requests.update("k", "v", 0), 8, "the object's own checks, not the Bucket's");
  assert.equal(await requests.create("k", "v"), 9);
  await requests.delete("k");
  assert.deepEqual(calls, ["get k", "put k", "update k 0", "create k", "delete k"]);
});

Deno.test("kv requests: a bucket whose JetStream client or API has its methods replaced (instrumentation) keeps its own path", async () => {
  const nc = await connectNats();
  const js = jetstream(nc);
  // What a tracing wrapper does: every KV write through js.publish carries its header.
  const publish = js.publish.bind(js);
  js.publish = (subject, data, options) => {
    const h = options?.headers ?? headers();
    h.set("X-Traced", "1");
    return publish(subject, data, { ...options, headers: h });
  };
  const kv = await new Kvm(js).create(uniqueName("kvr"), { history: 1, allow_direct: true });
  const stream = (await kv.status()).streamInfo.config.name;
  try {
    const requests = new KvRequests(kv);
    assert.equal(requests.pipelined, false, "js.publish is not the client's own");
    const revision = await requests.put("a", "1");
    const stored = await (await jetstreamManager(nc)).streams.getMessage(stream, { seq: revision });
    assert.equal(stored?.header.get("X-Traced"), "1", "the write went through the wrapper");
    // The managers' APIs the gets bypass: a replaced getMessage keeps the bucket's own get.
    const direct = (kv as unknown as { jsm: { direct: { getMessage: unknown } } }).jsm.direct;
    const plain = new Kvm(nc).create(uniqueName("kvr"), { history: 1, allow_direct: true });
    const other = await plain;
    try {
      const otherDirect = (other as unknown as { jsm: { direct: { getMessage: unknown } } }).jsm
        .direct;
      assert.equal(new KvRequests(other).pipelined, true);
      otherDirect.getMessage = direct.getMessage;
      assert.equal(new KvRequests(other).pipelined, false, "direct.getMessage replaced");
    } finally {
      await other.destroy().catch(() => {});
    }
  } finally {
    await kv.destroy().catch(() => {});
    await nc.close();
  }
});

Deno.test("kv requests: classes whose methods are not the tested @nats-io 3.4.0 ones (another version) keep their own path", async () => {
  await withBucket((kv) => {
    assert.equal(new KvRequests(kv).pipelined, true);
    // A release changing what a write or get does (here simulated on the prototypes, as an npm
    // caret range deduplicating to a newer @nats-io/kv or @nats-io/jetstream would ship it):
    // the pipelined path reproduces 3.4.0's steps, so it must not stand in for other ones.
    const targets: [object, string][] = [
      [Bucket.prototype, "_put"],
      [Bucket.prototype, "get"],
      [JetStreamClientImpl.prototype, "_publish"],
      [
        Object.getPrototypeOf((kv as unknown as { jsm: { direct: object } }).jsm.direct),
        "getMessage",
      ],
    ];
    for (const [target, name] of targets) {
      const original = (target as Record<string, unknown>)[name] as (...args: unknown[]) => unknown;
      Object.defineProperty(target, name, {
        value: function (this: unknown, ...args: unknown[]) {
          return original.apply(this, args); // another version's body
        },
        configurable: true,
        writable: true,
      });
      try {
        assert.equal(new KvRequests(kv).pipelined, false, name);
      } finally {
        Object.defineProperty(target, name, {
          value: original,
          configurable: true,
          writable: true,
        });
      }
      assert.equal(new KvRequests(kv).pipelined, true, `${name} restored`);
    }
    return Promise.resolve();
  });
});

/** Runs `scenario` once through the bucket's methods and once pipelined, on twin keys. */
async function compare(
  kv: KV,
  requests: KvRequests,
  scenario: (ops: Ops, key: string) => Promise<unknown>,
): Promise<void> {
  const own: Ops = {
    get: (k) => kv.get(k),
    put: (k, v) => kv.put(k, v),
    update: (k, v, r) => kv.update(k, v, r),
    create: (k, v) => kv.create(k, v),
    delete: (k, o) => kv.delete(k, o),
  };
  const name = uniqueName("k").replaceAll("-", "_");
  const expected = await outcome(() => scenario(own, `own.${name}`));
  const actual = await outcome(() => scenario(requests, `pipe.${name}`));
  assert.deepEqual(normalise(actual), normalise(expected));
}

interface Ops {
  get(key: string): Promise<Awaited<ReturnType<KV["get"]>>>;
  put(key: string, value: Uint8Array | string): Promise<number>;
  update(key: string, value: Uint8Array | string, revision: number): Promise<number>;
  create(key: string, value: Uint8Array | string): Promise<number>;
  delete(key: string, options?: { previousSeq?: number }): Promise<void>;
}

/** Keys and revisions differ between the twins (`own.` / `pipe.` keys written in turn). */
function normalise(o: Outcome): unknown {
  return JSON.parse(
    JSON.stringify(o).replaceAll(/(own|pipe)\.k_/g, "K_").replaceAll(
      /"(revision|created)":("[^"]*"|\d+)/g,
      '"$1":"x"',
    ).replaceAll(/wrong last sequence: \d+/g, "wrong last sequence: N"),
  );
}

for (const allowDirect of [true, false]) {
  Deno.test(`kv requests: every outcome is the bucket's own (CAS, create over tombstones, gets, errors), ${allowDirect ? "direct gets" : "STREAM.MSG.GET"}`, async () => {
    await withBucket(async (kv, requests) => {
      assert.equal(requests.pipelined, true);
      const scenarios: Record<string, (ops: Ops, key: string) => Promise<unknown>> = {
        "put, get": async (ops, key) => {
          const revision = await ops.put(key, "one");
          const entry = entryShape(await ops.get(key));
          assert.equal(entry?.revision, revision);
          return entry;
        },
        "update with the right revision": async (ops, key) => {
          const revision = await ops.put(key, "one");
          const next = await ops.update(key, new Uint8Array([1, 2, 3]), revision);
          assert.ok(next > revision);
          return entryShape(await ops.get(key));
        },
        "update with a stale revision: wrong last sequence": async (ops, key) => {
          const revision = await ops.put(key, "one");
          await ops.put(key, "two");
          return await ops.update(key, "three", revision);
        },
        "update of a missing key": (ops, key) => ops.update(key, "x", 5),
        "update with revision 0 throws at once": (ops, key) => {
          try {
            ops.update(key, "x", 0);
          } catch (error) {
            return Promise.resolve(`sync: ${(error as Error).message}`);
          }
          return Promise.resolve("no sync throw");
        },
        "create on an existing key": async (ops, key) => {
          await ops.create(key, "one");
          return await ops.create(key, "two");
        },
        "create over a DEL tombstone": async (ops, key) => {
          const revision = await ops.create(key, "one");
          await ops.delete(key, { previousSeq: revision });
          const deleted = entryShape(await ops.get(key));
          const again = await ops.create(key, "two");
          assert.ok(again > (deleted?.revision ?? Infinity));
          return [deleted, entryShape(await ops.get(key))];
        },
        "create over a PURGE tombstone": async (ops, key) => {
          await ops.put(key, "one");
          await kv.purge(key);
          const purged = entryShape(await ops.get(key));
          await ops.create(key, "two");
          return [purged, entryShape(await ops.get(key))];
        },
        "delete with a stale revision": async (ops, key) => {
          const revision = await ops.put(key, "one");
          await ops.put(key, "two");
          return await ops.delete(key, { previousSeq: revision });
        },
        "delete without revision, then update over the tombstone": async (ops, key) => {
          await ops.put(key, "one");
          await ops.delete(key);
          const deleted = await ops.get(key);
          return [entryShape(deleted), await ops.update(key, "x", deleted!.revision) > 0];
        },
        "get of a missing key": (ops, key) => ops.get(key),
        "invalid keys": async (ops, key) => {
          const results = [];
          for (const bad of [`${key}..x`, `.${key}`, `${key} x`, ""]) {
            results.push(await outcome(() => ops.put(bad, "v")));
            results.push(await outcome(() => ops.get(bad)));
            results.push(await outcome(() => ops.create(bad, "v")));
            results.push(await outcome(() => ops.delete(bad)));
          }
          return results;
        },
        "a large value (900 KiB)": async (ops, key) => {
          const value = new Uint8Array(900 * 1024).map((_, i) => i % 251);
          await ops.put(key, value);
          const entry = await ops.get(key);
          assert.deepEqual(entry?.value, value);
          return entry?.length;
        },
        "a value over max_payload": (ops, key) => ops.put(key, new Uint8Array(2 * 1024 * 1024)),
      };
      for (const [name, scenario] of Object.entries(scenarios)) {
        await compare(kv, requests, scenario).catch((error) => {
          throw new Error(`${name}: ${error.message}`, { cause: error });
        });
      }
    }, { allowDirect });
  });
}

Deno.test("kv requests: no responders (the stream is gone) fail as the bucket's own calls do", async () => {
  await withBucket(async (kv, requests) => {
    await kv.destroy();
    for (
      const [name, run] of [
        ["put", (ops: Ops) => ops.put("a", "1")],
        ["update", (ops: Ops) => ops.update("a", "1", 3)],
        ["create", (ops: Ops) => ops.create("a", "1")],
        ["delete", (ops: Ops) => ops.delete("a", { previousSeq: 2 })],
        ["get", (ops: Ops) => ops.get("a")],
      ] as const
    ) {
      const expected = await outcome(() => run(kv as unknown as Ops));
      const actual = await outcome(() => run(requests));
      assert.deepEqual(actual, expected, name);
      assert.ok(expected.error, `${name} fails`);
      console.log(name, JSON.stringify(expected.error));
    }
  }, { timeoutMs: 1_000 });
});

/** A bucket on a private server whose JetStream client times out after `timeoutMs`. */
async function privateBucket(server: NatsServer, timeoutMs: number) {
  const nc = await connectNats(server.url, { maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  const kv = await new Kvm(jetstream(nc, { timeout: timeoutMs })).create(uniqueName("kvr"), {
    history: 1,
    allow_direct: true,
  });
  return { nc, kv, requests: new KvRequests(kv) };
}

Deno.test("kv requests: a frozen server times out like the bucket; late replies are ignored", async () => {
  await using server = await NatsServer.start();
  const { nc, kv, requests } = await privateBucket(server, 400);
  try {
    assert.equal(requests.pipelined, true);
    await requests.put("a", "0");
    await nc.flush();
    server.pause();
    await sleep(100);
    const started = performance.now();
    const [own, piped, pipedGet, ownGet] = await Promise.all([
      outcome(() => kv.put("a", "1")),
      outcome(() => requests.put("a", "2")),
      outcome(() => requests.get("a")),
      outcome(() => kv.get("a")),
    ]);
    const elapsed = performance.now() - started;
    assert.deepEqual(piped, own);
    assert.deepEqual(pipedGet, ownGet);
    assert.deepEqual(own.error?.names, ["TimeoutError/TimeoutError"]);
    assert.ok(elapsed >= 350 && elapsed < 3_000, `timed out after ${elapsed} ms`);
    // The server answers the timed-out requests once resumed: those replies are dropped, and the
    // next requests get their own replies (the puts applied: the last one wins).
    server.resume();
    await eventually(async () => assert.equal((await requests.get("a"))?.string() !== "0", true));
    const entry = await requests.get("a");
    const next = await requests.update("a", "3", entry!.revision);
    assert.equal(next, entry!.revision + 1);
    assert.equal((await requests.get("a"))?.string(), "3");
  } finally {
    server.resume();
    await kv.destroy().catch(() => {});
    await nc.close();
  }
});

Deno.test("kv requests: a request in flight when the connection closes, and after", async () => {
  await using server = await NatsServer.start();
  const { nc, kv, requests } = await privateBucket(server, 5_000);
  const name = (await kv.status()).bucket;
  try {
    await requests.put("a", "0");
    await nc.flush();
    server.pause();
    await sleep(100);
    const own = outcome(() => kv.put("a", "1"));
    const piped = outcome(() => requests.put("a", "2"));
    const pipedGet = outcome(() => requests.get("a"));
    await sleep(50);
    await nc.close();
    const [ownResult, pipedResult, getResult] = await Promise.all([own, piped, pipedGet]);
    assert.deepEqual(pipedResult, ownResult);
    assert.deepEqual(getResult, ownResult);
    assert.equal(ownResult.error?.message, "connection closed");
    // Closed: rejected at once, as the bucket does.
    assert.deepEqual(
      await outcome(() => requests.update("a", "x", 1)),
      await outcome(() => kv.update("a", "x", 1)),
    );
    assert.deepEqual(
      (await outcome(() => requests.get("a"))).error?.names,
      ["ClosedConnectionError/ClosedConnectionError"],
    );
  } finally {
    server.resume();
    const cleanup = await connectNats(server.url);
    await new Kvm(cleanup).open(name).then((kv) => kv.destroy()).catch(() => {});
    await cleanup.close();
  }
});

Deno.test("kv requests: the reply subscription survives a server restart", async () => {
  await using server = await NatsServer.start();
  const { nc, kv, requests } = await privateBucket(server, 1_000);
  try {
    const revision = await requests.put("a", "0");
    await server.kill("SIGKILL");
    await server.restart();
    await eventually(() => requests.put("b", "1"), { timeoutMs: 20_000, intervalMs: 200 });
    assert.equal((await requests.get("a"))?.revision, revision);
    assert.equal(await requests.update("a", "1", revision) > revision, true);
    assert.equal((await requests.get("a"))?.string(), "1");
  } finally {
    await kv.destroy().catch(() => {});
    await nc.close();
  }
});

Deno.test("kv requests: a draining connection takes no new request, as the bucket's calls", async () => {
  const nc = await connectNats();
  const kv = await new Kvm(nc).create(uniqueName("kvr"), { history: 1, allow_direct: true });
  const name = (await kv.status()).bucket;
  const requests = new KvRequests(kv);
  try {
    const revision = await requests.put("a", "0");
    const drained = nc.drain();
    for (
      const run of [
        (ops: Ops) => ops.put("a", "1"),
        (ops: Ops) => ops.update("a", "1", revision),
        (ops: Ops) => ops.get("a"),
      ]
    ) {
      const expected = await outcome(() => run(kv as unknown as Ops));
      assert.deepEqual(await outcome(() => run(requests)), expected);
      assert.equal(expected.error?.names[0], "DrainingConnectionError/DrainingConnectionError");
    }
    await drained;
  } finally {
    const cleanup = await connectNats();
    await new Kvm(cleanup).open(name).then((kv) => kv.destroy()).catch(() => {});
    await cleanup.close();
  }
});

/** A connection kept across the next three tests, as a user's test module may keep one. */
let kept: { nc: NatsConnection; kv: KV; requests: KvRequests } | undefined;

Deno.test({
  name: "kv requests: (a connection kept across tests: open)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const nc = await connectNats();
    const kv = await new Kvm(nc).create(uniqueName("kvr"), { history: 1, allow_direct: true });
    kept = { nc, kv, requests: new KvRequests(kv) };
  },
});

Deno.test("kv requests: no timer outlives the requests it guards (a connection kept across tests)", async () => {
  // The op sanitizer reports a timer this test started and left pending; nc.request clears its
  // timer once its reply is in, so the bucket's own calls leave none.
  assert.ok(kept, "run with the test before it");
  const { requests } = kept;
  const revision = await requests.put("a", "1");
  await requests.update("a", "2", revision);
  await Promise.all([requests.get("a"), requests.create("b", "1"), requests.get("b")]);
});

Deno.test({
  name: "kv requests: (a connection kept across tests: close)",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    await kept?.kv.destroy().catch(() => {});
    await kept?.nc.close();
    kept = undefined;
  },
});

Deno.test("kv requests: a publish the server's permissions refuse fails as the bucket's own calls do", async () => {
  await using server = await NatsServer.start({
    config: [
      "authorization { users = [",
      "  { user: admin, password: a }",
      '  { user: limited, password: l, permissions: { publish: { allow: [">"], deny: ["$KV.*.denied"] } } }',
      "] }",
    ],
  });
  const admin = await connectNats(server.url, { user: "admin", pass: "a" });
  const name = uniqueName("kvr");
  const created = await new Kvm(admin).create(name, { history: 1, allow_direct: true });
  const nc = await connectNats(server.url, { user: "limited", pass: "l" });
  try {
    const kv = await new Kvm(jetstream(nc, { timeout: 2_000 })).open(name);
    const requests = new KvRequests(kv);
    assert.equal(requests.pipelined, true);
    for (
      const [label, run] of [
        ["put", (ops: Ops) => ops.put("denied", "1")],
        ["update", (ops: Ops) => ops.update("denied", "1", 1)],
        ["create", (ops: Ops) => ops.create("denied", "1")],
        ["delete", (ops: Ops) => ops.delete("denied")],
      ] as const
    ) {
      const expected = await outcome(() => run(kv as unknown as Ops));
      assert.equal(
        expected.error?.names.at(-1),
        "PermissionViolationError/PermissionViolationError",
      );
      assert.deepEqual(await outcome(() => run(requests)), expected, label);
    }
    assert.equal(typeof await requests.put("allowed", "1"), "number");
  } finally {
    await created.destroy().catch(() => {});
    await nc.close();
    await admin.close();
  }
});

Deno.test("kv requests: every write carries the bucket's own headers and subject, byte for byte", async () => {
  await withBucket(async (kv, requests, nc) => {
    // What the stream ingests, as a core subscriber sees it: subject, header block and data.
    const seen: string[] = [];
    const decoder = new TextDecoder();
    const sub = nc.subscribe(`$KV.${(kv as Bucket).bucket}.>`, {
      callback: (_error, msg) => {
        const raw = msg as unknown as { _headers?: Uint8Array; _rdata?: Uint8Array };
        const hlen = (msg as unknown as { _msg?: { hdr?: number } })._msg?.hdr ?? 0;
        const block = hlen > 0 ? decoder.decode(raw._rdata?.subarray(0, hlen)) : "";
        seen.push(`${msg.subject.replace(/\.(own|pipe)\./, ".X.")} [${block}] ${msg.string()}`);
      },
    });
    await nc.flush();
    const run = async (ops: Ops, prefix: string) => {
      const key = `${prefix}.k`;
      const first = await ops.put(key, "one");
      const second = await ops.update(key, "two", first);
      await ops.delete(key, { previousSeq: second });
      await ops.create(key, "three");
      await ops.delete(key);
      await ops.create(`${prefix}.fresh`, "four");
    };
    await run(
      {
        get: (k) => kv.get(k),
        put: (k, v) => kv.put(k, v),
        update: (k, v, r) => kv.update(k, v, r),
        create: (k, v) => kv.create(k, v),
        delete: (k, o) => kv.delete(k, o),
      },
      "own",
    );
    await nc.flush();
    const own = seen.splice(0);
    await run(requests, "pipe");
    await nc.flush();
    const pipe = seen.splice(0);
    sub.unsubscribe();
    // Six writes, and the first create's attempt over the DEL tombstone before its retry.
    assert.equal(own.length, 7);
    assert.match(
      own[2],
      /\[NATS\/1\.0\r\nKV-Operation: DEL\r\nNats-Expected-Last-Subject-Sequence: \d+\r\n\r\n\]/,
    );
    // The revisions in the compare-and-set headers differ between the twins.
    const revisions = (lines: string[]) =>
      lines.map((line) => line.replace(/Sequence: \d+/, "Sequence: N"));
    assert.deepEqual(revisions(pipe), revisions(own));
  });
});

Deno.test("kv requests: deleteUnconfirmed writes the tombstone kv.delete writes, without an acknowledgement", async () => {
  await withBucket(async (kv, requests, nc) => {
    await kv.put("own", "1");
    await kv.put("pipe", "1");
    await kv.delete("own");
    // Resolves once sent: the tombstone lands a little later (after a flush, here).
    await requests.deleteUnconfirmed("pipe");
    await nc.flush();
    await eventually(async () => assert.equal((await kv.get("pipe"))?.operation, "DEL"));
    const own = entryShape(await kv.get("own"));
    const pipe = entryShape(await kv.get("pipe"));
    assert.deepEqual(
      { ...pipe, key: "k", revision: 0, created: "" },
      { ...own, key: "k", revision: 0, created: "" },
    );
    // A bad key fails as kv.delete fails; a wildcard key is the bucket's own delete (all keys).
    assert.deepEqual(
      await outcome(() => requests.deleteUnconfirmed(".bad")),
      await outcome(() => kv.delete(".bad")),
    );
    // Any other KV object: its own delete, awaited.
    const counts = newCounts();
    await new KvRequests(countingKv(kv, counts)).deleteUnconfirmed("own");
    assert.deepEqual(counts.calls, { delete: 1 });
  });
});

Deno.test("kv requests: a create over a tombstone that prune removes between the read and the write still creates", async () => {
  await withBucket(async (kv, _requests, nc) => {
    const requests = new KvRequests(kv);
    assert.equal(requests.pipelined, true);
    await kv.put("k", "old");
    await kv.delete("k");
    // Prune removes the tombstone (a message delete, no new one) right after create read it: the
    // write expecting that tombstone's revision loses. The key has no entry at all, so a create
    // must succeed; the stores read the loss as "the key exists" (a marker not written: its
    // message stranded until a repair).
    const jsm = await jetstreamManager(nc);
    const stream = (kv as unknown as { stream: string }).stream;
    const read = requests.get.bind(requests);
    let removed = 0;
    requests.get = async (key: string) => {
      const entry = await read(key);
      if (entry?.operation === "DEL" && removed++ === 0) {
        await jsm.streams.deleteMessage(stream, entry.revision, false);
      }
      return entry;
    };
    const revision = await requests.create("k", "new");
    assert.equal(removed, 1, "the tombstone was removed inside the create");
    assert.equal((await kv.get("k"))?.string(), "new");
    assert.equal((await kv.get("k"))?.revision, revision);
  });
});

Deno.test("kv requests: on a bucket that is not pipelined, a create over a tombstone that prune removes between the read and the write still creates", async () => {
  await withBucket(async (kv, _requests, nc) => {
    await kv.put("k", "old");
    await kv.delete("k");
    // An instrumented bucket (its own get, as a wrapper installs one): the calls go to the
    // bucket's own create, whose read of the tombstone is followed by prune's removal of it. The
    // bucket's create then loses its write over the tombstone although the key has no entry.
    const jsm = await jetstreamManager(nc);
    const stream = (kv as unknown as { stream: string }).stream;
    const read = kv.get.bind(kv);
    let removed = 0;
    kv.get = async (key: string) => {
      const entry = await read(key);
      if (entry?.operation === "DEL" && removed++ === 0) {
        await jsm.streams.deleteMessage(stream, entry.revision, false);
      }
      return entry;
    };
    const requests = new KvRequests(kv);
    assert.equal(requests.pipelined, false);
    const revision = await requests.create("k", "new");
    assert.equal(removed, 1, "the tombstone was removed inside the create");
    assert.equal((await read("k"))?.string(), "new");
    assert.equal((await read("k"))?.revision, revision);
  });
});

Deno.test("kv requests: a bucket with its own key codec gets the subjects and entries of its own calls", async () => {
  // The pipelined path skips encodeKey only for NoopKvCodecs' identity; any other codec runs.
  const codec: KvCodecs = { key: Base64KeyCodec(), value: NoopKvCodecs().value };
  await withBucket(async (kv, requests, nc) => {
    assert.equal(requests.pipelined, true);
    const seen: string[] = [];
    const sub = nc.subscribe(`$KV.${(kv as Bucket).bucket}.>`, {
      callback: (_error, msg) => void seen.push(msg.subject),
    });
    await nc.flush();
    const run = async (ops: Ops, key: string) => {
      const first = await ops.put(key, "one");
      await ops.update(key, "two", first);
      const entry = await ops.get(key);
      await ops.delete(key);
      return entryShape(entry);
    };
    const own = await run({
      get: (k) => kv.get(k),
      put: (k, v) => kv.put(k, v),
      update: (k, v, r) => kv.update(k, v, r),
      create: (k, v) => kv.create(k, v),
      delete: (k, o) => kv.delete(k, o),
    }, "m.own");
    const pipe = await run(requests, "m.pipe");
    await requests.deleteUnconfirmed("m.pipe");
    await nc.flush();
    sub.unsubscribe();
    const encoded = (key: string) => (kv as Bucket).encodeKey(key);
    assert.notEqual(encoded("m.pipe"), "m.pipe");
    const subject = (key: string) => `$KV.${(kv as Bucket).bucket}.${encoded(key)}`;
    // put, update, delete; and the pipelined deleteUnconfirmed's.
    assert.deepEqual(seen, [
      ...Array(3).fill(subject("m.own")),
      ...Array(4).fill(subject("m.pipe")),
    ]);
    assert.equal(own?.key, "m.own");
    assert.equal(pipe?.key, "m.pipe");
    assert.deepEqual({ ...pipe, key: "", revision: 0, created: "" }, {
      ...own,
      key: "",
      revision: 0,
      created: "",
    });
  }, { codec });
});

/** What `#publish` made of a PubAck before `plainAckSeq`: the parsed JSON's seq, when plain. */
function parsedAckSeq(data: Uint8Array): number | undefined {
  let value: { stream?: unknown; seq?: unknown; error?: unknown };
  try {
    value = JSON.parse(new TextDecoder().decode(data));
  } catch {
    return undefined;
  }
  if (value === null || typeof value !== "object" || "error" in value) return undefined;
  return typeof value.stream === "string" && value.stream !== "" && typeof value.seq === "number"
    ? value.seq
    : undefined;
}

Deno.test("kv requests: a PubAck read from its bytes gives what JSON.parse gives, or defers to it", () => {
  const encoder = new TextEncoder();
  const plain = (text: string) => plainAckSeq(encoder.encode(text));
  assert.equal(plain(`{"stream":"KV_a","seq":1}`), 1);
  assert.equal(plain(`{"stream":"KV_a", "seq":7}`), 7); // nats-server 2.9 and 2.10
  assert.equal(plain(`{"stream":"KV_a-b_c","seq":123456789012345}`), 123456789012345);
  // Anything else goes to JSON.parse (and from there to parseJsResponse).
  for (
    const text of [
      `{"stream":"","seq":1}`,
      `{"stream":"KV_a","seq":01}`,
      `{"stream":"KV_a","seq":1.5}`,
      `{"stream":"KV_a","seq":-1}`,
      `{"stream":"KV_a","seq":1,"duplicate":true}`,
      `{"stream":"KV_a","seq":1 }`,
      `{"stream":"KV_a",  "seq":1}`,
      `{"stream":"KV_a" ,"seq":1}`,
      `{"stream":"KV_a", "seq":1,"duplicate": true}`,
      `{"stream":"KV_a","seq":1}\n`,
      `{"stream":"K\\"V","seq":1}`,
      `{"stream":"KV_a","seq":1234567890123456}`,
      `{"stream":"KV_a","domain":"d","seq":1}`,
      `{"error":{"code":400},"stream":"KV_a","seq":1}`,
      `{"stream":"KV_a","seq":}`,
      `{"stream":"KV_a"`,
      ``,
    ]
  ) assert.equal(plain(text), undefined, text);
  const ackLike = fc.tuple(
    fc.constantFrom(`{"stream":"`, `{"stream": "`, `{"strea":"`),
    fc.oneof(fc.string({ maxLength: 12 }), fc.constantFrom("KV_x", "a\\b", "")),
    fc.constantFrom(`","seq":`, `", "seq":`, `","seq" :`),
    fc.oneof(
      fc.nat().map(String),
      fc.constantFrom("0", "00", "-1", "1e3", "9007199254740993", "123456789012345"),
    ),
    fc.constantFrom("}", " }", ',"duplicate":true}', "", "}}", '}"'),
  ).map((parts) => parts.join(""));
  fc.assert(
    fc.property(ackLike, (text) => {
      const bytes = encoder.encode(text);
      const fast = plainAckSeq(bytes);
      if (fast !== undefined) assert.equal(fast, parsedAckSeq(bytes), text);
    }),
    { numRuns: 5_000 },
  );
});

Deno.test("kv requests: encodeText gives TextEncoder's bytes, and a view is never written over", () => {
  const encoder = new TextEncoder();
  const kept: Array<{ text: string; bytes: Uint8Array }> = [];
  fc.assert(
    fc.property(
      fc.oneof(
        fc.string({ maxLength: 300 }),
        fc.string({ unit: "grapheme", maxLength: 300 }),
        fc.string({ unit: "binary", maxLength: 3_000 }),
        fc.string({ maxLength: 20_000 }),
        fc.constantFrom("\ud800", "a\udc00b", "é", "NATS/1.0\r\n\r\n"),
      ),
      (text) => {
        const bytes = encodeText(text);
        assert.deepEqual(bytes, encoder.encode(text));
        kept.push({ text, bytes });
      },
    ),
    { numRuns: 3_000 },
  );
  for (const { text, bytes } of kept) assert.deepEqual(bytes, encoder.encode(text));
});

Deno.test("kv requests: a STREAM.MSG.GET message's headers answer as MsgHdrsImpl.decode's do", () => {
  const names = ["KV-Operation", "kv-operation", "Nats-Marker-Reason", "Nats-Msg-Size", "A", ""];
  const line = fc.oneof(
    fc.tuple(
      fc.oneof(fc.constantFrom(...names), fc.string({ maxLength: 6 }), fc.constant("Bad Name")),
      fc.oneof(fc.constantFrom("DEL", " PURGE ", "MaxAge", "12", "", "a\nb", "é"), fc.string()),
    ).map(([name, value]) => `${name}:${value}`),
    fc.constantFrom("", "no colon", "NATS/1.0"),
  );
  const block = fc.tuple(
    fc.constantFrom("NATS/1.0", "NATS/1.0 404 Not Found", "NATS/1.1", ""),
    fc.array(line, { maxLength: 5 }),
  ).map(([status, lines]) => [status, ...lines].join("\r\n") + "\r\n\r\n");
  const encoder = new TextEncoder();
  // Each lookup on its own (a malformed block throws at each, as decode throws).
  const answers = (header: MsgHdrs) => {
    const calls: Array<() => unknown> = names.flatMap((name) => [
      () => header.has(name),
      () => header.get(name),
      () => header.last(name),
    ]);
    calls.push(() => header.get("kv-operation", Match.IgnoreCase), () => header.code);
    return calls.map((call) => {
      try {
        return call();
      } catch (error) {
        return `${(error as Error).constructor.name}: ${(error as Error).message}`;
      }
    });
  };
  /** MsgHdrsImpl.decode's headers, or one that throws its error at every call. */
  const decoded = (bytes: Uint8Array): MsgHdrs => {
    try {
      return MsgHdrsImpl.decode(bytes);
    } catch (error) {
      const fail = () => {
        throw error;
      };
      return {
        has: fail,
        get: fail,
        last: fail,
        get code() {
          return fail();
        },
      } as unknown as MsgHdrs;
    }
  };
  fc.assert(
    fc.property(block, (text) => {
      const bytes = encoder.encode(text);
      const hdrs = btoa(String.fromCharCode(...bytes));
      const stored =
        new ApiStoredMessage({ message: { subject: "s", seq: 1, time: "", hdrs } }).header;
      assert.deepEqual(answers(stored), answers(decoded(bytes)), text);
    }),
    { numRuns: 5_000 },
  );
  // A change is seen by later lookups.
  const header = new ApiStoredMessage({
    message: {
      subject: "s",
      seq: 1,
      time: "",
      hdrs: btoa("NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"),
    },
  }).header;
  assert.equal(header.get("KV-Operation"), "DEL");
  header.set("KV-Operation", "PURGE");
  assert.equal(header.get("KV-Operation"), "PURGE");
});
