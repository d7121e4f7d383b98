/**
 * The JetStream side of the inbox: a pull-consumer loop that processes each message once.
 *
 * For every message: open a transaction (through the runner you pass), record the message id
 * (`Nats-Msg-Id`, else `<stream>:<sequence>:<stored ns>`, see `messageIdOf`) in the inbox, run
 * the handler, commit, then ack. A duplicate is acked without running the handler. A handler error rolls back and naks
 * with backoff; once the consumer's `max_deliver` is reached the message is terminated and
 * `onPoison` is called. Long handlers send in-progress acks so JetStream does not redeliver
 * mid-handler. `stop()` waits for the handlers in flight.
 *
 * Inboxes that cannot join the handler's transaction (memory, NATS KV: `recordsImmediately`)
 * work with or without a runner: the id is checked before the handler and recorded after it
 * succeeded (after the runner's commit, when there is one). That never loses a
 * message, but a crash between the handler's side effects and the record makes the redelivery
 * run the handler again (at-least-once, not exactly-once).
 *
 * @module
 */

import { errorMessage, OutboxValidationError } from "../core/errors.ts";
import { serverVersionAtLeast, termReasonSinceVersion } from "../core/server_version.ts";
import { positiveInteger } from "../core/limits.ts";
import { backoffCeilingMs, type ResolvedRetryPolicy, resolveRetryPolicy } from "../core/retry.ts";
import { messageIdOf } from "./message_id.ts";
import type { InboxRepository, TransactionRunner } from "../core/types.ts";
import {
  checkInboxRetention,
  type InboxRetentionOptions,
  type RedeliveryConfig,
} from "./retention.ts";

/**
 * What the loop needs of a JetStream message; `M` from `@nats-io/jetstream` has it, and
 * handlers receive the full message type of the consumer you pass.
 *
 * @example
 * ```ts
 * import type { JsMsg } from "@nats-io/jetstream";
 * import type { JetStreamMessageLike } from "@outbox/nats";
 * const accepts = (message: JsMsg): JetStreamMessageLike => message;
 * ```
 */
export interface JetStreamMessageLike {
  /** Message headers (`Nats-Msg-Id` is read from them). */
  readonly headers?: { get(key: string): string } | undefined;
  /** Delivery information. */
  readonly info: {
    readonly stream: string;
    readonly streamSequence: number;
    readonly deliveryCount: number;
    /** When the stream stored the message (ns since the epoch; nats.js parses it lossily). */
    readonly timestampNanos?: number;
  };
  /** When the stream stored the message, exactly (nats.js `JsMsg#timestampNanos`). */
  readonly timestampNanos?: bigint;
  /** Acknowledges processing. */
  ack(): void;
  /** Asks for redelivery after `millis`. */
  nak(millis?: number): void;
  /** Stops redelivery; `reason` only when the server honours it (see `serverVersion`). */
  term(reason?: string): void;
  /** Extends the ack deadline (in-progress ack). */
  working(): void;
}

/**
 * What the loop needs of a pull consumer; `Consumer` from `js.consumers.get(stream, name)` has
 * it.
 *
 * @example
 * ```ts
 * import type { JetStreamClient, JsMsg } from "@nats-io/jetstream";
 * import type { PullConsumerLike } from "@outbox/nats";
 * const billingConsumer = (js: JetStreamClient): Promise<PullConsumerLike<JsMsg>> =>
 *   js.consumers.get("ORDERS", "billing");
 * ```
 */
export interface PullConsumerLike<M extends JetStreamMessageLike> {
  /** The consumer's configuration (max_deliver, ack_wait, backoff). */
  info(): Promise<{ config: RedeliveryConfig }>;
  /** Starts pulling messages. */
  consume(
    options: { max_messages: number; expires?: number },
  ): Promise<AsyncIterable<M> & { close(): Promise<unknown> }>;
}

/**
 * What the handler receives besides the message.
 *
 * @example
 * ```ts
 * import type { InboxHandlerContext } from "@outbox/nats";
 * const show = (ctx: InboxHandlerContext<unknown>) => `${ctx.messageId} #${ctx.deliveryCount}`;
 * ```
 */
export interface InboxHandlerContext<Tx> {
  /** The transaction the inbox record lives in (`undefined` without a runner). */
  tx: Tx;
  /** The id recorded in the inbox. */
  messageId: string;
  /** How many times JetStream delivered the message (1 on the first delivery). */
  deliveryCount: number;
}

