/**
 * Reading OpenTelemetry metrics in tests: a metric reader collected on demand, the data points
 * of a collection by metric name, and the sum of a counter's points.
 */

import {
  AggregationTemporality,
  type DataPoint,
  MetricReader,
  type ResourceMetrics,
} from "@opentelemetry/sdk-metrics";

/** A cumulative reader that exports nothing: tests call `collect()` (or `metricPoints`). */
export class TestReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE });
  }
  protected onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** The data points of every metric `reader` collects now, by metric name. */
export async function metricPoints(
  reader: MetricReader,
): Promise<Map<string, DataPoint<unknown>[]>> {
  const { resourceMetrics } = await reader.collect() as { resourceMetrics: ResourceMetrics };
  const out = new Map<string, DataPoint<unknown>[]>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      out.set(metric.descriptor.name, [
        ...out.get(metric.descriptor.name) ?? [],
        ...metric.dataPoints as DataPoint<unknown>[],
      ]);
    }
  }
  return out;
}

/** The sum of a counter's points whose attributes include `filter`. */
export function sum(
  points: DataPoint<unknown>[] | undefined,
  filter: Record<string, string> = {},
): number {
  return (points ?? [])
    .filter((p) => Object.entries(filter).every(([k, v]) => p.attributes[k] === v))
    .reduce((total, p) => total + (p.value as number), 0);
}
