/**
 * OpenTelemetry traces and metrics for the outbox, the dispatcher and the inbox consumer,
 * through `@opentelemetry/api` only: everything is a no-op until the application installs an
 * SDK (or runs Deno with `OTEL_DENO=true`, whose built-in exporter picks the API up).
 *
 * @module
 */

import {
  type Attributes,
  type Context,
  context,
  type Counter,
  createNoopMeter,
  type Histogram,
  type Meter,
  type MeterProvider,
  metrics,
  ProxyTracerProvider,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { errorMessage, OutboxPublishError } from "../core/errors.ts";
import { storableErrorText } from "../core/storable_text.ts";
import { nonNegative } from "../core/limits.ts";
import type {
  OutboxAdmin,
  OutboxDeliveryOptions,
  OutboxEnqueueOptions,
  OutboxMessage,
  OutboxPublishReceipt,
  OutboxRecord,
  OutboxRepository,
  OutboxRuntime,
  OutboxStats,
  PreparedEvent,
} from "../core/types.ts";
import type {
  DeadInfo,
  DispatchedInfo,
  FailedInfo,
  OutboxDispatchHooks,
} from "../dispatch/dispatch_outbox.ts";
import { packageName, packageVersion } from "../version.ts";
import { extractTraceContext, injectTraceContext, traceHeaderNames } from "./trace_context.ts";

// What the API hands out when no SDK is installed: the no-op meter's instruments are shared
// singletons, and a proxy tracer provider without a delegate reports the no-op provider.
const noopHistogram = createNoopMeter().createHistogram("outbox.noop");
const noopTracerProvider = new ProxyTracerProvider().getDelegate();

/**
 * Options for {@linkcode OutboxTelemetry}.
 *
 * @example
 * ```ts
 * import type { OutboxTelemetryOptions } from "@outbox/nats/telemetry";
 * const options: OutboxTelemetryOptions = { publishContext: "parent" };
 * ```
 */
export interface OutboxTelemetryOptions {
  /**
   * Where spans go: an OpenTelemetry `TracerProvider` (typed structurally so this package's
   * API does not depend on the SDK's types). @default {the global tracer provider}
   */
  tracerProvider?: { getTracer(name: string, version?: string): unknown };
  /** Where metrics go: an OpenTelemetry `MeterProvider`. @default {the global meter provider} */
  meterProvider?: { getMeter(name: string, version?: string): unknown };
  /**
   * How the publish span relates to the context stored at enqueue: `"link"` starts a new trace
   * linked to it (dispatch can happen long after the request ended), `"parent"` continues it.
   *
   * @default {"link"}
   */
  publishContext?: "link" | "parent";
  /** `messaging.system` attribute. @default {"nats"} */
  messagingSystem?: string;
}

/**
 * Where an error happened, with the reference's low-cardinality attributes. No ids.
 *
 * @example
 * ```ts
 * import type { OutboxErrorAttributes } from "@outbox/nats/telemetry";
 * const where: OutboxErrorAttributes = {
 *   surface: "outbox", direction: "dispatcher", operation: "order.created", phase: "publish",
 * };
 * ```
 */
export interface OutboxErrorAttributes {
  /** `outbox` or `inbox`. */
  surface: "outbox" | "inbox";
  /** `producer` (enqueue), `dispatcher` or `consumer`. */
  direction: "producer" | "dispatcher" | "consumer";
  /** The message name (event or job name), a bounded set. */
  operation: string;
  /** `enqueue`, `publish`, `job.dispatch`, `dispatch` or `process`. */
  phase: string;
}

/**
 * A backlog observation, from {@linkcode OutboxTelemetry.observeBacklog}.
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository } from "@outbox/nats";
 * import { OutboxTelemetry } from "@outbox/nats/telemetry";
 * const telemetry = new OutboxTelemetry();
 * const observation = telemetry.observeBacklog(new MemoryOutboxRepository(), { store: "memory" });
 * await observation.refresh();
 * await observation.stop();
 * ```
 */
export interface BacklogObservation extends AsyncDisposable {
  /** Samples `stats()` now (also done every `intervalMs`); joins a sample already running. */
  refresh(): Promise<void>;
  /** Stops sampling and reporting; resolves once a sample in flight has ended. */
  stop(): Promise<void>;
}

/**
 * Instruments an outbox: producer spans at enqueue that store their context in the record
 * headers, publish spans and latency at dispatch, counters for every outcome, time spent in the
 * outbox, backlog gauges, and process spans for the inbox consumer.
 *
 * Metric names: `outbox.messages.dispatched`, `outbox.messages.failed`, `outbox.messages.dead`,
 * `outbox.messages.duplicate_acks`, `outbox.messages.no_stream` (attempts that found no stream
 * capturing the subject) (counters); `outbox.publish.duration` and
 * `outbox.message.time_in_outbox` (histograms, seconds); `outbox.messages.due` and
 * `outbox.oldest_due.age` (observable gauges, seconds), `outbox.keys.blocked` (observable
 * gauge: ordering keys blocked by a dead head); `inbox.messages.duplicates`,
 * `inbox.messages.processed`; `outbox.errors` with `surface`, `direction`, `operation`, `phase`,
 * `messaging.system` and `error.type`. Failures of a scoped error (`OutboxPublishError.scope`)
 * carry `outbox.failure.scope` (`connection`, `jetstream`, `stream`, `subject`).
 *
 * @example
 * ```ts
 * import { MemoryOutboxRepository, OutboxDispatcher } from "@outbox/nats";
 * import { OutboxTelemetry } from "@outbox/nats/telemetry";
 *
 * const telemetry = new OutboxTelemetry();
 * const outbox = telemetry.instrumentOutbox(new MemoryOutboxRepository());
 * const runtime = telemetry.instrumentRuntime({ publishPreparedEvent: () => Promise.resolve() });
 * const dispatcher = new OutboxDispatcher(outbox, runtime, { ...telemetry.hooks });
 * await dispatcher.stop();
 * ```
 */
export class OutboxTelemetry {
  /** Dispatcher hooks that count outcomes and time in outbox; spread into the options. */
  readonly hooks: Required<OutboxDispatchHooks>;
  #tracer: Tracer;
  #meter: Meter;
  #mode: "link" | "parent";
  #system: string;
  #dispatched: Counter;
  #failed: Counter;
  #dead: Counter;
  #duplicateAcks: Counter;
  #noStream: Counter;
  #errors: Counter;
  #publishDuration: Histogram;
  #timeInOutbox: Histogram;
  #inboxDuplicates: Counter;
  #inboxProcessed: Counter;
  #tracerProxy: ProxyTracerProvider | undefined;
  #metricsOff: boolean;
  #outcomes: Readonly<Record<"ok" | "duplicate" | "error", Attributes>>;
  #byKind = new Map<string, Attributes>();
  #backlog = new Map<string, OutboxStats>();
  #gaugesRegistered = false;

  /** Creates the instruments (no-ops without an SDK). */
  constructor(options: OutboxTelemetryOptions = {}) {
    const tracerProvider = (options.tracerProvider ?? trace.getTracerProvider()) as TracerProvider;
    this.#tracer = tracerProvider.getTracer(packageName, packageVersion);
    this.#tracerProxy = tracerProvider instanceof ProxyTracerProvider ? tracerProvider : undefined;
    this.#meter = ((options.meterProvider ?? metrics.getMeterProvider()) as MeterProvider)
      .getMeter(packageName, packageVersion);
    this.#mode = options.publishContext ?? "link";
    this.#system = options.messagingSystem ?? "nats";
    const outcome = (value: string) =>
      Object.freeze({ "messaging.system": this.#system, outcome: value });
    this.#outcomes = {
      ok: outcome("ok"),
      duplicate: outcome("duplicate"),
      error: outcome("error"),
    };
    const m = this.#meter;
    this.#dispatched = m.createCounter("outbox.messages.dispatched", {
      description: "Messages delivered (including re-publishes the broker absorbed as duplicates)",
    });
    this.#failed = m.createCounter("outbox.messages.failed", {
      description: "Failed delivery attempts with a retry scheduled",
    });
    this.#dead = m.createCounter("outbox.messages.dead", {
      description: "Messages moved to dead (attempts exhausted or permanently undeliverable)",
    });
    this.#duplicateAcks = m.createCounter("outbox.messages.duplicate_acks", {
      description: "PubAcks with duplicate=true: the stream already had the message id",
    });
    this.#noStream = m.createCounter("outbox.messages.no_stream", {
      description:
        "Attempts that found no JetStream stream capturing the subject (error.type no_stream)",
    });
    this.#errors = m.createCounter("outbox.errors", {
      description: "Errors by surface, direction, operation and phase",
    });
    this.#publishDuration = m.createHistogram("outbox.publish.duration", {
      description: "Time from publish to broker acknowledgement",
      unit: "s",
    });
    this.#timeInOutbox = m.createHistogram("outbox.message.time_in_outbox", {
      description: "Time from enqueue to broker acknowledgement",
      unit: "s",
    });
    this.#inboxDuplicates = m.createCounter("inbox.messages.duplicates", {
      description: "Deliveries suppressed by the inbox (already processed)",
    });
    this.#inboxProcessed = m.createCounter("inbox.messages.processed", {
      description: "Messages the inbox consumer processed",
    });
    // The API has no late binding for metrics: without an SDK at construction they stay no-ops.
    this.#metricsOff = this.#publishDuration === noopHistogram;
    this.hooks = {
      onDispatched: (message, info) => this.#onDispatched(message, info),
      onFailed: (message, info) => this.#onFailed(message, info),
      onDead: (message, info) => this.#onDead(message, info),
    };
  }

  /**
   * Wraps a repository so `enqueue` and `enqueueMany` run in a producer span (`create <name>`)
   * whose context is stored in the record headers (`traceparent`, `tracestate`, or whatever the
   * registered propagator writes). Those headers are passed to the store as `contextHeaders`
   * (exactly `propagation.fields()` plus the W3C names, see {@linkcode traceHeaderNames}), so
   * an idempotent re-enqueue from another trace returns the stored message. Other methods pass
   * through. Wrap the transaction-bound repository you enqueue with.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository } from "@outbox/nats";
   * import { OutboxTelemetry } from "@outbox/nats/telemetry";
   * const outbox = new OutboxTelemetry().instrumentOutbox(new MemoryOutboxRepository());
   * ```
   */
  instrumentOutbox<R extends OutboxRepository>(repository: R): R {
    // The trace headers this wrapper adds are request context, not message content: a retried
    // enqueue from another trace must find the stored message identical.
    const withContext = (options: OutboxEnqueueOptions | undefined): OutboxEnqueueOptions => {
      const names = traceHeaderNames();
      const extra = options?.contextHeaders;
      return { ...options, contextHeaders: extra ? [...names, ...extra] : names };
    };
    const enqueue = (record: OutboxRecord, options?: OutboxEnqueueOptions) =>
      this.#produce([record], (records) => repository.enqueue(records[0], withContext(options)));
    const enqueueMany = (records: readonly OutboxRecord[], options?: OutboxEnqueueOptions) =>
      records.length === 0 ? repository.enqueueMany(records, options) : this.#produce(
        records,
        (traced) => repository.enqueueMany(traced, withContext(options)),
      );
    return new Proxy(repository, {
      get(target, property) {
        if (property === "enqueue") return enqueue;
        if (property === "enqueueMany") return enqueueMany;
        const value = Reflect.get(target, property, target);
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  }

  /**
   * Wraps a runtime so every publish runs in a `publish <name>` span (kind producer) that links
   * to, or continues, the context stored at enqueue; records publish latency and errors. The
   * published headers keep the stored context, so consumers continue the enqueue's trace.
   *
   * @example
   * ```ts
   * import { OutboxTelemetry } from "@outbox/nats/telemetry";
   * const runtime = new OutboxTelemetry().instrumentRuntime({
   *   publishPreparedEvent: () => Promise.resolve(),
   * });
   * ```
   */
  instrumentRuntime(runtime: OutboxRuntime): OutboxRuntime {
    const instrumented: OutboxRuntime = {
      publishPreparedEvent: (event, options) => this.#publish(runtime, event, options),
    };
    if (runtime.dispatchJobSubmission) {
      const dispatchJob = runtime.dispatchJobSubmission.bind(runtime);
      instrumented.dispatchJobSubmission = (message, options) =>
        this.#span(
          `send ${message.name}`,
          message.headers,
          message.name,
          "job.dispatch",
          () => dispatchJob(message, options),
        );
    }
    if (runtime.probe) instrumented.probe = runtime.probe.bind(runtime);
    if (runtime.probeScope) instrumented.probeScope = runtime.probeScope.bind(runtime);
    return instrumented;
  }

  /**
   * Reports `outbox.messages.due`, `outbox.oldest_due.age` and `outbox.keys.blocked` for `store`, sampled from
   * `stats()` every `intervalMs` (not per publish). Call `stop()` when done.
   *
   * @example
   * ```ts
   * import { MemoryOutboxRepository } from "@outbox/nats";
   * import { OutboxTelemetry } from "@outbox/nats/telemetry";
   * const observation = new OutboxTelemetry().observeBacklog(new MemoryOutboxRepository(), {
   *   store: "memory",
   * });
   * await observation.stop();
   * ```
   */
  observeBacklog(
    store: Pick<OutboxAdmin, "stats">,
    options: { store: string; intervalMs?: number; onError?: (error: unknown) => void },
  ): BacklogObservation {
    this.#registerGauges();
    const key = options.store;
    const intervalMs = nonNegative("intervalMs", options.intervalMs ?? 15_000);
    let stopped = false;
    let sampling: Promise<void> | undefined;
    const refresh = (): Promise<void> => {
      // One sample at a time: a slow stats() is joined, not piled up.
      sampling ??= (async () => {
        try {
          const stats = await store.stats();
          if (!stopped) this.#backlog.set(key, stats);
        } catch (error) {
          options.onError?.(error);
        } finally {
          sampling = undefined;
        }
      })();
      return sampling;
    };
    void refresh();
    const timer = setInterval(() => void refresh(), Math.max(intervalMs, 100));
    const stop = async (): Promise<void> => {
      stopped = true;
      clearInterval(timer);
      this.#backlog.delete(key);
      await sampling;
    };
    return { refresh, stop, [Symbol.asyncDispose]: stop };
  }

  /**
   * Options for `consumeWithInbox`: a `process <subject>` span (kind consumer) per message that
   * continues the trace from the message headers, and counters for processed and suppressed
   * duplicates. Spread them into the consumer options.
   *
   * @example
   * ```ts
   * import type { JsMsg } from "@nats-io/jetstream";
   * import {
   *   consumeWithInbox,
   *   type InboxConsumerOptions,
   *   type PullConsumerLike,
   * } from "@outbox/nats";
   * import { OutboxTelemetry } from "@outbox/nats/telemetry";
   *
   * const telemetry = new OutboxTelemetry();
   * const start = (
   *   consumer: PullConsumerLike<JsMsg>,
   *   options: InboxConsumerOptions<JsMsg, undefined>,
   * ) => consumeWithInbox(consumer, { ...options, ...telemetry.inboxHooks() });
   * ```
   */
  inboxHooks<
    M extends {
      subject?: string;
      headers?: { get(key: string): string } | undefined;
      info: { stream: string };
    },
  >(): {
    around: (
      message: M,
      process: () => Promise<{ outcome: string; error?: unknown }>,
    ) => Promise<void>;
    onDuplicate: (message: M, messageId: string) => void;
  } {
    return {
      around: (message, process) => {
        const parent = extractTraceContext(message.headers, ROOT_CONTEXT) as Context;
        const span = this.#tracer.startSpan(`process ${message.subject ?? message.info.stream}`, {
          kind: SpanKind.CONSUMER,
          attributes: {
            "messaging.system": this.#system,
            "messaging.operation.type": "process",
            "messaging.destination.name": message.subject ?? "",
            "messaging.nats.stream": message.info.stream,
          },
        }, parent);
        return context.with(trace.setSpan(parent, span), async () => {
          try {
            const { outcome, error } = await process();
            span.setAttribute("inbox.outcome", outcome);
            if (outcome === "processed") {
              this.#inboxProcessed.add(1, { "messaging.system": this.#system });
            } else if (outcome === "failed" || outcome === "poisoned") {
              fail(span, error);
              this.recordError(error, {
                surface: "inbox",
                direction: "consumer",
                operation: message.info.stream, // bounded, unlike subjects
                phase: "process",
              });
            }
          } catch (error) {
            fail(span, error);
            throw error;
          } finally {
            span.end();
          }
        });
      },
      onDuplicate: () => {
        this.#inboxDuplicates.add(1, { "messaging.system": this.#system });
        trace.getActiveSpan()?.setAttribute("inbox.duplicate", true);
      },
    };
  }

  /** Counts an error with the reference's attributes (also used by the hooks). */
  recordError(error: unknown, where: OutboxErrorAttributes): void {
    this.#errors.add(1, {
      ...where,
      "messaging.system": this.#system,
      "error.type": errorType(error),
    });
  }

  async #produce<T>(
    records: readonly OutboxRecord[],
    store: (records: OutboxRecord[]) => Promise<T>,
  ): Promise<T> {
    const name = records.length === 1 ? records[0].name : "batch";
    const span = this.#tracer.startSpan(`create ${name}`, {
      kind: SpanKind.PRODUCER,
      attributes: {
        "messaging.system": this.#system,
        "messaging.operation.type": "create",
        "messaging.batch.message_count": records.length,
        ...(records.length === 1
          ? {
            "messaging.destination.name": records[0].subject,
            "messaging.message.id": records[0].id,
          }
          : {}),
      },
    });
    const ctx = trace.setSpan(context.active(), span);
    try {
      const traced = records.map((record) => ({
        ...record,
        headers: injectTraceContext(record.headers ?? {}, ctx),
      }));
      return await context.with(ctx, () => store(traced));
    } catch (error) {
      fail(span, error);
      this.recordError(error, {
        surface: "outbox",
        direction: "producer",
        operation: name,
        phase: "enqueue",
      });
      throw error;
    } finally {
      span.end();
    }
  }

  async #publish(
    runtime: OutboxRuntime,
    event: PreparedEvent,
    options: OutboxDeliveryOptions | undefined,
  ): Promise<void | OutboxPublishReceipt> {
    // Nothing would be recorded (no SDK): add nothing to the publish.
    if (this.#metricsOff && this.#tracingOff()) {
      return await runtime.publishPreparedEvent(event, options);
    }
    const started = performance.now();
    const { span, context: active } = this.#startSpan(
      `publish ${event.event}`,
      event.headers,
      {
        "messaging.system": this.#system,
        "messaging.operation.type": "send",
        "messaging.destination.name": event.subject,
        "messaging.message.id": event.header.id,
      },
    );
    let receipt: void | OutboxPublishReceipt;
    try {
      receipt = active
        ? await context.with(active, () => runtime.publishPreparedEvent(event, options))
        : await runtime.publishPreparedEvent(event, options);
    } catch (error) {
      this.#spanFailed(span, error, event.event, "publish");
      span.end();
      this.#publishDuration.record((performance.now() - started) / 1000, this.#outcomes.error);
      throw error;
    }
    // Read outside the try: a receipt that throws when read is the dispatcher's to settle
    // (dead, as without telemetry), not a publish failure to retry.
    let outcome = this.#outcomes.ok;
    if (isDuplicate(receipt)) {
      outcome = this.#outcomes.duplicate;
      span.setAttribute("outbox.duplicate", true);
    }
    span.end();
    this.#publishDuration.record((performance.now() - started) / 1000, outcome);
    return receipt;
  }

  async #span<T>(
    name: string,
    headers: Record<string, string>,
    operation: string,
    phase: string,
    work: () => Promise<T>,
  ): Promise<T> {
    const { span, context: active } = this.#startSpan(name, headers, {
      "messaging.system": this.#system,
      "messaging.operation.type": "send",
    });
    let result: T;
    try {
      result = active ? await context.with(active, work) : await work();
    } catch (error) {
      this.#spanFailed(span, error, operation, phase);
      span.end();
      throw error;
    }
    if (isDuplicate(result)) span.setAttribute("outbox.duplicate", true);
    span.end();
    return result;
  }

  /**
   * Starts a producer span for a dispatch, linked to (or continuing) the context stored in the
   * headers. `context` is the context to run the delivery in, or `undefined` when the span
   * carries no valid context (no SDK: the no-op tracer's root span), so there is nothing to make
   * active and the delivery runs as is.
   */
  #startSpan(
    name: string,
    headers: Record<string, string>,
    attributes: Attributes,
  ): { span: Span; context: Context | undefined } {
    const stored = extractTraceContext(headers, ROOT_CONTEXT) as Context;
    const storedSpan = trace.getSpanContext(stored);
    const parent: Context = this.#mode === "parent" ? stored : ROOT_CONTEXT;
    const span: Span = this.#tracer.startSpan(name, {
      kind: SpanKind.PRODUCER,
      attributes,
      links: this.#mode === "link" && storedSpan ? [{ context: storedSpan }] : undefined,
    }, parent);
    const active = trace.isSpanContextValid(span.spanContext())
      ? trace.setSpan(parent, span)
      : undefined;
    return { span, context: active };
  }

  /**
   * Whether spans are no-ops: the global (proxy) tracer provider has no SDK behind it. Checked
   * per call, as an SDK may be registered after this object was created.
   */
  #tracingOff(): boolean {
    return this.#tracerProxy !== undefined &&
      this.#tracerProxy.getDelegate() === noopTracerProvider;
  }

  #spanFailed(span: Span, error: unknown, operation: string, phase: string): void {
    fail(span, error);
    this.recordError(error, { surface: "outbox", direction: "dispatcher", operation, phase });
  }

  #onDispatched(message: OutboxMessage, info: DispatchedInfo): void {
    if (this.#metricsOff) return;
    const attributes = this.#kindAttributes(message.kind);
    this.#dispatched.add(1, attributes);
    if (info.duplicate) this.#duplicateAcks.add(1, attributes);
    const created = Date.parse(message.createdAt);
    if (Number.isFinite(created)) {
      this.#timeInOutbox.record(Math.max(0, Date.now() - created) / 1000, attributes);
    }
  }

  #onFailed(message: OutboxMessage, info: FailedInfo): void {
    if (this.#metricsOff) return;
    this.#failed.add(1, this.#failureAttributes(message, info.error));
    this.#countNoStream(message, info.error);
  }

  /** The failure counters' attributes, with `outbox.failure.scope` for a scoped error. */
  #failureAttributes(message: OutboxMessage, error: unknown): Attributes {
    const attributes: Attributes = {
      "messaging.system": this.#system,
      "outbox.kind": message.kind,
      "error.type": errorType(error),
    };
    if (error instanceof OutboxPublishError && error.scope) {
      attributes["outbox.failure.scope"] = error.scope.kind;
    }
    return attributes;
  }

  #countNoStream(message: OutboxMessage, error: unknown): void {
    if (error instanceof OutboxPublishError && error.code === "no_stream") {
      this.#noStream.add(1, this.#kindAttributes(message.kind));
    }
  }

  #onDead(message: OutboxMessage, info: DeadInfo): void {
    if (this.#metricsOff) return;
    this.#dead.add(1, this.#failureAttributes(message, info.error));
    this.#countNoStream(message, info.error);
    this.recordError(info.error, {
      surface: "outbox",
      direction: "dispatcher",
      operation: message.name,
      phase: "dispatch",
    });
  }

  /** The per-kind attributes of the outcome counters, built once per kind (a bounded set). */
  #kindAttributes(kind: string): Attributes {
    let attributes = this.#byKind.get(kind);
    if (!attributes) {
      attributes = Object.freeze({ "messaging.system": this.#system, "outbox.kind": kind });
      this.#byKind.set(kind, attributes);
    }
    return attributes;
  }

  #registerGauges(): void {
    if (this.#gaugesRegistered) return;
    this.#gaugesRegistered = true;
    const due = this.#meter.createObservableGauge("outbox.messages.due", {
      description: "Messages due for dispatch, sampled from stats()",
    });
    const age = this.#meter.createObservableGauge("outbox.oldest_due.age", {
      description: "Age of the oldest due message, sampled from stats()",
      unit: "s",
    });
    const blocked = this.#meter.createObservableGauge("outbox.keys.blocked", {
      description: "Ordering keys blocked by a dead head, sampled from stats()",
    });
    blocked.addCallback((result) => {
      for (const [store, stats] of this.#backlog) {
        result.observe(stats.blockedKeys ?? 0, { "outbox.store": store });
      }
    });
    due.addCallback((result) => {
      for (const [store, stats] of this.#backlog) {
        result.observe(stats.due, { "outbox.store": store });
      }
    });
    age.addCallback((result) => {
      for (const [store, stats] of this.#backlog) {
        result.observe((stats.oldestDueAgeMs ?? 0) / 1000, { "outbox.store": store });
      }
    });
  }
}