/**
 * Options for {@linkcode consumeWithInbox}.
 *
 * @example
 * ```ts
 * import {
 *   type InboxConsumerOptions,
 *   type JetStreamMessageLike,
 *   MemoryInboxRepository,
 * } from "@outbox/nats";
 * const options: InboxConsumerOptions<JetStreamMessageLike, undefined> = {
 *   scope: "billing",
 *   inbox: new MemoryInboxRepository(),
 *   handler: async (message) => console.log(message.info.streamSequence),
 * };
 * ```
 */
export interface InboxConsumerOptions<M extends JetStreamMessageLike, Tx> {
  /** The inbox scope ids are recorded under, for example the consumer's name. */
  scope: string;
  /**
   * Runs each message's work in one database transaction. With it, the inbox record and the
   * handler's writes commit together (exactly-once); without it, see the module doc.
   */
  transaction?: TransactionRunner<Tx>;
  /** The inbox, or a function giving the inbox bound to a transaction. */
  inbox: InboxRepository | ((tx: Tx) => InboxRepository);
  /** Applies the message. Throw to roll back and have it redelivered. */
  handler: (message: M, context: InboxHandlerContext<Tx>) => Promise<void>;
  /** Handlers running at once. @default {1} */
  concurrency?: number;
  /** Messages pulled ahead of processing. @default {concurrency * 2} */
  prefetch?: number;
  /**
   * How long one pull request lives on the server. The server sends idle heartbeats every half of
   * it, and two missed heartbeats make the client pull again: on a cluster, a pull request left
   * with a consumer leader that died is replaced after about this long (with nats.js's 30 s
   * default, consumption stalled for ~50 s after a leader change). At least 1000.
   * @default {5000}
   */
  pullExpiresMs?: number;
  /**
   * The nats-server version (`nc.info?.version`). From 2.10.4 on, a poisoned message is
   * terminated with a reason (`poisoned after <n> deliveries: <error>`, shown in the server's
   * `MSG_TERMINATED` advisory); older servers ignore a terminate ack that carries a reason (the
   * message would be redelivered), so they get none.
   * @default {read from a nats.js consumer's connection; unknown means no reason}
   */
  serverVersion?: string;
  /** Nak delay after delivery `n` is `min(capMs, baseMs * 2 ** (n - 1))`. @default {{ baseMs: 1000, capMs: 60000 }} */
  nakBackoff?: { baseMs?: number; capMs?: number };
  /** In-progress ack period while a handler runs. @default {a third of the consumer's ack_wait} */
  inProgressIntervalMs?: number;
  /** Called after a message was terminated because it reached `max_deliver`. */
  onPoison?: (message: M, error: unknown) => void | Promise<void>;
  /** Called for a duplicate that was acked without running the handler. */
  onDuplicate?: (message: M, messageId: string) => void;
  /** Called for every handler or infrastructure error (guarded: its own throws are ignored). */
  onError?: (error: unknown, message?: M) => void;
  /** Retention check at start (see {@linkcode checkInboxRetention}). */
  retention?: InboxRetentionOptions;
  /**
   * Wraps the processing of one message, for instrumentation (tracing spans): `process()`
   * resolves with what became of the message (it never rejects: a handler failure is handled
   * by the loop and resolves as `"failed"` / `"poisoned"` with its error).
   * @default {run it as is}
   */
  around?: (message: M, process: () => Promise<InboxProcessResult>) => Promise<unknown>;
}

/**
 * What became of one delivery: applied and acked, acked as a duplicate, naked after a handler
 * failure, or terminated after `max_deliver`.
 *
 * @example
 * ```ts
 * import type { InboxOutcome } from "@outbox/nats";
 * const outcome: InboxOutcome = "duplicate";
 * ```
 */
export type InboxOutcome = "processed" | "duplicate" | "failed" | "poisoned";

/**
 * What `process()` in {@linkcode InboxConsumerOptions.around} resolves to: the outcome, and the
 * handler's error for `"failed"` / `"poisoned"`.
 *
 * @example
 * ```ts
 * import type { InboxProcessResult } from "@outbox/nats";
 * const result: InboxProcessResult = { outcome: "failed", error: new Error("boom") };
 * ```
 */
export interface InboxProcessResult {
  /** What became of the delivery. */
  outcome: InboxOutcome;
  /** The handler's (or transaction's) error, when it failed. */
  error?: unknown;
}

