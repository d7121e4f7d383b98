/**
 * Scenario 6, poison messages at dispatch time, on each store (Postgres, SQLite, NATS KV)
 * against a private nats-server with max_payload 8 KiB: a payload that is not JSON (refused at enqueue), a payload
 * over max_payload, a subject no stream captures, a job kind without a handler, rows and entries
 * corrupted behind the library's back, next to neighbours with hostile ids and headers. Each
 * poison message ends `dead` with a reason that says why, the neighbours are delivered exactly
 * once, and `requeue` brings a message through once its cause is fixed.
 */

import assert from "node:assert/strict";
import type { DatabaseSync } from "node:sqlite";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  createJetStreamRuntime,
  createOutboxBucket,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  type OutboxAdmin,
  OutboxDispatcher,
  outboxMessageToPreparedEvent,
  type OutboxRecord,
  type OutboxRepository,
  type OutboxRuntime,
  OutboxValidationError,
  postgresJsExecutor,
  SqlOutboxRepository,
} from "../../mod.ts";
import { outboxRecordKey } from "../../src/stores/nats_kv/keys.ts";
import { openSqlite } from "../sql/harness.ts";
import { createTestDatabase, eventually, NatsServer, uniqueName } from "../kit/mod.ts";
import {
  assertExactlyOnce,
  compareDelivery,
  deliveryFigures,
  figures,
  natsConnection,
  pgPool,
  readStreamIds,
  tempDir,
} from "./harness.ts";

/** Ids that must go through every store and JetStream unharmed. */
const hostileIds = [
  "'; DROP TABLE trellis_outbox; --",
  "Robert'); DROP TABLE students;--",
  '"double" \\back\\slash `tick` $1 ?1 %s %n {{x}}',
  "ünïcødé-ид-标识-🚀-\u200f-rtl-e\u0301",
  "dots.and.*.stars.>.colons:and spaces\tand tabs inside",
  "null",
  "x".repeat(1_000),
  "é".repeat(1_000), // 2,000 bytes of UTF-8: a hashed KV key
];

type Store = OutboxRepository & OutboxAdmin;

interface PoisonStore {
  name: string;
  outbox: Store;
  /** Damages stored messages behind the library's back. */
  corrupt(ids: readonly string[]): Promise<void>;
  /** Writes a message behind the library's back (SQL), bypassing enqueue validation. */
  insertRaw?(id: string, subject: string): Promise<void>;
  /**
   * The store itself lives on the NATS server (KV): a record over its max_payload cannot even be
   * stored, and enqueue refuses it with a typed error instead.
   */
  refusesOversize?: boolean;
}

function record(prefix: string, id: string, overrides: Partial<OutboxRecord> = {}): OutboxRecord {
  return {
    id,
    kind: "event.publish",
    name: "fault.poison",
    subject: `${prefix}.ok`,
    payload: JSON.stringify({ id }),
    headers: {},
    ...overrides,
  };
}

async function addStream(nc: NatsConnection, prefix: string): Promise<string> {
  const name = uniqueName("stream");
  await (await jetstreamManager(nc)).streams.add({ name, subjects: [`${prefix}.>`] });
  return name;
}

