/**
 * Transactional outbox and inbox for NATS JetStream.
 *
 * Write your business rows and an outbox record in one database transaction; a dispatcher later
 * claims due records and publishes them to JetStream with `Nats-Msg-Id` dedupe, under leases and
 * fencing, with retries and dead-lettering. On the receiving side an inbox records message ids
 * in the handler's transaction, so each message takes effect once.
 *
 * @example
 * ```ts
 * import { MemoryInboxRepository, MemoryOutboxRepository } from "@outbox/nats";
 *
 * const outbox = new MemoryOutboxRepository();
 * await outbox.enqueue({
 *   id: "order-1-created",
 *   kind: "event.publish",
 *   name: "order.created",
 *   subject: "orders.created",
 *   payload: JSON.stringify({ orderId: 1 }),
 *   headers: {},
 * });
 * const [message] = await outbox.claimDue(25, new Date());
 * await outbox.markDispatched(message, new Date());
 *
 * const inbox = new MemoryInboxRepository();
 * console.log(await inbox.record(message.id)); // true: first delivery
 * console.log(await inbox.record(message.id)); // false: duplicate
 * ```
 *
 * @module
 */

export type {
  InboxAdmin,
  InboxPruneOptions,
  InboxRecordOptions,
  InboxRepository,
  JsonValue,
  OutboxAdmin,
  OutboxBlockedKey,
  OutboxBlockedKeysOptions,
  OutboxClaim,
  OutboxClaimOptions,
  OutboxDeadLetter,
  OutboxDeliveryOptions,
  OutboxDispatchedOptions,
  OutboxEnqueueOptions,
  OutboxFailure,
  OutboxFailureScope,
  OutboxListDeadOptions,
  OutboxMark,
  OutboxMessage,
  OutboxPruneOptions,
  OutboxPruneResult,
  OutboxPublishReceipt,
  OutboxRecord,
  OutboxRecordKind,
  OutboxRepository,
  OutboxRuntime,
  OutboxState,
  OutboxStats,
  OutboxUnblockKeyOptions,
  PreparedEvent,
  PreparedEventHeader,
  TransactionRunner,
} from "./src/core/types.ts";
export {
  errorMessage,
  OutboxCorruptRecordError,
  OutboxDuplicateIdentityError,
  type OutboxFailureKind,
  OutboxOutcomeRefusedError,
  OutboxPublishError,
  OutboxSchemaError,
  OutboxStorageConflictError,
  OutboxStoreClosedError,
  OutboxValidationError,
} from "./src/core/errors.ts";
export {
  defaultMaxPayloadBytes,
  maxOrderingKeyLength,
  maxOutboxIdBytes,
  maxSubjectBytes,
  OutboxPayloadTooLargeError,
  outboxRecordKinds,
  validateOrderingKey,
  validateOutboxRecord,
  validateSubject,
} from "./src/core/validate.ts";
export {
  assertOutboxIdentity,
  defaultContextHeaders,
  sameOutboxContent,
} from "./src/core/identity.ts";
export {
  outboxHeaders,
  outboxMessageToPreparedEvent,
  preparedTrellisEventToOutboxRecord,
} from "./src/core/events.ts";
export {
  backoffCeilingMs,
  backoffDelayMs,
  defaultRetryPolicy,
  type ResolvedRetryPolicy,
  resolveRetryPolicy,
  type RetryPolicy,
} from "./src/core/retry.ts";
export { serverVersionAtLeast, termReasonSinceVersion } from "./src/core/server_version.ts";
export { defaultLeaseMs, toIsoTimestamp } from "./src/core/time.ts";
export { defaultPruneBatchSize } from "./src/core/limits.ts";
export { applyMarks } from "./src/core/marks.ts";
export {
  type FencedState,
  type FenceVerdict,
  fenceVerdict,
  newClaimToken,
} from "./src/core/fence.ts";
export { defaultInboxConsumer, resolveInboxRecordOptions } from "./src/core/inbox.ts";
export {
  MemoryOutboxRepository,
  type MemoryOutboxRepositoryOptions,
} from "./src/stores/memory/outbox.ts";
export { MemoryInboxRepository } from "./src/stores/memory/inbox.ts";
export { processOnce, type ProcessOnceResult } from "./src/inbox/process_once.ts";
export {
  consumeWithInbox,
  type InboxConsumer,
  type InboxConsumerOptions,
  type InboxConsumerStats,
  type InboxHandlerContext,
  type InboxOutcome,
  type InboxProcessResult,
  type JetStreamMessageLike,
  type PullConsumerLike,
} from "./src/inbox/consume.ts";
export { InboxMessageIdError, messageIdOf } from "./src/inbox/message_id.ts";
export {
  checkInboxRetention,
  InboxRetentionError,
  type InboxRetentionOptions,
  type RedeliveryConfig,
  redeliveryHorizonMs,
} from "./src/inbox/retention.ts";
export {
  type DeadInfo,
  defaultDispatchLimit,
  defaultMaxInFlight,
  type DispatchedInfo,
  dispatchOutbox,
  type DispatchOutboxOptions,
  type DispatchOutboxResult,
  type FailedInfo,
  type KeyFence,
  type OutboxDispatchHooks,
} from "./src/dispatch/dispatch_outbox.ts";
export {
  OutboxDispatcher,
  type OutboxDispatcherOptions,
  type PausedInfo,
  type ResumedInfo,
} from "./src/dispatch/dispatcher.ts";
export type { CircuitState } from "./src/dispatch/circuit_breaker.ts";
export type { PausedScopeInfo, ScopeResumedInfo } from "./src/dispatch/paused_scopes.ts";
export {
  createJetStreamRuntime,
  defaultPublishTimeoutMs,
  type JetStreamOutboxRuntime,
  type JetStreamPublisher,
  type JetStreamRuntimeOptions,
} from "./src/runtime/jetstream.ts";
export { classifyJetStreamError } from "./src/runtime/jetstream_errors.ts";
export type {
  JetStreamManagerLike,
  StoredMessageLike,
  StreamInfoLike,
} from "./src/runtime/jetstream_scope.ts";
export {
  defaultPubAckWindow,
  type PubAck,
  type PubAckConnection,
  type PubAckHeaders,
  PubAckPipeline,
  pubAckPipelineFor,
  type PubAckReply,
  type PubAckSubscription,
} from "./src/runtime/pub_ack_pipeline.ts";
export {
  defaultSqlOutboxTables,
  maxSqlTableNameLength,
  type ResolvedSqlOutboxTables,
  type SqlDialect,
  type SqlOutboxTables,
} from "./src/stores/sql/tables.ts";
export {
  type BetterSqlite3Database,
  betterSqlite3Executor,
  nodeSqliteExecutor,
  pgExecutor,
  type PgExecutorOptions,
  type PgQueryable,
  postgresJsExecutor,
  type PostgresJsExecutorOptions,
  type PostgresJsSql,
  type SqlExecutor,
  type SqliteDatabase,
  type SqliteExecutorOptions,
  type SqlRow,
} from "./src/stores/sql/executors.ts";
export { SqlForeignTransactionError, SqliteWorkerClosedError } from "./src/stores/sql/errors.ts";
export {
  type SqliteWorkerExecutor,
  sqliteWorkerExecutor,
  type SqliteWorkerExecutorOptions,
} from "./src/stores/sql/sqlite_worker_executor.ts";
export { createPostgresOutboxSchema, createSqliteOutboxSchema } from "./src/stores/sql/schema.ts";
export {
  getSqlOutboxMigrations,
  migrate,
  type MigrateOptions,
  type MigrateResult,
  OutboxMigrationError,
  type SqlOutboxMigration,
  type SqlOutboxMigrationOptions,
} from "./src/stores/sql/migrations.ts";
export { SqlOutboxRepository, type SqlOutboxRepositoryOptions } from "./src/stores/sql/outbox.ts";
export {
  checkPostgresServer,
  type CheckPostgresServerOptions,
  PostgresServerError,
} from "./src/stores/sql/postgres_probe.ts";
export { SqlInboxRepository } from "./src/stores/sql/inbox.ts";
export { createSqlOutboxAdapter, type SqlOutboxAdapter } from "./src/stores/sql/adapter.ts";
export {
  listenForOutboxWakeups,
  type OutboxWakeupMode,
  type OutboxWakeupOptions,
  type OutboxWakeupReason,
  type OutboxWakeupSubscription,
  type PostgresJsListener,
} from "./src/stores/sql/listen.ts";
export {
  type NatsKvOutboxOptions,
  NatsKvOutboxRepository,
  type NatsKvRepairResult,
  type NatsKvWork,
  type NatsKvWorkListener,
} from "./src/stores/nats_kv/outbox.ts";
export {
  type NatsKvInboxOptions,
  NatsKvInboxRepository,
  type NatsKvInboxRetention,
} from "./src/stores/nats_kv/inbox.ts";
export {
  createInboxBucket,
  createOutboxBucket,
  type InboxBucketOptions,
  type KvBucketFactory,
  type KvBucketLike,
  type KvBucketOptions,
  type KvBucketSettings,
} from "./src/stores/nats_kv/bucket.ts";
export { NatsKvIndexError, NatsKvOrderingKeyError } from "./src/stores/nats_kv/errors.ts";
export { sqliteTransactionRunner } from "./src/stores/sql/transactions.ts";