/**
 * Counts of what an {@linkcode InboxConsumer} did.
 *
 * @example
 * ```ts
 * import type { InboxConsumerStats } from "@outbox/nats";
 * const empty: InboxConsumerStats = { processed: 0, duplicates: 0, failed: 0, poisoned: 0 };
 * ```
 */
export interface InboxConsumerStats {
  /** Messages whose handler committed and that were acked. */
  processed: number;
  /** Duplicates acked without running the handler. */
  duplicates: number;
  /** Handler failures (naked for redelivery or terminated). */
  failed: number;
  /** Messages terminated after `max_deliver`. */
  poisoned: number;
}

/**
 * A running consumer loop.
 *
 * @example
 * ```ts
 * import type { InboxConsumer } from "@outbox/nats";
 * async function shutdown(running: InboxConsumer): Promise<void> {
 *   await running.stop(); // waits for the handlers in flight
 *   console.log("processed", running.stats.processed, "duplicates", running.stats.duplicates);
 * }
 * ```
 */
export interface InboxConsumer {
  /** Stops pulling, waits for the handlers in flight, and resolves when the loop ended. */
  stop(): Promise<void>;
  /** Resolves when the loop ended (after `stop()`, or when the consumer went away). */
  readonly closed: Promise<void>;
  /** What the loop did so far. */
  readonly stats: Readonly<InboxConsumerStats>;
}

/**
 * Starts processing the messages of a pull consumer with the inbox. Pass the consumer from
 * `js.consumers.get(stream, name)`; the inbox scope is usually the consumer's name.
 *
 * @example
 * ```ts ignore
 * import postgres from "postgres";
 * import { jetstream } from "@nats-io/jetstream";
 * import { connect } from "@nats-io/transport-node";
 * import {
 *   consumeWithInbox,
 *   postgresJsExecutor,
 *   type SqlExecutor,
 *   SqlInboxRepository,
 * } from "@outbox/nats";
 *
 * const db = postgresJsExecutor(postgres("postgres://postgres@127.0.0.1:5432/app"));
 * const js = jetstream(await connect({ servers: "nats://127.0.0.1:4222" }));
 * const running = await consumeWithInbox(await js.consumers.get("ORDERS", "billing"), {
 *   scope: "billing",
 *   transaction: (work) => db.transaction!(work),
 *   // Annotating tx lets TypeScript infer the transaction type for the handler.
 *   inbox: (tx: SqlExecutor) => new SqlInboxRepository(tx, "postgres"),
 *   handler: async (message, { tx }) => {
 *     const order = message.json<{ id: number }>();
 *     await tx.query("UPDATE orders SET billed = true WHERE id = $1", [order.id]);
 *   },
 * });
 * ```
 */
export async function consumeWithInbox<M extends JetStreamMessageLike, Tx = undefined>(
  consumer: PullConsumerLike<M>,
  options: InboxConsumerOptions<M, Tx>,
): Promise<InboxConsumer> {
  const concurrency = positiveInteger("concurrency", options.concurrency ?? 1);
  if (options.prefetch !== undefined) positiveInteger("prefetch", options.prefetch);
  if (
    options.pullExpiresMs !== undefined &&
    (!Number.isSafeInteger(options.pullExpiresMs) || options.pullExpiresMs < 1_000)
  ) {
    throw new OutboxValidationError(
      "pullExpiresMs",
      `pullExpiresMs must be an integer >= 1000, got ${options.pullExpiresMs}`,
    );
  }
  if (options.inProgressIntervalMs !== undefined && options.inProgressIntervalMs < 100) {
    throw new OutboxValidationError(
      "inProgressIntervalMs",
      `inProgressIntervalMs must be >= 100, got ${options.inProgressIntervalMs}`,
    );
  }
  if (typeof options.scope !== "string") {
    throw new OutboxValidationError("scope", "scope (the inbox consumer scope) must be a string");
  }
  if (!options.transaction && typeof options.inbox === "function") {
    throw new OutboxValidationError(
      "inbox",
      "an inbox bound to a transaction needs the `transaction` runner",
    );
  }
  if (
    options.transaction && typeof options.inbox !== "function" &&
    options.inbox.recordsImmediately !== true
  ) {
    // Such an inbox records outside the handler's transaction: over the runner's own connection
    // it waits forever for the transaction it runs in, over another one it commits the id before
    // the handler ran (a failed handler's redelivery would be acked as a duplicate).
    throw new OutboxValidationError(
      "inbox",
      "with a transaction runner, pass the inbox as a function of the transaction, such as " +
        "(tx) => new SqlInboxRepository(tx, dialect), so the id commits with the handler's " +
        "writes; only an inbox that records immediately (memory, NATS KV) may be passed as is",
    );
  }
  if (
    (!options.transaction || (options.inbox as InboxRepository).recordsImmediately === true) &&
    typeof (options.inbox as InboxRepository).has !== "function"
  ) {
    throw new OutboxValidationError(
      "inbox",
      "without a transaction runner, or with an inbox that records immediately, the inbox must " +
        "offer has() (memory and NATS KV inboxes do)",
    );
  }
  const nak = resolveRetryPolicy({
    baseMs: options.nakBackoff?.baseMs ?? 1_000,
    capMs: options.nakBackoff?.capMs ?? 60_000,
  });
  const { config } = await consumer.info();
  if (options.retention) {
    checkInboxRetention(options.retention, { consumer: config, nakCapMs: nak.capMs });
  }
  const termReason = serverVersionAtLeast(
    options.serverVersion ?? connectedServerVersion(consumer),
    termReasonSinceVersion,
  );
  const loop = new ConsumerLoop(config, options, concurrency, nak, termReason);
  const messages = await consumer.consume({
    max_messages: options.prefetch ?? concurrency * 2,
    expires: options.pullExpiresMs ?? 5_000,
  });
  loop.run(messages);
  return loop;
}

