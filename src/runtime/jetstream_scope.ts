/**
 * Telling JetStream failures apart by scope. A publish that nothing answered ("no responders",
 * which nats.js reports as `JetStreamNotEnabled`) can mean JetStream is off, no stream captures
 * the subject, or the subject's stream has no leader; a 503 from a stream (e.g. full with
 * `discard: new`) concerns that stream only. The JetStream API says which, and answers the
 * dispatcher's per-scope probes.
 *
 * @module
 */

import { OutboxPublishError } from "../core/errors.ts";
import type { OutboxFailureScope } from "../core/types.ts";
import { causeChain } from "./jetstream_errors.ts";

/**
 * What a stream probe reads from stream info (a nats.js `StreamInfo` fits): the cluster leader
 * and, for `discard: new` streams, whether there is room.
 *
 * @example
 * ```ts
 * import type { StreamInfoLike } from "@outbox/nats";
 * const info: StreamInfoLike = {
 *   config: { discard: "new", max_msgs: 100 },
 *   state: { messages: 100 },
 *   cluster: { leader: "n1" },
 * };
 * ```
 */
export interface StreamInfoLike {
  /** Limits: `discard` policy, `max_msgs`, `max_bytes` (`-1` or `0`: unlimited). */
  config?: { discard?: string; max_msgs?: number; max_bytes?: number };
  /** Stored messages and bytes. */
  state?: { messages?: number; bytes?: number };
  /** Present in a cluster; without `leader` the stream takes no writes. */
  cluster?: { leader?: string };
}

/**
 * A stored message as the key fence reads it (a nats.js `StoredMsg` fits).
 *
 * @example
 * ```ts
 * import type { StoredMessageLike } from "@outbox/nats";
 * const stored: StoredMessageLike = { seq: 7, header: new Headers({ "Nats-Msg-Id": "m-1" }) };
 * ```
 */
export interface StoredMessageLike {
  /** Its stream sequence. */
  seq: number;
  /** Its headers (`get(name)`), absent when it has none. */
  header?: { get(name: string): string | null | undefined };
}

/**
 * The part of a nats.js `JetStreamManager` the runtime uses: account info (probe), and, when
 * present, `streams.find` (`$JS.API.STREAM.NAMES` with a subject filter) and `streams.info`.
 *
 * @example
 * ```ts
 * import type { JetStreamManagerLike } from "@outbox/nats";
 * const manager: JetStreamManagerLike = { getAccountInfo: () => Promise.resolve({}) };
 * ```
 */
export interface JetStreamManagerLike {
  /** `$JS.API.INFO`. */
  getAccountInfo(): Promise<unknown>;
  /** Stream lookups; without them failures are scoped by subject only. */
  streams?: {
    /** The name of the stream capturing `subject`; rejects with `StreamNotFoundError` if none. */
    find(subject: string): Promise<string>;
    /** Stream info: configuration, state and cluster leader. */
    info(stream: string): Promise<StreamInfoLike>;
    /**
     * `$JS.API.STREAM.MSG.GET`: the last message on a subject (`null` when there is none). The
     * key fence reads it to recognise a refused retry whose first attempt was stored.
     */
    getMessage?(
      stream: string,
      query: { last_by_subj: string },
    ): Promise<StoredMessageLike | null>;
  };
}

/** How long one subject's diagnosis is reused (a burst of failures costs one lookup). */
const diagnosisTtlMs = 1_000;
/** How long an account-info request that failed (not "no responders") is believed. */
const unreachableTtlMs = 5_000;
/**
 * Longest wait for a diagnosis before the failure is reported as `stream_unavailable` for the
 * subject (the lookup goes on and serves the next failures): a JetStream API that does not
 * answer must not hold every batch with a stuck message for the API timeout.
 */
const maxDiagnosisWaitMs = 1_000;
/** Subjects whose stream is remembered from PubAcks, at most. */
const maxKnownSubjects = 10_000;
/** JetStream API error code: no stream matches the subject. */
const streamNotFound = 10059;

/** Diagnoses failures by scope and probes scopes, for one JetStream client. Internal. */
export class JetStreamScopes {
  readonly #manager: () => Promise<JetStreamManagerLike>;
  readonly #ping: (() => Promise<unknown>) | undefined;
  /** The latest connection round trip (shared like `#account`): answered, or not. */
  #pinged: { at: number; result: Promise<boolean> } | undefined;
  readonly #streamOf = new Map<string, string>();
  readonly #diagnoses = new Map<string, { at: number; result: Promise<OutboxPublishError> }>();
  /**
   * The latest account-info answer, shared by every subject's diagnosis while it runs and then
   * for `diagnosisTtlMs` (`unreachableTtlMs` when the API did not answer): many new subjects
   * failing at once wait for ONE request.
   */
  #account: AccountCheck | undefined;

