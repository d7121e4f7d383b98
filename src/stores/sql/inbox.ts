/**
 * The SQL inbox: processed message ids in a Postgres or SQLite table, recorded in the handler's
 * own transaction.
 *
 * @module
 */

import { OutboxValidationError } from "../../core/errors.ts";
import { resolveInboxRecordOptions } from "../../core/inbox.ts";
import { checkedBatchSize, checkedDate } from "../../core/limits.ts";
import type {
  InboxAdmin,
  InboxPruneOptions,
  InboxRecordOptions,
  InboxRepository,
} from "../../core/types.ts";
import { type OutboxStatements, outboxStatements } from "./dialects.ts";
import type { SqlExecutor } from "./executors.ts";
import { PlannedStatements } from "./plan_generations.ts";
import { pruneBatch } from "./prune_batches.ts";
import { withSchemaErrors } from "./schema_errors.ts";
import {
  checkDialect,
  type ResolvedSqlOutboxTables,
  resolveSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxTables,
} from "./tables.ts";

/**
 * An inbox in a Postgres or SQLite table: `record()` inserts `(consumer, messageId)` and is
 * `true` only for the call that inserted it. Record through an executor bound to the handler's
 * transaction, so the id commits or rolls back together with the handler's writes. Cheap to
 * construct (create it per transaction).
 *
 * @example
 * ```ts
 * import { DatabaseSync } from "node:sqlite";
 * import { migrate, nodeSqliteExecutor, SqlInboxRepository } from "@outbox/nats";
 *
 * const executor = nodeSqliteExecutor(new DatabaseSync(":memory:"));
 * await migrate(executor, { dialect: "sqlite" });
 * const inbox = new SqlInboxRepository(executor, "sqlite");
 * console.log(await inbox.record("evt-1", { consumer: "billing" })); // true
 * console.log(await inbox.record("evt-1", { consumer: "billing" })); // false: duplicate
 * ```
 */
export class SqlInboxRepository implements InboxRepository, InboxAdmin {
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

  /** Creates the inbox; throws `OutboxValidationError` for a bad dialect or table name. */
  constructor(
    executor: SqlExecutor,
    dialect: SqlDialect,
    tables: SqlOutboxTables | Partial<SqlOutboxTables> = {},
  ) {
    this.dialect = checkDialect(dialect);
    this.tables = resolveSqlOutboxTables(tables);
    if (typeof executor?.query !== "function") {
      throw new OutboxValidationError("executor", "SQL executor must have query(sql, params)");
    }
    this.executor = withSchemaErrors(executor, this.dialect, this.tables, this.tables.inbox);
    this.#plans = new PlannedStatements(
      outboxStatements(this.dialect, this.tables, false),
      this.dialect,
    );
  }

  /** The statements of the current plan generation. */
  get #sql(): OutboxStatements {
    return this.#plans.current;
  }

  /** Records `messageId` for the consumer scope (default `""`); `true` only the first time. */
  async record(messageId: string, options?: Date | InboxRecordOptions): Promise<boolean> {
    const { now, consumer } = resolveInboxRecordOptions(messageId, options);
    const rows = await this.executor.query(this.#sql.inboxRecord, [
      consumer,
      messageId,
      now.toISOString(),
    ]);
    return rows.length === 1;
  }

  /**
   * Whether `messageId` is recorded for the consumer scope (default `""`). With a SQL inbox,
   * prefer `record()` inside the handler's transaction; `has()` serves integrations that check
   * first.
   */
  async has(messageId: string, options?: InboxRecordOptions): Promise<boolean> {
    const { consumer } = resolveInboxRecordOptions(messageId, options);
    const rows = await this.executor.query(this.#sql.inboxHas, [consumer, messageId]);
    return rows.length > 0;
  }

  /**
   * Forgets ids received before `receivedBefore`, `batchSize` per statement; returns the count.
   * Postgres: a row another transaction holds just then is skipped, never waited for.
   */
  async prune(options: InboxPruneOptions): Promise<number> {
    const batchSize = checkedBatchSize(options.batchSize);
    const cutoff = checkedDate(options.receivedBefore, "receivedBefore");
    let removed = 0;
    while (true) {
      const rows = await this.executor.query(this.#sql.inboxPrune, [cutoff, batchSize]);
      const { deleted, last } = pruneBatch(this.dialect, rows, batchSize);
      removed += deleted;
      // Planned again as the inbox this job prunes proves large (plan_generations.ts): a prune
      // statement planned while the inbox was empty reads all of it.
      this.#plans.count(deleted);
      if (last) return removed;
    }
  }
}