class ConsumerLoop<M extends JetStreamMessageLike, Tx> implements InboxConsumer {
  readonly stats: InboxConsumerStats = { processed: 0, duplicates: 0, failed: 0, poisoned: 0 };
  readonly closed: Promise<void>;
  #options: InboxConsumerOptions<M, Tx>;
  #concurrency: number;
  #nak: ResolvedRetryPolicy;
  #termReason: boolean;
  #scope: string;
  #maxDeliver: number;
  #heartbeatMs: number;
  #messages: { close(): Promise<unknown> } | undefined;
  #stopping = false;
  #inFlight = new Set<Promise<void>>();
  #resolveClosed!: () => void;

  constructor(
    config: RedeliveryConfig,
    options: InboxConsumerOptions<M, Tx>,
    concurrency: number,
    nak: ResolvedRetryPolicy,
    termReason: boolean,
  ) {
    this.#options = options;
    this.#concurrency = concurrency;
    this.#nak = nak;
    this.#termReason = termReason;
    this.#scope = options.scope;
    this.#maxDeliver = config.max_deliver ?? -1;
    const ackWaitMs = (config.ack_wait ?? 30_000_000_000) / 1_000_000;
    this.#heartbeatMs = options.inProgressIntervalMs ?? Math.max(100, Math.floor(ackWaitMs / 3));
    this.closed = new Promise((resolve) => this.#resolveClosed = resolve);
  }

  run(messages: AsyncIterable<M> & { close(): Promise<unknown> }): void {
    this.#messages = messages;
    void this.#loop(messages);
  }

  async stop(): Promise<void> {
    if (!this.#stopping) {
      this.#stopping = true;
      await this.#messages?.close().catch(() => {});
    }
    await this.closed;
  }

  async #loop(messages: AsyncIterable<M>): Promise<void> {
    try {
      for await (const message of messages) {
        if (this.#stopping) {
          // Pulled but not started: hand it back at once instead of waiting for ack_wait.
          message.nak();
          continue;
        }
        while (this.#inFlight.size >= this.#concurrency) await Promise.race(this.#inFlight);
        if (this.#stopping) {
          message.nak(); // stop() came while it waited for a free slot
          continue;
        }
        const task = this.#process(message).finally(() => this.#inFlight.delete(task));
        this.#inFlight.add(task);
      }
    } catch (error) {
      this.#report(error);
    } finally {
      await Promise.allSettled([...this.#inFlight]);
      this.#resolveClosed();
    }
  }

  async #process(message: M): Promise<void> {
    const around = this.#options.around;
    const process = () => this.#handle(message);
    try {
      await (around ? around(message, process) : process());
    } catch (error) {
      this.#report(error, message);
    }
  }

  async #handle(message: M): Promise<InboxProcessResult> {
    const deliveryCount = message.info.deliveryCount;
    const heartbeat = setInterval(() => message.working(), this.#heartbeatMs);
    let duplicate = false;
    let messageId = "";
    try {
      messageId = messageIdOf(message);
      const options = this.#options;
      const immediate = typeof options.inbox !== "function" &&
        options.inbox.recordsImmediately === true;
      if (options.transaction && !immediate) {
        // A factory may hand out an inbox that writes at once (memory, NATS KV): recording it
        // before the handler would survive the rollback, so it is checked here and recorded
        // only after the commit, as below.
        let recordAfterCommit: InboxRepository | undefined;
        await options.transaction(async (tx) => {
          const inbox = typeof options.inbox === "function" ? options.inbox(tx) : options.inbox;
          if (inbox.recordsImmediately === true) {
            if (await hasOrThrow(inbox, messageId, this.#scope)) {
              duplicate = true;
              return;
            }
            await options.handler(message, { tx, messageId, deliveryCount });
            recordAfterCommit = inbox;
            return;
          }
          if (!(await inbox.record(messageId, { consumer: this.#scope }))) {
            duplicate = true;
            return;
          }
          await options.handler(message, { tx, messageId, deliveryCount });
        });
        // false here means a concurrent delivery recorded it first: both ran the handler.
        if (recordAfterCommit) await recordAfterCommit.record(messageId, { consumer: this.#scope });
      } else {
        // The inbox writes at once (memory, NATS KV): check before the handler, record only
        // after it succeeded (and after its transaction committed, when there is one), so a
        // failure or a rollback never leaves the id recorded without the work.
        const inbox = options.inbox as InboxRepository;
        if (await inbox.has!(messageId, { consumer: this.#scope })) {
          duplicate = true;
        } else {
          if (options.transaction) {
            await options.transaction((tx) =>
              options.handler(message, { tx, messageId, deliveryCount })
            );
          } else {
            await options.handler(message, { tx: undefined as Tx, messageId, deliveryCount });
          }
          // false here means a concurrent delivery recorded it first: both ran the handler.
          await inbox.record(messageId, { consumer: this.#scope });
        }
      }
    } catch (error) {
      clearInterval(heartbeat);
      return { outcome: await this.#fail(message, error, deliveryCount), error };
    }
    clearInterval(heartbeat);
    message.ack();
    if (duplicate) {
      this.stats.duplicates += 1;
      guard(() => this.#options.onDuplicate?.(message, messageId));
      return { outcome: "duplicate" };
    }
    this.stats.processed += 1;
    return { outcome: "processed" };
  }

  async #fail(message: M, error: unknown, deliveryCount: number): Promise<InboxOutcome> {
    this.stats.failed += 1;
    this.#report(error, message);
    if (this.#maxDeliver > 0 && deliveryCount >= this.#maxDeliver) {
      // Servers before 2.10.4 ignore a "+TERM <reason>" ack entirely: no reason for them.
      if (this.#termReason) {
        message.term(
          `poisoned after ${deliveryCount} deliveries: ${errorMessage(error)}`.slice(0, 512),
        );
      } else {
        message.term();
      }
      this.stats.poisoned += 1;
      try {
        await this.#options.onPoison?.(message, error);
      } catch (hookError) {
        this.#report(hookError, message);
      }
      return "poisoned";
    }
    message.nak(backoffCeilingMs(deliveryCount, this.#nak));
    return "failed";
  }

  #report(error: unknown, message?: M): void {
    guard(() => this.#options.onError?.(error, message));
  }
}

/** `inbox.has()`, for an inbox that records immediately (which must be able to tell). */
function hasOrThrow(inbox: InboxRepository, messageId: string, consumer: string): Promise<boolean> {
  if (typeof inbox.has !== "function") {
    throw new OutboxValidationError(
      "inbox",
      "an inbox that records immediately must offer has(): it is checked before the handler " +
        "and recorded after the handler's transaction committed",
    );
  }
  return inbox.has(messageId, { consumer });
}

/**
 * The server version of a nats.js consumer's connection (`consumer.api.nc.info.version`), read
 * defensively: other consumer implementations have none.
 */
function connectedServerVersion(consumer: unknown): string | undefined {
  try {
    const version = (consumer as { api?: { nc?: { info?: { version?: unknown } } } })?.api?.nc
      ?.info?.version;
    return typeof version === "string" ? version : undefined;
  } catch {
    return undefined;
  }
}

function guard(fn: () => void): void {
  try {
    fn();
  } catch {
    // Hooks must not break the loop.
  }
}