/** Runs the whole poison scenario on one store. */
async function poisonScenario(
  nc: NatsConnection,
  open: (nc: NatsConnection) => Promise<PoisonStore & AsyncDisposable>,
): Promise<void> {
  await using store = await open(nc);
  const { outbox } = store;
  const prefix = uniqueName("subj");
  const orphanPrefix = uniqueName("orphan");
  const stream = await addStream(nc, prefix);

  const neighbours = Array.from({ length: 12 }, (_, i) =>
    record(prefix, `neighbour-${i}`, {
      // Headers that hid the Nats-Msg-Id from nats-server 2.9 before the runtime wrote it first.
      headers: { "X-Original-Nats-Msg-Id": `upstream-${i}`, "X-Note": "Nats-Msg-Id copied" },
    }));
  const hostile = hostileIds.map((id) => record(prefix, id));
  const poison = {
    badJson: record(prefix, "poison-bad-json", { payload: "{not json" }),
    oversize: record(prefix, "poison-oversize", {
      payload: JSON.stringify({ blob: "x".repeat(16_000) }),
    }),
    noStream: record(orphanPrefix, "poison-no-stream", { subject: `${orphanPrefix}.x` }),
    noHandler: record(prefix, "poison-job", { kind: "job.create", name: "report.render" }),
    corrupt: record(prefix, "poison-corrupt"),
  };
  // A payload that is not JSON is refused at enqueue by every store, and stores nothing.
  await assert.rejects(
    outbox.enqueue(poison.badJson),
    (error: OutboxValidationError) =>
      error instanceof OutboxValidationError && error.field === "payload" &&
      /must be JSON text/.test(error.message),
  );
  assert.equal(await outbox.get(poison.badJson.id), undefined);
  const all = [
    neighbours[0],
    neighbours[1],
    hostile[0],
    poison.oversize,
    neighbours[2],
    hostile[1],
    poison.noStream,
    neighbours[3],
    hostile[2],
    poison.noHandler,
    neighbours[4],
    hostile[3],
    poison.corrupt,
    ...neighbours.slice(5),
    ...hostile.slice(4),
  ];
  if (store.refusesOversize) {
    await assert.rejects(
      outbox.enqueue(poison.oversize),
      (error: OutboxValidationError) =>
        error instanceof OutboxValidationError && error.field === "payload",
    );
    assert.equal(await outbox.get(poison.oversize.id), undefined);
    all.splice(all.indexOf(poison.oversize), 1);
  }
  await outbox.enqueueMany(all);
  for (const item of hostile) {
    const stored = await outbox.get(item.id);
    assert.equal(stored?.id, item.id, "a hostile id round-trips through the store");
  }
  await store.corrupt([poison.corrupt.id]);
  const rawId = "  padded id written behind the library's back ";
  await store.insertRaw?.(rawId, `${prefix}.raw`);

  const publisher = createJetStreamRuntime(jetstream(nc, { timeout: 2_000 }), { timeoutMs: 2_000 });
  const runtime: OutboxRuntime = {
    publishPreparedEvent: (event, options) => publisher.publishPreparedEvent(event, options),
    probe: () => publisher.probe(),
  };
  const errors: unknown[] = [];
  const dispatcher = new OutboxDispatcher(outbox, runtime, {
    limit: 10,
    maxInFlight: 10,
    leaseMs: 5_000,
    idleRetryMs: 50,
    retry: { baseMs: 20, capMs: 40, maxAttempts: 3 },
    onError: (error) => errors.push(error),
  });
  try {
    const expectedDead = 4 + (store.insertRaw ? 1 : 0) - (store.refusesOversize ? 1 : 0);
    await eventually(async () => {
      const stats = await outbox.stats();
      assert.equal(stats.pending + stats.claimed + stats.failed, 0, JSON.stringify(stats));
      assert.equal(stats.dead, expectedDead, JSON.stringify(stats));
    }, { timeoutMs: 60_000, intervalMs: 100 });

    // Each poison message is dead with a reason that says why.
    const reasons = new Map((await outbox.listDead()).map((m) => [m.id, m]));
    const reason = (id: string) => reasons.get(id)?.lastError ?? "";
    if (!store.refusesOversize) assert.match(reason(poison.oversize.id), /^max_payload: /);
    assert.match(reason(poison.noStream.id), /^gave up after 3 attempts: no_stream: /);
    assert.match(reason(poison.noHandler.id), /^no_job_handler: /);
    assert.match(reason(poison.corrupt.id), /Corrupt outbox record/);
    if (store.insertRaw) assert.match(reason(rawId), /^invalid_msg_id: /);
    assert.equal(reasons.get(poison.noHandler.id)?.attempts, 1, "no retries for a poison message");
    if (!store.refusesOversize) assert.equal(reasons.get(poison.oversize.id)?.attempts, 1);
    assert.equal(reasons.get(poison.noStream.id)?.attempts, 3);

    // Neighbours (hostile ids and headers included) are in the stream exactly once.
    const delivered = [...neighbours, ...hostile].map((r) => r.id);
    for (const id of delivered) assert.equal((await outbox.get(id))?.state, "dispatched", id);
    const before = compareDelivery(delivered, await readStreamIds(nc, stream));
    assertExactlyOnce(before);
    // A re-publish of each (as after a crash) is absorbed by the duplicate window.
    let absorbed = 0;
    for (const id of delivered) {
      const message = (await outbox.get(id))!;
      const receipt = await publisher.publishPreparedEvent(outboxMessageToPreparedEvent(message));
      assert.equal(receipt.duplicate, true, `re-publish of ${JSON.stringify(id.slice(0, 40))}`);
      absorbed += 1;
    }
    assertExactlyOnce(compareDelivery(delivered, await readStreamIds(nc, stream)));

    // Fix the causes and requeue: the stream now exists, the job handler is deployed.
    const orphanStream = await addStream(nc, orphanPrefix);
    runtime.dispatchJobSubmission = (message) =>
      Promise.resolve({ kind: "accepted", jobId: message.id });
    assert.equal(await outbox.requeue([poison.noStream.id, poison.noHandler.id]), 2);
    dispatcher.notify();
    await eventually(async () => {
      assert.equal((await outbox.get(poison.noStream.id))?.state, "dispatched");
      const job = await outbox.get(poison.noHandler.id);
      assert.equal(job?.state, "dispatched");
      assert.deepEqual(job?.outcome, { kind: "accepted", jobId: poison.noHandler.id });
    }, { timeoutMs: 30_000, intervalMs: 100 });
    assertExactlyOnce(
      compareDelivery([poison.noStream.id], await readStreamIds(nc, orphanStream)),
    );
    assertExactlyOnce(compareDelivery(delivered, await readStreamIds(nc, stream)));

    figures(`poison/${store.name}`, {
      ...deliveryFigures(before),
      dead: expectedDead,
      reasons: Object.fromEntries(
        [...reasons].map(([id, m]) => [id.slice(0, 24), (m.lastError ?? "").slice(0, 40)]),
      ),
      republishesAbsorbed: absorbed,
      requeuedAndDelivered: 2,
      storeErrors: errors.length,
    });
    await (await jetstreamManager(nc)).streams.delete(orphanStream);
  } finally {
    await dispatcher.stop();
    await (await jetstreamManager(nc)).streams.delete(stream).catch(() => {});
  }
}

