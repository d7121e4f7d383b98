/**
 * Scoped pauses: one stream (or subject) that cannot take writes waits on its own, with a probe,
 * while every other message keeps flowing. The dispatcher owns the timers; this file keeps the
 * state.
 *
 * @module
 */

import type { OutboxPublishError } from "../core/errors.ts";
import type { OutboxFailureScope } from "../core/types.ts";

/**
 * A scope the dispatcher paused, from {@linkcode OutboxDispatcher.pausedScopes} and the
 * `onScopePaused` / `onScopeResumed` hooks.
 *
 * @example
 * ```ts
 * import type { PausedScopeInfo } from "@outbox/nats";
 * const log = (info: PausedScopeInfo) =>
 *   console.warn(`waiting for ${info.scope.kind} since ${new Date(info.since).toISOString()}`);
 * ```
 */
export interface PausedScopeInfo {
  /** The stream or subject that waits. */
  scope: Extract<OutboxFailureScope, { kind: "stream" | "subject" }>;
  /** The failure that paused it (the latest one). */
  error: OutboxPublishError;
  /** When it was paused (epoch milliseconds). */
  since: number;
  /** Subjects seen failing in this scope. */
  subjects: string[];
}

/**
 * What {@linkcode OutboxDispatcherOptions.onScopeResumed} receives.
 *
 * @example
 * ```ts
 * import type { ScopeResumedInfo } from "@outbox/nats";
 * const log = (info: ScopeResumedInfo) => console.info(`resumed after ${info.pausedMs} ms`);
 * ```
 */
export interface ScopeResumedInfo {
  /** The stream or subject that flows again. */
  scope: PausedScopeInfo["scope"];
  /** How long it was paused. */
  pausedMs: number;
}

/** One paused scope. Internal. */
export interface PausedScope {
  readonly key: string;
  readonly scope: PausedScopeInfo["scope"];
  error: OutboxPublishError;
  readonly since: number;
  readonly subjects: Set<string>;
  /** Probes made so far (the delay doubles with each). */
  probes: number;
  /** When (Date.now() time) its waiting messages are next worth claiming. */
  nextProbeAt: number;
  /** A probe is running (it may take the API timeout when the stream has no leader). */
  probing: boolean;
  /** When the running (or last) probe started (Date.now() time). */
  probeStartedAt: number;
  /** How long the last probe took: the next one is expected to take as long. */
  lastProbeMs: number;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/**
 * Longest delay between two probes of one paused scope (or `probeMaxIntervalMs` when smaller):
 * a stream is delivered within about this (plus one probe) of answering again. A scope probe is
 * one small request per paused stream.
 */
export const maxScopeProbeIntervalMs = 2_000;

/** How long a released scope's probe count is remembered, so a flapping scope keeps backing off. */
const rememberMs = 60_000;

/** The dispatcher's paused scopes, by stream / subject. Internal. */
export class PausedScopes {
  readonly #byKey = new Map<string, PausedScope>();
  readonly #bySubject = new Map<string, PausedScope>();
  readonly #released = new Map<string, { probes: number; at: number }>();

  /** Whether any scope is paused. */
  get size(): number {
    return this.#byKey.size;
  }

  /**
   * Pauses the failure's scope (a `stream` or `subject` one) for `subject`; `isNew` when it was
   * not paused yet. Returns `undefined` for failures without such a scope.
   */
  pause(
    error: OutboxPublishError,
    subject: string | undefined,
    now: number,
  ): { paused: PausedScope; isNew: boolean } | undefined {
    const scope = error.scope;
    if (!scope || (scope.kind !== "stream" && scope.kind !== "subject")) return undefined;
    const key = scope.kind === "stream" ? `stream:${scope.stream}` : `subject:${scope.subject}`;
    let paused = this.#byKey.get(key);
    const isNew = paused === undefined;
    if (!paused) {
      const previous = this.#released.get(key);
      this.#released.delete(key);
      paused = {
        key,
        scope,
        error,
        since: now,
        subjects: new Set(),
        probes: previous && now - previous.at < rememberMs ? previous.probes : 0,
        nextProbeAt: now,
        probing: false,
        probeStartedAt: now,
        lastProbeMs: 0,
        timer: undefined,
      };
      this.#byKey.set(key, paused);
    }
    paused.error = error;
    const subjects = scope.kind === "subject" ? [scope.subject] : [];
    if (subject !== undefined) subjects.push(subject);
    for (const item of subjects) {
      paused.subjects.add(item);
      this.#bySubject.set(item, paused);
    }
    return { paused, isNew };
  }

  /** The paused scope `subject` belongs to, if any. */
  holding(subject: string): PausedScope | undefined {
    return this.#bySubject.get(subject);
  }

  /** Whether `paused` is still paused (not released meanwhile). */
  has(paused: PausedScope): boolean {
    return this.#byKey.get(paused.key) === paused;
  }

  /** Releases a scope; returns how long it was paused. */
  release(paused: PausedScope, now: number): number {
    if (!this.has(paused)) return 0;
    this.#byKey.delete(paused.key);
    for (const subject of paused.subjects) {
      if (this.#bySubject.get(subject) === paused) this.#bySubject.delete(subject);
    }
    if (paused.timer !== undefined) clearTimeout(paused.timer);
    paused.timer = undefined;
    if (this.#released.size > 1_000) this.#released.clear();
    this.#released.set(paused.key, { probes: paused.probes, at: now });
    return Math.max(0, now - paused.since);
  }

  /** Every paused scope. */
  all(): PausedScope[] {
    return [...this.#byKey.values()];
  }

  /** Cancels every probe timer (stop). */
  clearTimers(): void {
    for (const paused of this.#byKey.values()) {
      if (paused.timer !== undefined) clearTimeout(paused.timer);
      paused.timer = undefined;
    }
  }
}

/** The public view of a paused scope. Internal. */
export function pausedScopeInfo(paused: PausedScope): PausedScopeInfo {
  return {
    scope: paused.scope,
    error: paused.error,
    since: paused.since,
    subjects: [...paused.subjects],
  };
}
