/**
 * An inbox consumer process for the fault suite:
 * `deno run -A inbox_consumer.ts '<InboxConsumerConfig JSON>'`.
 *
 * consumeWithInbox on a durable pull consumer, with the SQL inbox in the handler's Postgres
 * transaction. The handler increments a per-message counter row (a business side effect that
 * does NOT dedupe: a second run would make it 2). After each COMMIT the transaction runner
 * reports `committed`; with `hangAfterCommits` it reports `hanging` after that many commits and
 * blocks before the ack, until the test kills the process.
 *
 * @module
 */

import postgres from "postgres";
import { jetstream, type JsMsg } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { consumeWithInbox, postgresJsExecutor, SqlInboxRepository } from "../../../mod.ts";
import { emit, type InboxConsumerConfig } from "./protocol.ts";

const config = JSON.parse(Deno.args[0]) as InboxConsumerConfig;
const nc = await connect({
  servers: config.natsUrl.split(","),
  reconnect: true,
  maxReconnectAttempts: -1,
  reconnectTimeWait: 100,
});
const sql = postgres(config.postgresUrl, { max: 4, onnotice: () => {} });
const tables = { outbox: config.outboxTable, inbox: config.inboxTable };
const consumer = await jetstream(nc).consumers.get(config.stream, config.durable);

let commits = 0;
// The id each transaction's handler applied, per transaction (several run at once with
// concurrency > 1: one shared variable let a transaction starting elsewhere erase it, and the
// commits were undercounted).
const handledIn = new WeakMap<postgres.TransactionSql, string>();
const running = await consumeWithInbox<JsMsg, postgres.TransactionSql>(consumer, {
  scope: config.durable,
  concurrency: config.concurrency ?? 1,
  transaction: async (work) => {
    let handled: string | undefined;
    const result = await sql.begin(async (tx) => {
      const value = await work(tx);
      handled = handledIn.get(tx);
      return value;
    });
    // Committed; consumeWithInbox acks once this resolves.
    if (handled !== undefined) {
      commits += 1;
      emit({ event: "committed", id: handled, commits });
      if (commits === config.hangAfterCommits) {
        emit({ event: "hanging", id: handled, commits });
        await new Promise(() => {});
      }
    }
    return result;
  },
  inbox: (tx) => new SqlInboxRepository(postgresJsExecutor(tx), "postgres", tables),
  handler: async (_message, { tx, messageId }) => {
    await tx.unsafe(
      `INSERT INTO ${config.counterTable} (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = ${config.counterTable}.n + 1`,
      [messageId],
    );
    handledIn.set(tx, messageId);
  },
  onDuplicate: (_message, id) => emit({ event: "duplicate", id }),
  onError: (error) => emit({ event: "error", message: String(error) }),
});

Deno.addSignalListener("SIGTERM", async () => {
  await running.stop();
  emit({ event: "consumer-stopped", ...running.stats });
  await sql.end({ timeout: 1 });
  await nc.close();
  Deno.exit(0);
});
emit({ event: "ready", pid: Deno.pid });
