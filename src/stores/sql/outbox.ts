/**
 * The SQL outbox: Postgres or SQLite through a caller-owned executor, so enqueues join the
 * caller's transaction.
 *
 * @module
 */

import {
  OutboxCorruptRecordError,
  OutboxStorageConflictError,
  OutboxValidationError,
} from "../../core/errors.ts";
import { assertOutboxIdentity } from "../../core/identity.ts";
import {
  checkedBatchSize,
  checkedDate,
  checkedLeaseMs,
  checkedLimit,
  checkedSequence,
  checkedUnblockAction,
} from "../../core/limits.ts";
import { newClaimToken } from "../../core/fence.ts";
import { storableErrorText, storableOutcome } from "../../core/storable_text.ts";
import { addMs, toIsoTimestamp } from "../../core/time.ts";
import type {
  JsonValue,
  OutboxAdmin,
  OutboxBlockedKey,
  OutboxBlockedKeysOptions,
  OutboxClaim,
  OutboxClaimOptions,
  OutboxDeadLetter,
  OutboxDispatchedOptions,
  OutboxEnqueueOptions,
  OutboxFailure,
  OutboxListDeadOptions,
  OutboxMark,
  OutboxMessage,
  OutboxPruneOptions,
  OutboxPruneResult,
  OutboxRecord,
  OutboxRepository,
  OutboxStats,
  OutboxUnblockKeyOptions,
} from "../../core/types.ts";
import {
  checkedMaxPayloadBytes,
  checkRecordSize,
  validateOrderingKey,
  validateOutboxRecord,
} from "../../core/validate.ts";
import { type ClaimWrite, decodeOutboxRow, decodeOutboxRowLoosely, integer } from "./decode.ts";
import { claimColumns, type OutboxStatements, outboxStatements } from "./dialects.ts";
import { PlannedStatements } from "./plan_generations.ts";
import { pruneBatch } from "./prune_batches.ts";
import { retireIdleKeys, retireKeyStatements } from "./retire_keys.ts";
import type { SqlExecutor, SqlRow } from "./executors.ts";
import { withSchemaErrors } from "./schema_errors.ts";
import {
  checkDialect,
  type ResolvedSqlOutboxTables,
  resolveSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxTables,
} from "./tables.ts";

/**
 * Options for {@linkcode SqlOutboxRepository}.
 *
 * @example
 * ```ts
 * import type { SqlOutboxRepositoryOptions } from "@outbox/nats";
 * const options: SqlOutboxRepositoryOptions = { notify: true };
 * ```
 */
export interface SqlOutboxRepositoryOptions {
  /**
   * Postgres only: every enqueue also issues `pg_notify(channel, <outbox table>)` in the same
   * statement, so the notification is delivered when (and only if) the transaction commits.
   * `true` uses the outbox table name as the channel; a string names the channel. A dispatcher
   * can wake on it with `listenForOutboxWakeups`. Turn it off behind PgBouncer in transaction
   * mode (LISTEN needs a session) and rely on polling.
   *
   * @default {false}
   */
  notify?: boolean | string;
  /**
   * Largest record accepted at enqueue: payload plus headers, in bytes. A larger one is refused
   * with `OutboxPayloadTooLargeError` before any statement runs (NATS would refuse to publish
   * it, so it could only go dead). Raise it only when your server's `max_payload` is larger than
   * NATS's default 1 MiB.
   *
   * @default {983040 (1 MiB less 64 KiB for the headers the dispatcher adds)}
   */
  maxPayloadBytes?: number;
}

/**
 * An outbox in a Postgres or SQLite table, over an executor you own. Enqueue through an
 * executor bound to your transaction (postgres.js `tx`, a `pg` client inside `BEGIN`, or on
 * SQLite the `tx` handle of `executor.transaction(fn)` / `sqliteTransactionRunner`) and the
 * outbox row commits or rolls back with your business rows. (A SQLite executor never joins a
 * transaction opened on the connection outside the library, such as a raw
 * `db.exec("BEGIN IMMEDIATE")`: it waits for it to end; see `SqliteExecutorOptions`.) Constructing one is cheap (statement texts are cached), so
 * create it per transaction.
 *
 * Claims are one statement (Postgres: `FOR UPDATE SKIP LOCKED`), FIFO by enqueue order, and
 * read only rows still to dispatch through a partial index, so their cost does not grow with
 * the dispatched history kept. `markMany` settles a batch in one statement, fenced per row.
 * Needs schema version 3: run {@linkcode migrate} (or the artifacts of
 * `getSqlOutboxMigrations`) first.
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { migrate, nodeSqliteExecutor, SqlOutboxRepository } from "@outbox/nats";
 *
 * const executor = nodeSqliteExecutor(new DatabaseSync(":memory:"));
 * await migrate(executor, { dialect: "sqlite" });
 * const outbox = new SqlOutboxRepository(executor, "sqlite");
 * await outbox.enqueue({
 *   id: "order-1-created", kind: "event.publish", name: "order.created",
 *   subject: "orders.created", payload: JSON.stringify({ id: 1 }), headers: {},
 * });
 * const claimed = await outbox.claimDue(25, new Date());
 * await outbox.markMany(claimed.map((claim) => ({ claim, state: "dispatched" })), new Date());
 * ```
 */
