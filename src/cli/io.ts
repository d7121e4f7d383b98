/**
 * Where the CLI writes: standard output for results, standard error for errors and warnings,
 * and whether standard output is a terminal (progress bars, screen refreshes).
 *
 * @module
 */

import process from "node:process";

/** The CLI's output streams. */
export interface CliIo {
  /** Writes to standard output. */
  out(text: string): void;
  /** Writes to standard error. */
  err(text: string): void;
  /** Whether standard output is a terminal. */
  readonly isTTY: boolean;
  /** Terminal width (80 when unknown). */
  readonly columns: number;
}

/** The process's own streams. */
export function processIo(): CliIo {
  return {
    out: (text) => void process.stdout.write(text),
    err: (text) => void process.stderr.write(text),
    isTTY: process.stdout.isTTY === true,
    columns: process.stdout.columns || 80,
  };
}