function fail(span: Span, error: unknown): void {
  // The text as the stores keep it (bounded, no NUL, no lone surrogate), never throwing.
  const text = storableErrorText(error);
  // The error itself (with its stack) when its text needed no change; else a new Error.
  let exception: Error;
  try {
    exception = error instanceof Error && errorMessage(error) === text ? error : new Error(text);
  } catch {
    exception = new Error(text);
  }
  span.recordException(exception);
  span.setStatus({ code: SpanStatusCode.ERROR, message: text });
}

/**
 * A bounded error class for metrics: the publish error code, else the error's name; a code or
 * name that is not a short string counts as "other".
 */
function errorType(error: unknown): string {
  let type: unknown = "unknown";
  try {
    if (error instanceof OutboxPublishError) type = error.code;
    else if (error instanceof Error) type = error.name || "Error";
  } catch {
    return "other";
  }
  return typeof type === "string" && type.length <= 64 ? type : "other";
}

/**
 * Whether a runtime's result says `duplicate: true`. Never throws: a result whose fields cannot
 * be read is not a duplicate here, and the dispatcher settles it (dead, `unreadable`) as it
 * would without telemetry.
 */
function isDuplicate(result: unknown): boolean {
  if (result === null || typeof result !== "object") return false;
  try {
    return (result as OutboxPublishReceipt).duplicate === true;
  } catch {
    return false;
  }
}
