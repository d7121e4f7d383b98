/**
 * `deno task demo`: an order service and a shipping service talking through NATS JetStream with
 * the transactional outbox and inbox, on the embedded default store (SQLite via node:sqlite).
 *
 * - The order service writes each order and its `order.created` event in ONE transaction; an
 *   OutboxDispatcher relays the events to JetStream with Nats-Msg-Id dedupe.
 * - The shipping service consumes them with its inbox in the SAME transaction as its shipment
 *   row. To show the inbox at work, it "crashes" after committing every 25th message and before
 *   acking it; JetStream redelivers and the inbox suppresses the duplicate.
 *
 * NATS comes from NATS_URL (default nats://127.0.0.1:4222). If nothing answers there and
 * nats-server is installed, a temporary one is started; otherwise the demo says how to get one.
 *
 * Usage: deno task demo [--orders 2000]. Errors are one line on stderr: exit 2 for a usage error,
 * 1 for anything else (DEMO_VERBOSE=1 adds the stack).
 *
 * @module
 */

import { DatabaseSync } from "node:sqlite";
import { parseArgs } from "node:util";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  consumeWithInbox,
  createJetStreamRuntime,
  migrate,
  nodeSqliteExecutor,
  OutboxDispatcher,
  type SqlExecutor,
  SqlInboxRepository,
  sqliteTransactionRunner,
  SqlOutboxRepository,
  type TransactionRunner,
} from "../mod.ts";
import { NatsServer, natsServerBinary } from "../tests/kit/nats_server.ts";