export class SqlOutboxRepository implements OutboxRepository, OutboxAdmin {
  /**
   * The executor statements run on: yours, with a missing table or column reported as
   * `OutboxSchemaError`.
   */
  readonly executor: SqlExecutor;
  /** The SQL dialect. */
  readonly dialect: SqlDialect;
  /** The validated table names. */
  readonly tables: ResolvedSqlOutboxTables;
  /** The statements, planned again as the table grows (see plan_generations.ts). */
  readonly #plans: PlannedStatements;
  readonly #channel: string | undefined;
  readonly #maxPayloadBytes: number;

  /**
   * Creates the repository. Throws `OutboxValidationError` for an unknown dialect, a table name
   * that is not a plain identifier, or `notify` on SQLite; no statement runs before that.
   */
  constructor(
    executor: SqlExecutor,
    dialect: SqlDialect,
    tables: SqlOutboxTables | Partial<SqlOutboxTables> = {},
    options: SqlOutboxRepositoryOptions = {},
  ) {
    this.dialect = checkDialect(dialect);
    this.tables = resolveSqlOutboxTables(tables);
    if (typeof executor?.query !== "function") {
      throw new OutboxValidationError("executor", "SQL executor must have query(sql, params)");
    }
    this.executor = withSchemaErrors(executor, this.dialect, this.tables, this.tables.outbox);
    this.#channel = notifyChannel(options.notify, this.dialect, this.tables);
    this.#plans = new PlannedStatements(
      outboxStatements(this.dialect, this.tables, this.#channel !== undefined),
      this.dialect,
    );
    this.#maxPayloadBytes = checkedMaxPayloadBytes(options.maxPayloadBytes);
  }

