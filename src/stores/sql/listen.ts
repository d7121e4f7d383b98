/**
 * Cross-process wake-up on Postgres: enqueues issue `pg_notify` inside their transaction
 * (delivered on commit), and a dispatcher LISTENs on a dedicated connection and wakes at once
 * instead of waiting for its next poll. Polling stays the fallback: a notification is a hint,
 * never the only way work is found.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";
import { resolveSqlOutboxTables, type SqlOutboxTables } from "./tables.ts";

/**
 * The part of a postgres.js `sql` handle the wake-up helper uses: `listen`, which runs on a
 * dedicated connection that postgres.js opens (and re-opens after a disconnect) by itself.
 *
 * @example
 * ```ts
 * import postgres from "postgres";
 * import type { PostgresJsListener } from "@outbox/nats";
 * const sql: PostgresJsListener = postgres("postgres://localhost/app");
 * ```
 */
export interface PostgresJsListener {
  /** postgres.js `sql.listen(channel, onnotify, onlisten)`. */
  listen(
    channel: string,
    onnotify: (payload: string) => void,
    onlisten?: () => void,
  ): PromiseLike<{ unlisten(): PromiseLike<unknown> }>;
}

/**
 * Why a wake-up fired: `notify` for a notification, `listen` when the LISTEN was (re)established
 * (notifications sent while the connection was down are lost, so the dispatcher should look).
 *
 * @example
 * ```ts
 * import type { OutboxWakeupReason } from "@outbox/nats";
 * const reason: OutboxWakeupReason = "notify";
 * ```
 */
export type OutboxWakeupReason = "notify" | "listen";

/**
 * Options for {@linkcode listenForOutboxWakeups}.
 *
 * @example
 * ```ts
 * import type { OutboxWakeupOptions } from "@outbox/nats";
 * const options: OutboxWakeupOptions = { onWake: () => console.log("work to do") };
 * ```
 */
export interface OutboxWakeupOptions {
  /** Called on every notification and every (re)LISTEN; typically `() => dispatcher.notify()`. */
  onWake: (reason: OutboxWakeupReason, payload?: string) => void;
  /**
   * The channel; must equal the repository's `notify` channel.
   *
   * @default {the outbox table name, as `notify: true` uses}
   */
  channel?: string;
  /**
   * Table names, for the default channel.
   *
   * @default {defaultSqlOutboxTables}
   */
  tables?: Partial<SqlOutboxTables>;
}

/**
 * A running LISTEN subscription.
 *
 * @example
 * ```ts
 * import type { OutboxWakeupSubscription } from "@outbox/nats";
 * async function shutdown(subscription: OutboxWakeupSubscription): Promise<void> {
 *   console.log("stop listening on", subscription.channel);
 *   await subscription.close();
 * }
 * ```
 */
export interface OutboxWakeupSubscription {
  /** The channel listened on. */
  readonly channel: string;
  /** Stops listening (UNLISTEN). */
  close(): Promise<void>;
}

/**
 * LISTENs for outbox enqueues (repositories created with `notify`) on postgres.js's dedicated
 * listen connection and calls `onWake` for each notification, and once whenever the LISTEN is
 * (re)established. Keep polling as the fallback (notifications are lost while disconnected).
 * Behind PgBouncer in transaction mode LISTEN does not work: leave `notify` off and poll.
 *
 * @example
 * ```ts ignore
 * import postgres from "postgres";
 * import { listenForOutboxWakeups } from "@outbox/nats";
 *
 * const sql = postgres("postgres://postgres@127.0.0.1:5432/app");
 * const subscription = await listenForOutboxWakeups(sql, {
 *   onWake: () => console.log("outbox has work"), // e.g. dispatcher.notify()
 * });
 * // ... later
 * await subscription.close();
 * ```
 */
export async function listenForOutboxWakeups(
  sql: PostgresJsListener,
  options: OutboxWakeupOptions,
): Promise<OutboxWakeupSubscription> {
  if (typeof options?.onWake !== "function") {
    throw new OutboxValidationError("onWake", "onWake must be a function");
  }
  const channel = options.channel ?? resolveSqlOutboxTables(options.tables).outbox;
  if (typeof channel !== "string" || channel.length === 0 || channel.length > 63) {
    throw new OutboxValidationError(
      "channel",
      "channel must be a non-empty string of at most 63 characters",
    );
  }
  const wake = (reason: OutboxWakeupReason, payload?: string) => {
    try {
      options.onWake(reason, payload);
    } catch {
      // a throwing callback must not break the listen connection
    }
  };
  const meta = await sql.listen(
    channel,
    (payload) => wake("notify", payload),
    () => wake("listen"),
  );
  let closed = false;
  return {
    channel,
    async close() {
      if (closed) return;
      closed = true;
      await meta.unlisten();
    },
  };
}
