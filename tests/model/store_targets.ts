/**
 * The stores the model runs against, each opened as several repository instances over the same
 * storage (several dispatchers), every instance behind its own fault proxy.
 *
 * - memory: one `MemoryOutboxRepository`, the proxy over the repository itself;
 * - SQLite (node:sqlite): a WAL file; instances 0 and 1 are two executors over ONE connection
 *   (a service and a dispatcher sharing it), instance 2 a second connection (better-sqlite3 is
 *   a Node-only test dependency, out of deno.json; the Node suite covers that driver);
 * - Postgres (postgres.js, pg): two pools, fresh unique tables per test, emptied per run;
 * - NATS KV: a fresh unique bucket per run, instances 0 and 1 on one connection, 2 on another.
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import postgres from "postgres";
// @ts-types="@types/pg"
import pg from "pg";
import { Kvm } from "@nats-io/kv";
import type { KV } from "@nats-io/kv";
import {
  createOutboxBucket,
  MemoryOutboxRepository,
  migrate,
  NatsKvOutboxRepository,
  nodeSqliteExecutor,
  type OutboxAdmin,
  type OutboxRepository,
  pgExecutor,
  postgresJsExecutor,
  type SqlDialect,
  type SqlExecutor,
  SqlOutboxRepository,
  type SqlOutboxTables,
} from "../../mod.ts";
import { syncKey } from "../../src/stores/nats_kv/keys.ts";
import { connectNats, postgresUrl, uniqueName } from "../kit/mod.ts";
import { FaultController, faultyHandle } from "./faulty_handle.ts";

/** A store as the model drives it. */
export type Store = OutboxRepository & OutboxAdmin;

/** One repository instance (one dispatcher's view) with its fault controller. */
export interface Instance {
  store: Store;
  faults: FaultController;
  /**
   * Runs `work` in a transaction of this instance's connection with a repository bound to it
   * (SQL stores only): commit when it resolves, roll back when it throws.
   */
  transaction?: <T>(work: (store: Store) => Promise<T>) => Promise<T>;
  /** Other instances on the same connection (a transaction there must not swallow them). */
  connection: number;
}

/** One run's storage: fresh and empty. */
export interface Run {
  instances: Instance[];
  /** A repository without faults, to observe (get, stats). */
  observer: Store;
  /** Waits until every instance has seen every change made so far (KV watches); else no-op. */
  settle(): Promise<void>;
  close(): Promise<void>;
}

/** A store kind: open once per test, then one run per property run. */
export interface Target {
  name: string;
  /** Whether transactions (and the rolled-back enqueue command) exist. */
  transactional: boolean;
  /**
   * Whether a markMany applies as one step (memory), or in parts another actor may come
   * between: SQL runs one statement per repetition of an id, NATS KV settles mark by mark.
   */
  atomicBatches: boolean;
  /** Whether fault positions past the first call matter (multi-call operations). */
  calls: number;
  /**
   * Which instances may run while another holds a transaction open: SQLite's single writer
   * would block a second connection (synchronously), so only the same connection's.
   */
  txPeers: "same-connection" | "any";
  open(): Promise<TargetSession>;
}

/** A store opened for one test. */
export interface TargetSession {
  run(): Promise<Run>;
  close(): Promise<void>;
}

const sqlCalls = ["query"];
const kvCalls = ["get", "put", "create", "update", "delete", "purge", "keys", "history"];
const repositoryCalls = [
  "enqueue",
  "enqueueMany",
  "get",
  "claimDue",
  "markDispatched",
  "markFailed",
  "markDead",
  "markMany",
  "requeue",
  "prune",
  "stats",
  "listDead",
];

/** Memory: one repository, three proxies. */
export const memoryTarget: Target = {
  name: "memory",
  transactional: false,
  atomicBatches: true,
  calls: 1,
  txPeers: "any",
  open() {
    return Promise.resolve({
      run() {
        const repository = new MemoryOutboxRepository();
        const instances = [0, 1, 2].map((): Instance => {
          const faults = new FaultController();
          return {
            store: faultyHandle(repository, repositoryCalls, faults),
            faults,
            connection: 0,
          };
        });
        return Promise.resolve({
          instances,
          observer: repository,
          settle: () => Promise.resolve(),
          close: () => Promise.resolve(),
        });
      },
      close: () => Promise.resolve(),
    });
  },
};