  /**
   * `ping`: a round trip to the server on the publishing connection (nats.js `nc.flush()`). With
   * it a PubAck `timeout` while the server answers is scoped to the subject's stream: a stream
   * without a leader (e.g. two of three nodes down) must not stop the streams that take writes.
   */
  constructor(manager: () => Promise<JetStreamManagerLike>, ping?: () => Promise<unknown>) {
    this.#manager = manager;
    this.#ping = ping;
  }

  /** Remembers which stream took a subject (from a PubAck), to name it when the API is down. */
  learn(subject: string, stream: string): void {
    if (this.#streamOf.get(subject) === stream) return;
    if (this.#streamOf.size >= maxKnownSubjects) this.#streamOf.clear();
    this.#streamOf.set(subject, stream);
  }

  /** Makes a classified publish failure precise and scoped, asking the JetStream API once. */
  refine(subject: string, error: OutboxPublishError): Promise<OutboxPublishError> {
    if (error.scope) return Promise.resolve(error);
    if (error.code === "timeout" && error.kind === "unavailable" && this.#ping) {
      return this.#timedOut(subject, error);
    }
    const noAnswer = error.code === "no_stream";
    const streamBusy = error.kind === "unavailable" && error.code.startsWith("api_");
    if (!noAnswer && !streamBusy) return Promise.resolve(error);
    const key = `${noAnswer ? "n" : "b"}:${subject}`;
    const now = Date.now();
    const cached = this.#diagnoses.get(key);
    if (cached && now - cached.at < diagnosisTtlMs) return cached.result;
    if (this.#diagnoses.size > 1_000) this.#diagnoses.clear();
    const diagnosis = noAnswer ? this.#noAnswer(subject, error) : this.#streamBusy(subject, error);
    const result = this.#within(diagnosis, () => this.#stuck(subject, undefined, error));
    this.#diagnoses.set(key, { at: now, result });
    return result;
  }

  /** `diagnosis`, or `fallback()` if it takes longer than `maxDiagnosisWaitMs`. */
  #within(
    diagnosis: Promise<OutboxPublishError>,
    fallback: () => OutboxPublishError,
  ): Promise<OutboxPublishError> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(fallback()), maxDiagnosisWaitMs);
      void diagnosis.then((refined) => {
        clearTimeout(timer);
        resolve(refined);
      });
    });
  }

  /** Whether `scope` would take writes again. Never publishes, never rejects. */
  async probe(scope: OutboxFailureScope): Promise<boolean> {
    try {
      const manager = await this.#manager();
      switch (scope.kind) {
        case "connection":
        case "jetstream":
          await manager.getAccountInfo();
          return true;
        case "stream":
          return await this.#streamWritable(manager, scope.stream);
        case "subject": {
          if (!manager.streams) {
            await manager.getAccountInfo();
            return true;
          }
          let stream: string;
          try {
            stream = await manager.streams.find(scope.subject);
          } catch (error) {
            // No stream at all: let the message try again and fail as `no_stream` (with backoff).
            return isStreamNotFound(error);
          }
          return await this.#streamWritable(manager, stream);
        }
      }
    } catch {
      return false;
    }
  }

  async #streamWritable(manager: JetStreamManagerLike, stream: string): Promise<boolean> {
    if (!manager.streams) {
      await manager.getAccountInfo();
      return true;
    }
    let info: StreamInfoLike;
    try {
      info = await manager.streams.info(stream);
    } catch (error) {
      // Deleted meanwhile: the next attempt finds out what captures the subject now.
      return isStreamNotFound(error);
    }
    if (info.cluster && !info.cluster.leader) return false;
    if (info.config?.discard === "new") {
      const { max_msgs: maxMsgs = -1, max_bytes: maxBytes = -1 } = info.config;
      const { messages = 0, bytes = 0 } = info.state ?? {};
      if (maxMsgs > 0 && messages >= maxMsgs) return false;
      if (maxBytes > 0 && bytes >= maxBytes) return false;
    }
    return true;
  }

  #accountAnswer(): Promise<AccountAnswer> {
    const cached = this.#account;
    if (cached) {
      if (!cached.answer) return cached.result; // still asking
      const ttl = cached.answer.manager ? diagnosisTtlMs : unreachableTtlMs;
      if (Date.now() - cached.settledAt < ttl) return cached.result;
    }
    const entry: AccountCheck = {
      result: Promise.resolve({ error: undefined }),
      settledAt: 0,
    };
    entry.result = (async (): Promise<AccountAnswer> => {
      let answer: AccountAnswer;
      try {
        const manager = await this.#manager();
        await manager.getAccountInfo();
        answer = { manager };
      } catch (error) {
        answer = { error };
      }
      entry.answer = answer;
      entry.settledAt = Date.now();
      return answer;
    })();
    this.#account = entry;
    return entry.result;
  }

  async #noAnswer(subject: string, error: OutboxPublishError): Promise<OutboxPublishError> {
    const account = await this.#accountAnswer();
    const manager = account.manager;
    if (!manager) {
      if (isNoResponders(account.error)) {
        return new OutboxPublishError(
          "unavailable",
          "JetStream is not enabled on the server (or not for this account): nothing answers $JS.API.INFO",
          { code: "jetstream_not_enabled", cause: error, scope: { kind: "jetstream" } },
        );
      }
      // The API did not answer (no meta leader?) but a publish got a quick "no responders":
      // other streams may still take writes, so only this subject (or its known stream) waits.
      return this.#stuck(subject, undefined, error);
    }
    if (!manager.streams) {
      return new OutboxPublishError("retryable", error.message, {
        code: error.code,
        cause: error.cause,
        scope: { kind: "subject", subject },
      });
    }
    let stream: string;
    try {
      stream = await manager.streams.find(subject);
    } catch (findError) {
      if (isStreamNotFound(findError)) {
        return new OutboxPublishError(
          "retryable",
          `no JetStream stream captures the subject '${subject}' (create a stream whose subjects include it)`,
          { code: "no_stream", cause: error, scope: { kind: "subject", subject } },
        );
      }
      return this.#stuck(subject, undefined, error);
    }
    this.learn(subject, stream);
    return this.#stuck(subject, stream, error);
  }

  async #streamBusy(subject: string, error: OutboxPublishError): Promise<OutboxPublishError> {
    let stream = this.#streamOf.get(subject);
    if (stream === undefined) {
      try {
        const manager = await this.#manager();
        if (manager.streams) stream = await manager.streams.find(subject);
      } catch {
        // Scoped by subject below.
      }
    }
    const scope: OutboxFailureScope = stream === undefined
      ? { kind: "subject", subject }
      : { kind: "stream", stream };
    const where = stream === undefined ? `the stream of '${subject}'` : `stream '${stream}'`;
    return new OutboxPublishError("unavailable", `${where} cannot take writes: ${error.message}`, {
      code: error.code,
      cause: error,
      scope,
    });
  }

  /**
   * A PubAck timeout: scoped to the subject's stream (or the subject) when the server answers a
   * round trip within `maxDiagnosisWaitMs`, left unscoped (broker-wide) otherwise. One round trip
   * serves every timeout for `diagnosisTtlMs`.
   */
  async #timedOut(subject: string, error: OutboxPublishError): Promise<OutboxPublishError> {
    const now = Date.now();
    let pinged = this.#pinged;
    if (!pinged || now - pinged.at >= diagnosisTtlMs) {
      const ping = this.#ping!;
      const result = new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), maxDiagnosisWaitMs);
        const done = (answered: boolean) => {
          clearTimeout(timer);
          resolve(answered);
        };
        try {
          ping().then(() => done(true), () => done(false));
        } catch {
          done(false);
        }
      });
      pinged = { at: now, result };
      this.#pinged = pinged;
    }
    if (!(await pinged.result)) return error;
    const stream = this.#streamOf.get(subject);
    const where = stream === undefined ? `the stream of '${subject}'` : `stream '${stream}'`;
    return new OutboxPublishError(
      "unavailable",
      `${where} did not acknowledge in time although the server answers (no leader, or overloaded): ${error.message}`,
      {
        code: error.code,
        cause: error,
        scope: stream === undefined ? { kind: "subject", subject } : { kind: "stream", stream },
      },
    );
  }

  #stuck(
    subject: string,
    found: string | undefined,
    error: OutboxPublishError,
  ): OutboxPublishError {
    const stream = found ?? this.#streamOf.get(subject);
    if (stream !== undefined) {
      return new OutboxPublishError(
        "unavailable",
        `stream '${stream}' (capturing '${subject}') did not answer: it has no leader (servers down?)`,
        { code: "stream_unavailable", cause: error, scope: { kind: "stream", stream } },
      );
    }
    return new OutboxPublishError(
      "unavailable",
      `nothing answered on '${subject}' and the JetStream API did not say which stream captures it`,
      { code: "stream_unavailable", cause: error, scope: { kind: "subject", subject } },
    );
  }
}

/** What account info answered: a manager that works, or the error. */
type AccountAnswer = { manager: JetStreamManagerLike; error?: undefined } | {
  manager?: undefined;
  error: unknown;
};

/** One account-info request: its promise, and its answer once settled. */
interface AccountCheck {
  result: Promise<AccountAnswer>;
  answer?: AccountAnswer;
  settledAt: number;
}

/** JetStream API error code: JetStream is not enabled for the account. */
const notEnabledForAccount = 10039;

function isNoResponders(error: unknown): boolean {
  return causeChain(error).some((item) =>
    item.name === "NoResponders" || item.name === "NoRespondersError" ||
    item.name === "JetStreamNotEnabled" ||
    (item as { code?: unknown }).code === notEnabledForAccount
  );
}

function isStreamNotFound(error: unknown): boolean {
  return causeChain(error).some((item) =>
    item.name === "StreamNotFoundError" ||
    (item as { code?: unknown }).code === streamNotFound
  );
}