  /** Stores a record as `pending` (one statement); see {@linkcode OutboxRepository.enqueue}. */
  async enqueue(record: OutboxRecord, options: OutboxEnqueueOptions = {}): Promise<OutboxMessage> {
    const valid = validateOutboxRecord(record);
    checkRecordSize(valid, this.#maxPayloadBytes);
    // A keyed insert does nothing when a concurrent transaction gave the key a head first (see
    // dialects.ts): inserted again, it sees that head and waits behind it.
    for (let attempt = 0; attempt < maxInsertRounds; attempt++) {
      const now = new Date().toISOString();
      const params: unknown[] = [
        valid.id,
        valid.kind,
        valid.name,
        valid.subject,
        valid.payload,
        JSON.stringify(valid.headers),
        now,
        valid.orderingKey ?? null,
      ];
      if (this.#channel !== undefined) params.push(this.#channel);
      const [inserted] = await this.executor.query(this.#sql.insertOne, params);
      if (inserted) return decodeOutboxRow(inserted);
      const existing = await this.get(valid.id);
      if (existing) {
        assertOutboxIdentity(existing, valid, options.contextHeaders);
        return existing;
      }
      if (valid.orderingKey === undefined) break;
    }
    throw new OutboxStorageConflictError(valid.id);
  }

  /**
   * Stores many records in one statement. All records are validated first; when an id already
   * exists, its stored content is compared before anything of the batch is inserted, so an
   * identity conflict stores nothing. (Only a concurrent enqueue of the same id with different
   * content, racing this call, can leave the batch's other records inserted; inside a
   * transaction the error rolls them back with it.)
   */
  async enqueueMany(
    records: readonly OutboxRecord[],
    options: OutboxEnqueueOptions = {},
  ): Promise<OutboxMessage[]> {
    // contextHeaders may be a one-shot iterator, and it is read once per comparison.
    options = { ...options, contextHeaders: options.contextHeaders && [...options.contextHeaders] };
    const valid = records.map(validateOutboxRecord);
    for (const record of valid) checkRecordSize(record, this.#maxPayloadBytes);
    const firsts = new Map<string, OutboxRecord>();
    for (const record of valid) {
      const earlier = firsts.get(record.id);
      if (earlier) assertOutboxIdentity(earlier, record, options.contextHeaders);
      else firsts.set(record.id, record);
    }
    if (firsts.size === 0) return [];
    if (valid.length === 1) return [await this.enqueue(valid[0], options)];
    const stored = new Map<string, OutboxMessage>();
    let pending = [...firsts.values()];
    // Round 1 inserts everything unless some id exists; then those are compared, and round 2
    // inserts the rest. Rows of an ordering key that gets its first head in this batch wait for
    // the round after that head's. More rounds only run when another transaction raced us.
    for (let round = 0; round < maxInsertRounds + 2 && pending.length > 0; round++) {
      const now = new Date().toISOString();
      const json = JSON.stringify(pending.map((record) => ({
        id: record.id,
        kind: record.kind,
        name: record.name,
        subject: record.subject,
        payload: record.payload,
        headers: JSON.stringify(record.headers),
        orderingKey: record.orderingKey,
      })));
      const params: unknown[] = [json, now];
      if (this.#channel !== undefined) params.push(this.#channel);
      const insert = pending.some((record) => record.orderingKey !== undefined)
        ? this.#sql.insertMany
        : this.#sql.insertManyUnkeyed;
      for (const row of await this.executor.query(insert, params)) {
        const message = decodeOutboxRow(row);
        stored.set(message.id, message);
      }
      const missing = pending.filter((record) => !stored.has(record.id));
      pending = [];
      if (missing.length === 0) break;
      const rows = await this.executor.query(this.#sql.getMany, [
        JSON.stringify(missing.map((record) => record.id)),
      ]);
      for (const row of rows) {
        const message = decodeOutboxRow(row);
        assertOutboxIdentity(message, firsts.get(message.id)!, options.contextHeaders);
        stored.set(message.id, message);
      }
      pending = missing.filter((record) => !stored.has(record.id));
    }
    if (pending.length > 0) throw new OutboxStorageConflictError(pending[0].id);
    return valid.map((record) => copyMessage(stored.get(record.id)!));
  }

  /** Reads one message, or `undefined`. Throws `OutboxCorruptRecordError` for a corrupt row. */
  async get(id: string): Promise<OutboxMessage | undefined> {
    const [row] = await this.executor.query(this.#sql.get, [id]);
    return row ? decodeOutboxRow(row) : undefined;
  }

  /**
   * Claims up to `limit` due messages, oldest first, in one statement. A claimed row that cannot
   * be decoded is moved to `dead` with the reason and left out; the others are returned.
   */
  async claimDue(
    limit: number,
    now: Date,
    options: OutboxClaimOptions = {},
  ): Promise<OutboxMessage[]> {
    const max = checkedLimit(limit);
    if (max === 0) return [];
    const leaseMs = checkedLeaseMs(options.leaseMs);
    const nowIso = checkedDate(now, "now");
    const lease = addMs(now, leaseMs).toISOString();
    const token = newClaimToken();
    let rows = await this.executor.query(this.#sql.claim, [nowIso, lease, max, token]);
    // A claim returns only the columns it did not write (dialects.ts).
    const sqlite = this.dialect === "sqlite";
    if (rows.length > 0) checkColumns(rows[0], claimColumns);
    // Ordering keys: a dispatched head whose hand-over is still to do (an enqueue of its key was
    // in flight, or a process died between the mark and the hand-over) is handed over now.
    // Postgres's claim answers in its rows; SQLite asks after the claim.
    const stale = rows.length > 0 && !sqlite
      ? truthy(rows[0].stale_heads)
      : truthy((await this.executor.query(this.#sql.staleHeads, []))[0]?.stale);
    if (stale) {
      try {
        const { promoted } = await this.#handOver(null);
        if (promoted > 0 && rows.length < max) {
          rows = rows.concat(
            await this.executor.query(this.#sql.claim, [nowIso, lease, max - rows.length, token]),
          );
        }
      } catch (error) {
        // The claimed rows are this caller's now: return them; a later claim hands over.
        if (rows.length === 0) throw error;
      }
    }
    this.#plans.count(rows.length);
    // RETURNING gives no order: restore the claim order (seq).
    rows.sort((a, b) => (integer(a.seq) ?? 0) - (integer(b.seq) ?? 0));
    const written: ClaimWrite = { updatedAt: nowIso, nextAttemptAt: lease, claimToken: token };
    const claimed: OutboxMessage[] = [];
    for (const row of rows) {
      try {
        claimed.push(withKeySequence(decodeOutboxRow(row, written), row));
      } catch (error) {
        const reason = error instanceof OutboxCorruptRecordError
          ? error
          : new OutboxCorruptRecordError(undefined, String(error), { cause: error });
        await this.executor.query(this.#sql.deadCorrupt, [
          row.seq,
          token,
          reason.message,
          nowIso,
        ]);
      }
    }
    return claimed;
  }

  /** The statements of the current plan generation. */
  get #sql(): OutboxStatements {
    return this.#plans.current;
  }

  /** Settles a claim as dispatched (fenced); `false` when the claim was superseded. */
  async markDispatched(
    claim: OutboxClaim,
    now: Date,
    outcome?: JsonValue,
    options: OutboxDispatchedOptions = {},
  ): Promise<boolean> {
    const sequence = checkedSequence(options?.sequence);
    const [changed] = await this.markMany([{ claim, state: "dispatched", outcome, sequence }], now);
    return changed;
  }

  /** Records a failed attempt (fenced); `false` when the claim was superseded. */
  async markFailed(claim: OutboxClaim, failure: OutboxFailure): Promise<boolean> {
    const [changed] = await this.markMany([{
      claim,
      state: "failed",
      error: failure?.error,
      nextAttemptAt: failure?.nextAttemptAt,
    }], failure?.now);
    return changed;
  }

  /** Moves a claim to `dead` (fenced); `false` when the claim was superseded. */
  async markDead(claim: OutboxClaim, dead: OutboxDeadLetter): Promise<boolean> {
    const [changed] = await this.markMany(
      [{ claim, state: "dead", error: dead?.error }],
      dead?.now,
    );
    return changed;
  }

  /**
   * Settles a batch of claims in ONE statement, each fenced as {@linkcode OutboxClaim} says (by
   * its `claimToken`; without one, by state `claimed`, attempts and lease expiry). Returns one
   * boolean per mark. When a mark with a token does not apply, a second statement checks
   * whether the same claim had already applied it (a retry after a lost reply): then it is
   * `true`. A batch naming one id twice is settled in input order, one statement per
   * repetition, so a later mark sees the earlier one's effect. A batch of `dispatched` marks
   * with tokens and nothing else to record (no outcome, no sequence) first runs a plain fenced
   * update of its rows without an ordering key; the marks it leaves take the path above.
   */
  async markMany(marks: readonly OutboxMark[], now: Date): Promise<boolean[]> {
    if (marks.length === 0) return [];
    const nowIso = checkedDate(now, "now");
    const encoded = marks.map(encodeMark); // every mark checked before anything is sent
    const results = new Array<boolean>(marks.length).fill(false);
    const stale: string[] = [];
    // Split into rounds with unique ids (normally exactly one round). Each round is read in ONE
    // pass (indexed loops, no per-mark objects): markMany runs once per batch, too rarely for
    // the engine to optimise it, so every pass over a batch costs.
    let remaining: number[] | undefined; // the indexes of the marks of the next round
    while (true) {
      const indexes = remaining;
      const count = indexes === undefined ? marks.length : indexes.length;
      if (count === 0) break;
      let later: number[] | undefined;
      const payload: EncodedMark[] = [];
      const payloadIndexes: number[] = [];
      // Every id of the round (also of marks that cannot match a row): a repetition waits for
      // the next round. Payload ids are unique, so this also finds a payload mark's index.
      const indexById = new Map<string, number>();
      let plain = true;
      for (let k = 0; k < count; k++) {
        const index = indexes === undefined ? k : indexes[k];
        const id = marks[index]?.claim?.id;
        if (typeof id === "string") {
          if (indexById.has(id)) {
            (later ??= []).push(index);
            continue;
          }
          indexById.set(id, index);
        }
        const mark = encoded[index];
        if (!mark) continue; // cannot match any row: stays false
        payload.push(mark);
        payloadIndexes.push(index);
        if (plain && !isPlainDispatch(mark)) plain = false;
      }
      remaining = later ?? [];
      // The common batch (every mark dispatched with a token, nothing else to record) goes
      // through a plain fenced update first; what it leaves (superseded, already applied, keyed
      // rows) takes the full path below, exactly as if it had been the batch.
      let rest = payload;
      if (payload.length > 0 && plain) {
        const [sql, params] = this.#fastMark(payload, nowIso);
        const rows = await this.executor.query(sql, params);
        if (rows.length === payload.length) {
          // Each changed row is one of the payload's (distinct) ids: all of them applied.
          for (let k = 0; k < payloadIndexes.length; k++) results[payloadIndexes[k]] = true;
          rest = [];
        } else if (rows.length > 0) {
          for (let k = 0; k < rows.length; k++) {
            const index = indexById.get(rows[k].id as string);
            if (index !== undefined) results[index] = true;
          }
          rest = payload.filter((_, k) => !results[payloadIndexes[k]]);
        }
      }
      if (rest.length > 0) {
        // The key fence: key sequences are recorded with the marks (see keySequences in
        // dialects.ts): in the same statement on Postgres, just before it on SQLite.
        const recording = rest.some((mark) => mark.sequence !== null || mark.state === "dead");
        const json = JSON.stringify(rest);
        if (recording) {
          for (const statement of this.#sql.keySequences) {
            await this.executor.query(statement, [json]);
          }
        }
        const rows = await this.executor.query(
          recording && this.#sql.markManyRecordingKeys !== ""
            ? this.#sql.markManyRecordingKeys
            : this.#sql.markMany,
          [json, nowIso],
        );
        for (const row of rows) {
          const index = indexById.get(row.id as string);
          if (index !== undefined) results[index] = true;
          if (truthy(row.stale)) stale.push(row.id as string);
        }
        const unsure = rest.filter((mark) =>
          mark.token !== null && !results[indexById.get(mark.id)!]
        );
        if (unsure.length > 0) {
          const applied = await this.executor.query(this.#sql.markApplied, [
            JSON.stringify(
              unsure.map(({ id, attempts, token, state }) => ({ id, attempts, token, state })),
            ),
          ]);
          for (const row of applied) {
            const index = indexById.get(row.id as string);
            if (index !== undefined) results[index] = true;
          }
        }
      }
    }
    if (stale.length > 0) {
      // Dispatched heads whose key showed no next message: hand over now (or, if that fails,
      // at the next claim, which looks for such heads every time).
      await this.#handOver(stale).catch(() => {});
    }
    return results;
  }

  /**
   * The fast mark's statement and parameters for plain dispatched marks of distinct ids: marks
   * that all carry one claim token (one claim's batch) bind it once where the dialect has
   * `markDispatchedOneClaim`; otherwise `markDispatchedFast`. Both return the ids they changed.
   */
  #fastMark(payload: readonly EncodedMark[], nowIso: string): [string, unknown[]] {
    const token = payload[0].token;
    const oneClaim = this.#sql.markDispatchedOneClaim;
    if (oneClaim !== "" && payload.every((mark) => mark.token === token)) {
      // No prototype: an id such as "__proto__" is a key like any other.
      const attempts: Record<string, number> = Object.create(null);
      for (const mark of payload) attempts[mark.id] = mark.attempts;
      return [oneClaim, [JSON.stringify(attempts), nowIso, token]];
    }
    const fenced: Record<string, [number, string | null]> = Object.create(null);
    for (const mark of payload) fenced[mark.id] = [mark.attempts, mark.token];
    return [this.#sql.markDispatchedFast, [JSON.stringify(fenced), nowIso]];
  }

  /**
   * Deletes old dispatched / dead messages, `batchSize` rows per statement. Postgres: a row
   * another transaction holds just then is skipped, never waited for (a later run deletes it).
   * With `dispatchedBefore` (and not `dryRun`) it first hands over dispatched heads whose
   * hand-over is still to do (as a claim would), so they are pruned like any dispatched row, and
   * last retires the ordering keys idle since the cutoff (retire_keys.ts): their key fence rows.
   */
  async prune(options: OutboxPruneOptions): Promise<OutboxPruneResult> {
    const batchSize = checkedBatchSize(options.batchSize);
    const result: OutboxPruneResult = { dispatched: 0, dead: 0 };
    // Postgres needs transactions for both steps (their locks must last until they commit); an
    // executor without transaction() (a hand-written one) prunes rows only, as before.
    const retireBefore = options.dispatchedBefore !== undefined && !options.dryRun &&
        (this.dialect === "sqlite" || typeof this.executor.transaction === "function")
      ? checkedDate(options.dispatchedBefore, "dispatchedBefore")
      : undefined;
    if (retireBefore !== undefined) {
      // Without a claimer running, nothing else would hand these over. A failure leaves them
      // to the next claim or prune, as a failed hand-over after a mark does.
      try {
        while (truthy((await this.executor.query(this.#sql.staleHeads, []))[0]?.stale)) {
          const round = await this.#handOver(null);
          if (round.released === 0 || round.held < handOverBatch) break;
        }
      } catch {
        // see above
      }
    }
    const plan: Array<["dispatched" | "dead", Date | undefined]> = [
      ["dispatched", options.dispatchedBefore],
      ["dead", options.deadBefore],
    ];
    for (const [state, before] of plan) {
      if (before === undefined) continue;
      const cutoff = checkedDate(
        before,
        state === "dispatched" ? "dispatchedBefore" : "deadBefore",
      );
      if (options.dryRun) {
        const [row] = await this.executor.query(this.#sql.count[state], [cutoff]);
        result[state] += integer(row?.n) ?? 0;
        options.onProgress?.({ ...result });
        continue;
      }
      while (true) {
        const rows = await this.executor.query(this.#sql.prune[state], [cutoff, batchSize]);
        const { deleted, last } = pruneBatch(this.dialect, rows, batchSize);
        // A retention job that only prunes needs its statements planned again as much as a
        // relay: planned on an empty table, they would read all of it.
        this.#plans.count(deleted);
        result[state] += deleted;
        if (deleted > 0) options.onProgress?.({ ...result });
        if (last) break;
      }
    }
    if (retireBefore !== undefined) {
      await retireIdleKeys(
        this.dialect,
        retireKeyStatements(this.dialect, this.tables),
        (work) => this.#inTransaction(work),
        retireBefore,
        batchSize,
      );
    }
    return result;
  }

  /** Counts per state and the backlog at `now` (one statement). */
  async stats(now: Date = new Date()): Promise<OutboxStats> {
    const nowIso = checkedDate(now, "now");
    const [row = {}] = await this.executor.query(this.#sql.stats, [nowIso]);
    const stats: OutboxStats = {
      pending: integer(row.pending) ?? 0,
      claimed: integer(row.claimed) ?? 0,
      failed: integer(row.failed) ?? 0,
      dispatched: integer(row.dispatched) ?? 0,
      dead: integer(row.dead) ?? 0,
      due: integer(row.due) ?? 0,
      blockedKeys: integer(row.blocked_keys) ?? 0,
    };
    const oldest = toIsoTimestamp(row.oldest_due);
    if (oldest !== undefined) {
      stats.oldestDueCreatedAt = oldest;
      stats.oldestDueAgeMs = Math.max(0, now.getTime() - Date.parse(oldest));
    }
    return stats;
  }

  /** Lists dead messages, oldest first; rows that cannot be fully decoded are shown as far as possible. */
  async listDead(options: OutboxListDeadOptions = {}): Promise<OutboxMessage[]> {
    const limit = checkedLimit(options.limit ?? 100);
    if (limit === 0) return [];
    const rows = await this.executor.query(this.#sql.listDead, [limit]);
    return rows.map(decodeOutboxRowLoosely);
  }

  /** Moves dead messages back to `pending` with `attempts` 0 (lastError kept); returns how many changed. */
  async requeue(ids: readonly string[], now: Date = new Date()): Promise<number> {
    const unique = [...new Set(ids)].filter((id) => typeof id === "string");
    if (unique.length === 0) return 0;
    const params = [JSON.stringify(unique), checkedDate(now, "now")];
    for (let attempt = 1;; attempt++) {
      try {
        return (await this.executor.query(this.#sql.requeue, params)).length;
      } catch (error) {
        // A skipped message requeued as its key's new head while a concurrent enqueue gave the
        // key one: the unique head index refuses it; requeued again, it waits behind that head.
        if (attempt >= maxInsertRounds || !isUniqueViolation(error)) throw error;
      }
    }
  }

  /** Lists blocked ordering keys (dead heads), longest blocked first; see {@linkcode OutboxAdmin.blockedKeys}. */
  async blockedKeys(options: OutboxBlockedKeysOptions = {}): Promise<OutboxBlockedKey[]> {
    const limit = checkedLimit(options.limit ?? 100);
    if (limit === 0) return [];
    const rows = await this.executor.query(this.#sql.blockedKeys, [limit]);
    return rows.map((row) => {
      const blocked: OutboxBlockedKey = {
        key: String(row.key),
        headId: String(row.head_id),
        since: toIsoTimestamp(row.since) ?? new Date(0).toISOString(),
        waiting: integer(row.waiting) ?? 0,
      };
      if (typeof row.last_error === "string") blocked.lastError = row.last_error;
      return blocked;
    });
  }

  /**
   * Retries (requeues) or skips the dead head of a blocked key; `false` when the key is not
   * blocked. A skip hands the head over to the next message of the key in one transaction
   * (Postgres: after any enqueue of the key still in flight has ended).
   */
  async unblockKey(key: string, options: OutboxUnblockKeyOptions): Promise<boolean> {
    const valid = validateOrderingKey(key, "key");
    const action = checkedUnblockAction(options);
    const nowIso = checkedDate(options.now ?? new Date(), "now");
    if (action === "retry") {
      return (await this.executor.query(this.#sql.retryKey, [valid, nowIso])).length > 0;
    }
    return await this.#inTransaction(async (db) => {
      // Postgres: the key lock first (as enqueues take it), then the head.
      if (this.dialect === "postgres") await db.query(this.#sql.keyLock, [valid]);
      const held = await db.query(this.#sql.heldBlocked, [valid]);
      if (held.length === 0) return false;
      return (await this.#release(db, held, held)).released > 0;
    });
  }

  /**
   * Hands over dispatched heads (`ids`, or any, up to a batch) to the next message of their key,
   * or leaves the key without a head when it has none. Postgres: in a transaction that first
   * locks the heads (skipping those another hand-over holds), then tries their keys' locks
   * (`keyLocks`: held shared by every keyed enqueue in flight); the hand-over's statement then
   * hands each head to a visible next message, and leaves a key without a head only when its
   * key lock was taken, so no enqueue still in flight is missed. Resolves with the number of
   * heads it found (`held`), handed over (`released`) and of messages that became heads
   * (`promoted`).
   */
  #handOver(
    ids: readonly string[] | null,
  ): Promise<{ held: number; released: number; promoted: number }> {
    return this.#inTransaction(async (db) => {
      const held = await db.query(this.#sql.heldStale, [
        ids === null ? null : JSON.stringify(ids),
        ids?.length ?? handOverBatch,
      ]);
      if (held.length === 0) return { held: 0, released: 0, promoted: 0 };
      // Postgres: a head may leave its key without a head only under the key lock, taken before
      // the statement that looks for its next row.
      const free = this.dialect === "postgres"
        ? await db.query(this.#sql.keyLocks, [JSON.stringify(held.map((row) => row.id))])
        : held;
      return { held: held.length, ...await this.#release(db, held, free) };
    });
  }

  /** Hands over `held` heads; those not in `free` only to a next row (Postgres). */
  async #release(
    db: SqlExecutor,
    held: SqlRow[],
    free: SqlRow[],
  ): Promise<{ released: number; promoted: number }> {
    const ids = JSON.stringify(held.map((row) => row.id));
    if (this.dialect === "postgres") {
      const rows = await db.query(this.#sql.release, [
        ids,
        JSON.stringify(free.map((row) => row.id)),
      ]);
      return {
        released: integer(rows[0]?.released) ?? 0,
        promoted: integer(rows[0]?.promoted) ?? 0,
      };
    }
    const rows = await db.query(this.#sql.release, [ids]);
    const promoted = rows.filter((row) => truthy(row.promoted)).length;
    return { released: rows.length - promoted, promoted };
  }

  /** Postgres: `work` in a transaction (needed for hand-overs); SQLite: as is (one writer). */
  #inTransaction<T>(work: (db: SqlExecutor) => Promise<T>): Promise<T> {
    if (this.dialect === "sqlite") return work(this.executor);
    if (typeof this.executor.transaction !== "function") {
      return Promise.reject(
        new OutboxValidationError(
          "executor",
          "ordering keys on Postgres need an executor with transaction() (every bundled adapter has it) for the repository that claims and marks",
        ),
      );
    }
    return this.executor.transaction(work);
  }
}

/** Insert attempts for a keyed record whose key gained a head concurrently. */
const maxInsertRounds = 3;
/** Hand-overs done per claim. */
const handOverBatch = 100;

function truthy(value: unknown): boolean {
  return value === true || value === 1 || value === 1n || value === "t" || value === "true";
}

function isUniqueViolation(error: unknown): boolean {
  return (error as { code?: unknown })?.code === "23505";
}

interface EncodedMark {
  id: string;
  attempts: number;
  lease: string | null;
  token: string | null;
  state: "dispatched" | "failed" | "dead";
  error: string | null;
  next: string | null;
  outcome: string | null;
  /** The key fence: the PubAck's stream sequence of a dispatched mark. */
  sequence: number | null;
}

/**
 * A mark `markDispatchedFast` can settle: dispatched, with a claim token, and nothing else to
 * write or record (no outcome, no key sequence).
 */
function isPlainDispatch(mark: EncodedMark): boolean {
  return mark.state === "dispatched" && mark.token !== null && mark.outcome === null &&
    mark.sequence === null;
}

/** Text Postgres's json and text types can hold (no NUL, no lone surrogate). */
function storable(text: string): boolean {
  return !text.includes("\u0000") && text.isWellFormed();
}

/** The key fence: a claimed keyed message carries its key's last stream sequence, if known. */
function withKeySequence(message: OutboxMessage, row: SqlRow): OutboxMessage {
  const sequence = integer(row.key_sequence);
  if (message.orderingKey !== undefined && sequence !== undefined && sequence >= 1) {
    message.keySequence = sequence;
  }
  return message;
}

/** A mark as JSON for the batch statement; `undefined` when it can never match a row. */
function encodeMark(mark: OutboxMark): EncodedMark | undefined {
  const claim = mark?.claim;
  // An id or token no stored message can have (NUL, a lone surrogate: refused at enqueue and
  // never written by a claim) cannot match any row; Postgres's json would refuse the batch.
  if (typeof claim?.id !== "string" || !storable(claim.id)) return undefined;
  const token = claim.claimToken;
  if (token !== undefined && (typeof token !== "string" || !storable(token))) return undefined;
  // attempts is an integer column (32 bits): a count outside it matches no row.
  if (!Number.isSafeInteger(claim.attempts) || claim.attempts < 0 || claim.attempts > 2 ** 31 - 1) {
    return undefined;
  }
  let lease: string | null = null;
  if (token === undefined && claim.nextAttemptAt !== undefined) {
    const normalised = toIsoTimestamp(claim.nextAttemptAt);
    if (normalised === undefined) return undefined;
    lease = normalised;
  }
  const base = {
    id: claim.id,
    attempts: claim.attempts,
    lease,
    token: token ?? null,
    sequence: null,
  };
  switch (mark.state) {
    case "dispatched":
      return {
        ...base,
        state: "dispatched",
        error: null,
        next: null,
        outcome: mark.outcome === undefined ? null : storableOutcome(mark.outcome),
        sequence: checkedSequence(mark.sequence) ?? null,
      };
    case "failed":
      return {
        ...base,
        state: "failed",
        error: storableErrorText(mark.error),
        next: checkedDate(mark.nextAttemptAt, "nextAttemptAt"),
        outcome: null,
      };
    case "dead":
      return {
        ...base,
        state: "dead",
        error: storableErrorText(mark.error),
        next: null,
        outcome: null,
      };
    default:
      throw new OutboxValidationError(
        "state",
        `Unknown mark state ${JSON.stringify((mark as { state: unknown }).state)}`,
      );
  }
}

function copyMessage(message: OutboxMessage): OutboxMessage {
  const copy = { ...message, headers: { ...message.headers } };
  if (message.outcome !== undefined) copy.outcome = structuredClone(message.outcome);
  return copy;
}

/**
 * A row without one of our columns is a driver set up to rename or reshape rows (postgres.js
 * `transform: postgres.camel`, node:sqlite `returnArrays`), not a corrupt message: fail the claim
 * (the rows stay leased and are claimed again later) instead of dead-lettering every message.
 */
function checkColumns(row: SqlRow, columns: readonly string[]): void {
  const missing = columns.filter((column) => !(column in row));
  if (missing.length > 0) {
    throw new OutboxValidationError(
      "executor",
      `the executor returned outbox rows without the column(s) ${missing.join(", ")}; ` +
        "give the outbox a connection without column-name transforms (postgres.js transform, " +
        "returnArrays)",
    );
  }
}

function notifyChannel(
  notify: boolean | string | undefined,
  dialect: SqlDialect,
  tables: ResolvedSqlOutboxTables,
): string | undefined {
  if (notify === undefined || notify === false) return undefined;
  if (dialect !== "postgres") {
    throw new OutboxValidationError("notify", "notify (pg_notify) is only available on Postgres");
  }
  const channel = notify === true ? tables.outbox : notify;
  if (
    typeof channel !== "string" || channel.length === 0 || channel.length > 63 ||
    channel.includes("\u0000")
  ) {
    throw new OutboxValidationError(
      "notify",
      "notify channel must be a non-empty string of at most 63 characters without NUL",
    );
  }
  return channel;
}