function sqlInstances(
  executors: Array<{ executor: SqlExecutor; connection: number }>,
  dialect: SqlDialect,
  tables?: SqlOutboxTables,
): Instance[] {
  return executors.map(({ executor, connection }) => {
    const faults = new FaultController();
    const proxied = faultyHandle(executor, sqlCalls, faults);
    return {
      store: new SqlOutboxRepository(proxied, dialect, tables),
      faults,
      connection,
      transaction: (work) =>
        executor.transaction!((tx) => work(new SqlOutboxRepository(tx, dialect, tables))),
    };
  });
}

interface SqliteHandle {
  exec(sql: string): unknown;
  close(): unknown;
}

function sqliteTarget<Db extends SqliteHandle>(
  name: string,
  openDb: (path: string) => Db,
  executorOf: (db: Db) => SqlExecutor,
): Target {
  return {
    name,
    transactional: true,
    atomicBatches: false,
    calls: 1,
    txPeers: "same-connection",
    async open() {
      const dir = await Deno.makeTempDir({ prefix: "outbox_model_" });
      const path = `${dir}/outbox.db`;
      const first = openDb(path);
      const second = openDb(path);
      for (const db of [first, second]) {
        db.exec("PRAGMA journal_mode = WAL");
        db.exec("PRAGMA busy_timeout = 2000");
      }
      const observerExecutor = executorOf(second);
      await migrate(observerExecutor, { dialect: "sqlite" });
      return {
        async run() {
          await observerExecutor.query("DELETE FROM trellis_outbox", []);
          // Instances 0 and 1: two executors over ONE connection; instance 2: the second one.
          const instances = sqlInstances([
            { executor: executorOf(first), connection: 0 },
            { executor: executorOf(first), connection: 0 },
            { executor: executorOf(second), connection: 1 },
          ], "sqlite");
          return {
            instances,
            observer: new SqlOutboxRepository(observerExecutor, "sqlite"),
            settle: () => Promise.resolve(),
            close: () => Promise.resolve(),
          };
        },
        async close() {
          first.close();
          second.close();
          await Deno.remove(dir, { recursive: true });
        },
      };
    },
  };
}

/** SQLite through node:sqlite. */
export const nodeSqliteTarget: Target = sqliteTarget(
  "sqlite (node:sqlite)",
  (path) => new DatabaseSync(path),
  (db) => nodeSqliteExecutor(db),
);

function postgresTarget(
  name: string,
  pools: (url: string) => { executors: SqlExecutor[]; end(): Promise<void> },
): Target {
  return {
    name,
    transactional: true,
    atomicBatches: false,
    calls: 1,
    txPeers: "any",
    async open() {
      const handles = pools(await postgresUrl());
      const base = uniqueName("mdl").slice(0, 40);
      const tables = { outbox: `${base}_o`, inbox: `${base}_i` };
      const [a, b] = handles.executors;
      try {
        await migrate(a, { dialect: "postgres", tables });
      } catch (error) {
        await handles.end();
        throw error;
      }
      return {
        async run() {
          await a.query(`DELETE FROM ${tables.outbox}`, []);
          return {
            instances: sqlInstances(
              [
                { executor: a, connection: 0 },
                { executor: b, connection: 1 },
                { executor: a, connection: 0 },
              ],
              "postgres",
              tables,
            ),
            observer: new SqlOutboxRepository(b, "postgres", tables),
            settle: () => Promise.resolve(),
            close: () => Promise.resolve(),
          };
        },
        async close() {
          try {
            await a.query(
              `DROP TABLE IF EXISTS ${tables.outbox}, ${tables.inbox}, ${tables.outbox}_migrations, ${tables.outbox}_keys`,
              [],
            );
          } finally {
            await handles.end();
          }
        },
      };
    },
  };
}

