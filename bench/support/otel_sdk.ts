/**
 * An OpenTelemetry SDK set up the way an application would (tracer and meter providers, W3C
 * propagation, an AsyncLocalStorage context manager), exporting to nowhere: spans go through a
 * BatchSpanProcessor and metrics through a 1 s periodic reader to exporters that drop
 * everything, so the measured cost is the instrumentation and the SDK, not an exporter's I/O.
 *
 * @module
 */

import { context, propagation } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { ExportResultCode, W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  type ReadableSpan,
  type SpanExporter,
} from "@opentelemetry/sdk-trace-base";
import {
  AggregationTemporality,
  MeterProvider,
  PeriodicExportingMetricReader,
  type PushMetricExporter,
  type ResourceMetrics,
} from "@opentelemetry/sdk-metrics";

/** Counts what it is given and drops it. */
class DroppingSpanExporter implements SpanExporter {
  exported = 0;
  export(spans: ReadableSpan[], done: (result: { code: ExportResultCode }) => void): void {
    this.exported += spans.length;
    done({ code: ExportResultCode.SUCCESS });
  }
  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

class DroppingMetricExporter implements PushMetricExporter {
  exports = 0;
  export(_metrics: ResourceMetrics, done: (result: { code: ExportResultCode }) => void): void {
    this.exports += 1;
    done({ code: ExportResultCode.SUCCESS });
  }
  selectAggregationTemporality(): AggregationTemporality {
    return AggregationTemporality.CUMULATIVE;
  }
  forceFlush(): Promise<void> {
    return Promise.resolve();
  }
  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** A running SDK; `shutdown()` flushes and reports how many spans were exported. */
export interface BenchOtelSdk {
  tracerProvider: BasicTracerProvider;
  meterProvider: MeterProvider;
  shutdown(): Promise<{ spans: number; metricExports: number }>;
}

/** Installs the global propagator and context manager and creates the providers. */
export function startOtelSdk(): BenchOtelSdk {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const spans = new DroppingSpanExporter();
  const metricsExporter = new DroppingMetricExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [new BatchSpanProcessor(spans)],
  });
  const meterProvider = new MeterProvider({
    readers: [
      new PeriodicExportingMetricReader({ exporter: metricsExporter, exportIntervalMillis: 1_000 }),
    ],
  });
  return {
    tracerProvider,
    meterProvider,
    async shutdown() {
      await tracerProvider.shutdown();
      await meterProvider.shutdown();
      return { spans: spans.exported, metricExports: metricsExporter.exports };
    },
  };
}