async function withPoisonServer(fn: (nc: NatsConnection) => Promise<void>): Promise<void> {
  await using server = await NatsServer.start({ maxPayload: 8_192 });
  await using nats = await natsConnection(server.url);
  await fn(nats.nc);
}

Deno.test("poison on Postgres: each bad message is dead with its reason, neighbours delivered once, requeue after the fix", async () => {
  await withPoisonServer((nc) =>
    poisonScenario(nc, async () => {
      const db = await createTestDatabase();
      const pg = pgPool(db.url);
      const executor = postgresJsExecutor(pg.sql);
      await migrate(executor, { dialect: "postgres" });
      return {
        name: "postgres",
        outbox: new SqlOutboxRepository(executor, "postgres"),
        async corrupt(ids) {
          // Valid JSON, but not a headers object.
          await pg.sql`UPDATE trellis_outbox SET headers = '[1, 2]'::jsonb WHERE id IN ${
            pg.sql(ids)
          }`;
        },
        async insertRaw(id, subject) {
          await pg.sql`
            INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts,
              created_at, updated_at)
            VALUES (${id}, 'event.publish', 'raw', ${subject}, '{}', '{}'::jsonb, 'pending', 0,
              now(), now())`;
        },
        async [Symbol.asyncDispose]() {
          await pg[Symbol.asyncDispose]();
          await db[Symbol.asyncDispose]();
        },
      };
    })
  );
});

Deno.test("poison on SQLite: each bad message is dead with its reason, neighbours delivered once, requeue after the fix", async () => {
  await withPoisonServer((nc) =>
    poisonScenario(nc, async () => {
      const dir = await tempDir("outbox_faults_poison_");
      const db: DatabaseSync = openSqlite(`${dir.path}/outbox.db`);
      const executor = nodeSqliteExecutor(db);
      await migrate(executor, { dialect: "sqlite" });
      return {
        name: "sqlite",
        outbox: new SqlOutboxRepository(executor, "sqlite"),
        async corrupt(ids) {
          for (const id of ids) {
            await executor.query("UPDATE trellis_outbox SET headers = '{not json' WHERE id = ?1", [
              id,
            ]);
          }
        },
        async insertRaw(id, subject) {
          const now = new Date().toISOString();
          await executor.query(
            "INSERT INTO trellis_outbox (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at) VALUES (?1, 'event.publish', 'raw', ?2, '{}', '{}', 'pending', 0, ?3, ?3)",
            [id, subject, now],
          );
        },
        async [Symbol.asyncDispose]() {
          db.close();
          await dir[Symbol.asyncDispose]();
        },
      };
    })
  );
});

Deno.test("poison on NATS KV: each bad message is dead with its reason, neighbours delivered once, requeue after the fix", async () => {
  await withPoisonServer((nc) =>
    poisonScenario(nc, async (nc) => {
      const kv = await createOutboxBucket(new Kvm(nc), uniqueName("faults_poison"));
      const outbox = new NatsKvOutboxRepository(kv);
      return {
        name: "nats-kv",
        outbox,
        refusesOversize: true,
        async corrupt(ids) {
          for (const id of ids) await kv.put(await outboxRecordKey(id), "{not json");
        },
        async [Symbol.asyncDispose]() {
          await outbox.close();
          await kv.destroy().catch(() => {});
        },
      };
    })
  );
});