/** Postgres through postgres.js: two pools. */
export const postgresJsTarget: Target = postgresTarget("postgres (postgres.js)", (url) => {
  const one = postgres(url, { max: 3, onnotice: () => {} });
  const two = postgres(url, { max: 3, onnotice: () => {} });
  return {
    executors: [postgresJsExecutor(one), postgresJsExecutor(two)],
    end: async () => {
      await Promise.all([one.end(), two.end()]);
    },
  };
});

/** Postgres through node-postgres: two `pg.Pool`s. */
export const pgTarget: Target = postgresTarget("postgres (pg)", (url) => {
  const one = new pg.Pool({ connectionString: url, max: 3 });
  const two = new pg.Pool({ connectionString: url, max: 3 });
  return {
    executors: [pgExecutor(one), pgExecutor(two)],
    end: async () => {
      await Promise.all([one.end(), two.end()]);
    },
  };
});

/** A KV handle whose live watches are in `live`, each with the highest revision it delivered. */
function watchedKv(kv: KV, live: Set<{ revision: number }>): KV {
  return new Proxy(kv, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      if (typeof value !== "function") return value;
      if (property !== "watch") return value.bind(target);
      return async (...args: unknown[]) => {
        const iterator = await value.apply(target, args);
        return new Proxy(iterator, {
          get(inner, key) {
            if (key === Symbol.asyncIterator) {
              return async function* () {
                const seen = { revision: 0 };
                live.add(seen);
                try {
                  for await (const entry of inner as AsyncIterable<{ revision: number }>) {
                    if (entry.revision > seen.revision) seen.revision = entry.revision;
                    yield entry;
                  }
                } finally {
                  live.delete(seen);
                }
              };
            }
            const member = Reflect.get(inner, key, inner);
            return typeof member === "function" ? member.bind(inner) : member;
          },
        });
      };
    },
  });
}

/** NATS KV: a fresh bucket per run; instances 0 and 1 on one connection, 2 on another. */
export const natsKvTarget: Target = {
  name: "nats kv",
  transactional: false,
  atomicBatches: false,
  calls: 4,
  txPeers: "any",
  async open() {
    const connections = [await connectNats(), await connectNats()];
    return {
      async run() {
        const bucket = uniqueName("mdl");
        const kv = await createOutboxBucket(new Kvm(connections[0]), bucket);
        const peer = await new Kvm(connections[1]).open(bucket);
        const watches = new Set<{ revision: number }>();
        const repositories: NatsKvOutboxRepository[] = [];
        const instances = [kv, kv, peer].map((handle, i): Instance => {
          const faults = new FaultController();
          const proxied = faultyHandle(watchedKv(handle, watches), kvCalls, faults);
          const store = new NatsKvOutboxRepository(proxied);
          repositories.push(store);
          return { store, faults, connection: i === 2 ? 1 : 0 };
        });
        const observer = new NatsKvOutboxRepository(peer);
        repositories.push(observer);
        return {
          instances,
          observer,
          async settle() {
            // A write to the index's own sync key: once every watch delivered it, every
            // instance has seen every marker change made before it.
            const revision = await kv.put(syncKey, "model");
            const deadline = Date.now() + 2_000;
            while ([...watches].some((w) => w.revision < revision)) {
              if (Date.now() > deadline) break;
              await new Promise((resolve) => setTimeout(resolve, 2));
            }
            await new Promise((resolve) => setTimeout(resolve, 0));
          },
          async close() {
            await Promise.all(repositories.map((repository) => repository.close()));
            await kv.destroy().catch(() => {});
          },
        };
      },
      async close() {
        await Promise.all(connections.map((nc) => nc.close()));
      },
    };
  },
};

/** Every store, in the order the tests run them. */
export const targets: readonly Target[] = [
  memoryTarget,
  nodeSqliteTarget,
  postgresJsTarget,
  pgTarget,
  natsKvTarget,
];
