/**
 * SIGINT / SIGTERM handling for long-running commands: the first signal asks the command to
 * finish cleanly, a second one exits at once.
 *
 * @module
 */

import process from "node:process";

/** The signals that stop a command. */
export type StopSignal = "SIGINT" | "SIGTERM";

const signalNumbers: Record<StopSignal, number> = { SIGINT: 2, SIGTERM: 15 };

/** A handle on the installed handlers. */
export interface ShutdownSignals {
  /** Resolves with the first signal received. */
  readonly received: Promise<StopSignal>;
  /** Whether a signal was received. */
  readonly stopping: boolean;
  /** Removes the handlers (call it when the command is done). */
  dispose(): void;
}

/**
 * Installs handlers: the first SIGINT or SIGTERM resolves `received` (the command then stops
 * cleanly); a second one calls `onForce` and exits with 128 + the signal's number.
 */
export function onShutdownSignals(onForce: (signal: StopSignal) => void): ShutdownSignals {
  let resolve!: (signal: StopSignal) => void;
  const received = new Promise<StopSignal>((r) => resolve = r);
  let stopping = false;
  const handler = (signal: StopSignal) => {
    if (!stopping) {
      stopping = true;
      resolve(signal);
      return;
    }
    try {
      onForce(signal);
    } finally {
      process.exit(128 + signalNumbers[signal]);
    }
  };
  const installed: Array<[StopSignal, () => void]> = [];
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    const listener = () => handler(signal);
    try {
      process.on(signal, listener);
      installed.push([signal, listener]);
    } catch {
      // SIGTERM cannot be listened for on Windows.
    }
  }
  return {
    received,
    get stopping() {
      return stopping;
    },
    dispose() {
      for (const [signal, listener] of installed.splice(0)) process.off(signal, listener);
    },
  };
}
