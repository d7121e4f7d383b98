/**
 * Progress of a long operation: a redrawn bar on a terminal, plain lines otherwise (logs, CI).
 *
 * @module
 */

import type { CliIo } from "./io.ts";

/** Reports `done` of `total` with a detail text. */
export interface Progress {
  /** Reports progress (the bar is redrawn at most every 100 ms; plain lines are all printed). */
  update(done: number, detail: string): void;
  /** Ends the bar (its line is kept). */
  finish(): void;
}

const barWidth = 30;

/** A progress reporter for `io`: a bar when standard output is a terminal. */
export function createProgress(io: CliIo, label: string, total: number): Progress {
  if (!io.isTTY) {
    return {
      update(done, detail) {
        io.out(`${label} ${done}/${total} (${detail})\n`);
      },
      finish() {},
    };
  }
  let lastDraw = 0;
  let drawn = false;
  let pending: { done: number; detail: string } | undefined;
  const draw = (done: number, detail: string) => {
    const ratio = total > 0 ? Math.min(1, done / total) : 1;
    const filled = Math.round(ratio * barWidth);
    const bar = "#".repeat(filled) + "-".repeat(barWidth - filled);
    const percent = `${Math.floor(ratio * 100)}`.padStart(3);
    const line = `${label} [${bar}] ${percent}% ${done}/${total} ${detail}`;
    io.out(`\r\x1b[2K${line.slice(0, Math.max(20, io.columns - 1))}`);
    drawn = true;
    lastDraw = Date.now();
    pending = undefined;
  };
  return {
    update(done, detail) {
      if (Date.now() - lastDraw >= 100) draw(done, detail);
      else pending = { done, detail };
    },
    finish() {
      if (pending) draw(pending.done, pending.detail);
      if (drawn) io.out("\n");
    },
  };
}