const usage = "usage: deno task demo [--orders <n>]   (NATS_URL picks the server)";
let args;
try {
  args = parseArgs({
    args: Deno.args,
    options: {
      orders: { type: "string", default: "2000" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
} catch (error) {
  // One line and exit 2 for a usage error, never a stack trace.
  const message = /argument is ambiguous/.test((error as Error).message)
    ? "--orders must be a positive integer"
    : (error as Error).message.split("\n")[0];
  console.error(`demo: ${message}; ${usage}`);
  Deno.exit(2);
}
if (args.values.help) {
  console.log(usage);
  Deno.exit(0);
}
const orderCount = Number(args.values.orders);
if (!/^\d+$/.test(args.values.orders) || !Number.isSafeInteger(orderCount) || orderCount < 1) {
  console.error(`demo: --orders must be a positive integer, got "${args.values.orders}"`);
  Deno.exit(2);
}
// Anything unexpected from here on: one line (the stack only with DEMO_VERBOSE=1), exit 1.
globalThis.addEventListener("unhandledrejection", (event) => {
  event.preventDefault();
  fail(event.reason);
});
globalThis.addEventListener("error", (event) => {
  event.preventDefault();
  fail(event.error);
});
function fail(error: unknown): void {
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  console.error(`demo: ${message.split("\n")[0]}`);
  if (Deno.env.get("DEMO_VERBOSE") && error instanceof Error) console.error(error.stack);
  void shutdown(1);
}

const cleanup: Array<() => Promise<unknown> | unknown> = [];
async function shutdown(code: number): Promise<never> {
  for (const step of cleanup.reverse()) {
    try {
      await step();
    } catch {
      // best effort
    }
  }
  Deno.exit(code);
}

// 1. NATS: NATS_URL, else a temporary nats-server, else a clear message.
const natsUrl = Deno.env.get("NATS_URL") ?? "nats://127.0.0.1:4222";
let nc: NatsConnection;
try {
  nc = await connect({ servers: natsUrl, timeout: 2_000, maxReconnectAttempts: 3 });
  console.log(`NATS: ${natsUrl}`);
} catch {
  if (!natsServerBinary()) {
    console.error(
      `demo: no NATS server at ${natsUrl} and nats-server is not installed.\n` +
        "Start one with JetStream (`nats-server -js`, or `docker run -p 4222:4222 nats -js`),\n" +
        "or set NATS_URL to a server that has JetStream enabled.",
    );
    Deno.exit(1);
  }
  const server = await NatsServer.start();
  cleanup.push(() => server.stop());
  nc = await connect({ servers: server.url });
  console.log(`NATS: nothing at ${natsUrl}; started a temporary nats-server on ${server.url}`);
}
cleanup.push(() => nc.close());
Deno.addSignalListener("SIGINT", () => void shutdown(130));

let jsm!: Awaited<ReturnType<typeof jetstreamManager>>;
try {
  // jetstreamManager() asks the server for its JetStream account info, so it fails here when
  // JetStream is off.
  jsm = await jetstreamManager(nc);
  await jsm.getAccountInfo();
} catch (error) {
  console.error(
    `demo: the NATS server at ${natsUrl} does not have JetStream enabled (start it with -js): ${
      (error as Error).message
    }`,
  );
  await shutdown(1);
}
const js = jetstream(nc);
const stream = `OUTBOX_DEMO_${Date.now()}`;
await jsm.streams.add({ name: stream, subjects: [`${stream}.>`] });
cleanup.push(() => jsm.streams.delete(stream));
await jsm.consumers.add(stream, { durable_name: "shipping", ack_policy: AckPolicy.Explicit });

// 2. Two services, two SQLite databases in a temp dir.
const dir = await Deno.makeTempDir({ prefix: "outbox-demo-" });
cleanup.push(() => Deno.remove(dir, { recursive: true }));
async function openDatabase(name: string): Promise<{ db: DatabaseSync; tx: SqlExecutor }> {
  const db = new DatabaseSync(`${dir}/${name}.db`);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;");
  cleanup.push(() => db.close());
  const executor = nodeSqliteExecutor(db);
  await migrate(executor, { dialect: "sqlite" });
  return { db, tx: executor };
}
const orders = await openDatabase("orders");
orders.db.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, qty INTEGER)");
const shipping = await openDatabase("shipping");
shipping.db.exec("CREATE TABLE shipments (order_id INTEGER PRIMARY KEY, item TEXT NOT NULL)");
console.log(`SQLite: ${dir}/orders.db (orders + outbox), ${dir}/shipping.db (shipments + inbox)`);

// 3. The order service's relay.
let published = 0;
const outbox = new SqlOutboxRepository(orders.tx, "sqlite");
const dispatcher = new OutboxDispatcher(outbox, createJetStreamRuntime(js), {
  onDispatched: () => published++,
  onDead: (message, info) => console.error(`dead: ${message.id}: ${info.lastError}`),
});
cleanup.push(() => dispatcher.stop());

// 4. The shipping service: inbox and shipment in one transaction; a crash after every 25th commit.
let shipped = 0;
let crashes = 0;
const shippingTx = sqliteTransactionRunner(shipping.tx);
const crashy: TransactionRunner<SqlExecutor> = async (work) => {
  const result = await shippingTx(work);
  if ((shipped + crashes) % 25 === 24 && crashes < Math.ceil(orderCount / 25)) {
    crashes++;
    throw new Error("simulated crash after COMMIT, before ack");
  }
  return result;
};
const sample: string[] = [];
const consumer = await consumeWithInbox(await js.consumers.get(stream, "shipping"), {
  scope: "shipping",
  transaction: crashy,
  inbox: (tx) => new SqlInboxRepository(tx, "sqlite"),
  concurrency: 4,
  prefetch: 64,
  nakBackoff: { baseMs: 50, capMs: 200 },
  onError: () => {},
  handler: async (message, { tx }) => {
    const event = message.json<{ orderId: number; item: string }>();
    await tx.query("INSERT INTO shipments (order_id, item) VALUES (?, ?)", [
      event.orderId,
      event.item,
    ]);
    shipped++;
    if (sample.length < 3) sample.push(`${message.subject} ${message.string()}`);
  },
});
cleanup.push(() => consumer.stop());

// 5. Place the orders, one transaction each (order row + outbox row), notify after commit.
const ordersTx = sqliteTransactionRunner(orders.tx);
const items = ["book", "lamp", "kettle", "chair", "plant"];
const started = performance.now();
const progress = setInterval(report, 500);
cleanup.push(() => clearInterval(progress));
function report(): void {
  const line = `orders ${placed}/${orderCount}  published ${published}  shipped ${shipped}  ` +
    `duplicates suppressed ${consumer.stats.duplicates}`;
  if (Deno.stdout.isTerminal()) {
    Deno.stdout.writeSync(new TextEncoder().encode(`\r${line}   `));
  } else {
    console.log(line);
  }
}
let placed = 0;
for (let i = 1; i <= orderCount; i++) {
  const item = items[i % items.length];
  await ordersTx(async (tx) => {
    await tx.query("INSERT INTO orders (id, item, qty) VALUES (?, ?, ?)", [i, item, 1 + (i % 3)]);
    await new SqlOutboxRepository(tx, "sqlite").enqueue({
      id: `order-${i}-created`,
      kind: "event.publish",
      name: "order.created",
      subject: `${stream}.orders.created`,
      payload: JSON.stringify({ orderId: i, item }),
      headers: {},
    });
  });
  placed++;
  dispatcher.notify();
}

// 6. Wait until everything was published and shipped (the consumer's own counters).
await dispatcher.whenIdle();
const publishedAt = performance.now();
// Every crashed delivery comes back once and is suppressed by the inbox.
while (shipped < orderCount || consumer.stats.duplicates < crashes) {
  await new Promise((resolve) => setTimeout(resolve, 20));
}
clearInterval(progress);
report();
if (Deno.stdout.isTerminal()) console.log();
await consumer.stop();
const shipments = Number(shipping.db.prepare("SELECT count(*) AS n FROM shipments").get()?.n);
const seconds = (publishedAt - started) / 1000;

console.log("\nSample events:");
for (const line of sample) console.log(`  ${line}`);
console.log("\nSummary");
console.log(`  orders placed             ${orderCount}`);
console.log(`  events published          ${published} (${(published / seconds).toFixed(0)} msg/s)`);
console.log(`  shipments (exactly once)  ${shipments}`);
console.log(
  `  duplicates suppressed     ${consumer.stats.duplicates} (simulated crashes: ${crashes})`,
);
await shutdown(shipments === orderCount && published === orderCount ? 0 : 1);
