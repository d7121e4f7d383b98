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

/** Payload prefix of the check notification (never passed to `onWake`). */
const probePrefix = "outbox-nats:check:";

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
  /** postgres.js `sql.notify(channel, payload)`: sends the check notification when present. */
  notify?(channel: string, payload: string): PromiseLike<unknown>;
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
  /**
   * After the LISTEN, send one check notification on the channel (through `sql.notify`) and wait
   * this long for it to come back. When it does not (PgBouncer in transaction pooling mode
   * accepts LISTEN but never delivers notifications), stop listening, call `onWarning`, and
   * return a subscription in `"polling"` mode. 0 skips the check.
   *
   * @default {2000}
   */
  verifyTimeoutMs?: number;
  /**
   * Told when notifications do not arrive and the subscription falls back to polling.
   *
   * @default {console.warn}
   */
  onWarning?: (message: string) => void;
}

/**
 * How wake-ups arrive: `listen` (notifications arrive), or `polling` (they do not reach this
 * connection, e.g. behind PgBouncer in transaction pooling mode: `onWake` is never called and the
 * dispatcher finds work by its poll, `idleRetryMs`).
 *
 * @example
 * ```ts
 * import type { OutboxWakeupMode } from "@outbox/nats";
 * const mode: OutboxWakeupMode = "polling";
 * ```
 */
export type OutboxWakeupMode = "listen" | "polling";

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
  /** Whether notifications arrive (`listen`) or the caller must rely on polling (`polling`). */
  readonly mode: OutboxWakeupMode;
  /** Stops listening (UNLISTEN). */
  close(): Promise<void>;
}

/**
 * LISTENs for outbox enqueues (repositories created with `notify`) on postgres.js's dedicated
 * listen connection and calls `onWake` for each notification, and once whenever the LISTEN is
 * (re)established. Keep polling as the fallback (notifications are lost while disconnected).
 * It checks that notifications arrive (one round trip, see `verifyTimeoutMs`); behind PgBouncer
 * in transaction pooling mode they never do, and it warns and returns `mode: "polling"`.
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
  const verifyTimeoutMs = options.verifyTimeoutMs ?? 2_000;
  if (!Number.isFinite(verifyTimeoutMs) || verifyTimeoutMs < 0) {
    throw new OutboxValidationError("verifyTimeoutMs", "verifyTimeoutMs must be a number >= 0");
  }
  const wake = (reason: OutboxWakeupReason, payload?: string) => {
    try {
      options.onWake(reason, payload);
    } catch {
      // a throwing callback must not break the listen connection
    }
  };
  const probe = `${probePrefix}${crypto.randomUUID()}`;
  let probed: () => void = () => {};
  const arrived = new Promise<void>((resolve) => probed = resolve);
  const meta = await sql.listen(
    channel,
    (payload) => {
      if (payload === probe) probed();
      else if (!payload?.startsWith(probePrefix)) wake("notify", payload);
    },
    () => wake("listen"),
  );
  if (verifyTimeoutMs > 0 && typeof sql.notify === "function") {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), verifyTimeoutMs);
    });
    let ok: boolean;
    try {
      ok = await Promise.race([
        Promise.resolve(sql.notify(channel, probe)).then(() => arrived).then(() => true),
        timedOut,
      ]);
    } catch (error) {
      await Promise.resolve(meta.unlisten()).catch(() => {});
      throw error;
    } finally {
      clearTimeout(timer);
    }
    if (!ok) {
      await Promise.resolve(meta.unlisten()).catch(() => {});
      const warn = options.onWarning ?? ((message: string) => console.warn(message));
      try {
        warn(
          `outbox: LISTEN on "${channel}" receives no notifications (a pooler in transaction mode, such as PgBouncer?); no wake-ups, the dispatcher relies on polling`,
        );
      } catch {
        // a throwing warning hook must not fail the caller
      }
      return { channel, mode: "polling", close: () => Promise.resolve() };
    }
  }
  let closed = false;
  return {
    channel,
    mode: "listen",
    async close() {
      if (closed) return;
      closed = true;
      await meta.unlisten();
    },
  };
}
