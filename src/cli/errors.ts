/**
 * The CLI's errors and how any error becomes ONE line for the operator: usage errors exit 2,
 * everything else 1; stacks only with `--verbose`.
 *
 * @module
 */

/** Exit code of a successful command. */
export const exitOk = 0;
/** Exit code of a runtime failure (database or NATS unreachable, missing tables, ...). */
export const exitFailure = 1;
/** Exit code of a usage error (unknown command or option, bad value, unknown URL scheme). */
export const exitUsage = 2;

/** The command line is wrong: exit code 2, and a hint to `--help`. */
export class CliUsageError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CliUsageError";
  }
}

/** A failure the CLI explains itself (its message is the whole story): exit code 1. */
export class CliError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CliError";
  }
}

/** The exit code for an error. */
export function exitCodeOf(error: unknown): number {
  return error instanceof CliUsageError ? exitUsage : exitFailure;
}

/**
 * One line describing an error: the message of a {@linkcode CliError} as is; for anything else
 * its message, with the driver's error code when it adds something (`ECONNREFUSED`, SQLSTATE).
 */
export function describeError(error: unknown): string {
  if (error instanceof CliError || error instanceof CliUsageError) return oneLine(error.message);
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    const message = oneLine(error.message || error.name);
    if (typeof code === "string" && code.length > 0 && !message.includes(code)) {
      return `${message} (${code})`;
    }
    return message;
  }
  return oneLine(String(error));
}

/** The stack of an error and of its causes, for `--verbose`. */
export function describeVerbose(error: unknown): string {
  const lines: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current !== undefined && depth < 8; depth++) {
    const text = current instanceof Error ? current.stack ?? String(current) : String(current);
    lines.push(depth === 0 ? text : `caused by: ${text}`);
    current = current instanceof Error ? current.cause : undefined;
  }
  return lines.join("\n");
}

function oneLine(text: string): string {
  return text.replace(/\s*[\r\n]+\s*/g, " ").trim();
}
