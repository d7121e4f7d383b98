/**
 * The CLI's entry: finds the command, parses its options, runs it, and turns every error into
 * one line on standard error and an exit code.
 *
 * @module
 */

import { packageVersion as version } from "../version.ts";
import { allOptions, type Command, helpText, parseCommand } from "./args.ts";
import { deadListCommand } from "./dead.ts";
import { CliUsageError, describeError, describeVerbose, exitCodeOf } from "./errors.ts";
import { type CliIo, processIo } from "./io.ts";
import { migrateCommand } from "./migrate.ts";
import { pruneCommand } from "./prune.ts";
import { relayCommand } from "./relay.ts";
import { requeueCommand } from "./requeue.ts";
import { statusCommand } from "./status.ts";

/** Every command, in the order the help lists them. */
export const commands: readonly Command[] = [
  statusCommand,
  deadListCommand,
  requeueCommand,
  pruneCommand,
  migrateCommand,
  relayCommand,
];

/** The help of the whole CLI. */
export function mainHelp(): string {
  const width = Math.max(...commands.map((command) => command.name.length));
  return [
    `outbox-nats ${version}: operate a transactional outbox on NATS JetStream`,
    "",
    "Usage: outbox-nats <command> [options]",
    "",
    "Commands:",
    ...commands.map((command) => `  ${command.name.padEnd(width)}  ${command.summary}`),
    "",
    "Every command takes --store <url> (or OUTBOX_STORE_URL): postgres://..., postgresql://...,",
    "sqlite:<path> or nats-kv://<bucket> with --nats <url>. Run outbox-nats <command> --help for its",
    "options. --verbose shows stack traces of errors.",
    "",
    "Exit codes: 0 success, 1 failure (store or NATS unreachable, missing tables, ...), 2 usage error.",
    "",
  ].join("\n");
}

/** Finds the command named by the first arguments (`dead list` takes two). */
function findCommand(argv: readonly string[]): { command: Command; rest: string[] } {
  const [first, second] = argv;
  if (first === "dead") {
    if (second === "list") return { command: deadListCommand, rest: argv.slice(2) };
    if (second === "--help" || second === "-h") {
      return { command: deadListCommand, rest: ["--help"] };
    }
    if (second === undefined || second.startsWith("-")) {
      throw new CliUsageError(
        `"dead" needs a subcommand: "dead list" (see outbox-nats dead list --help)`,
      );
    }
    throw new CliUsageError(
      `unknown command "dead ${second}"; did you mean "dead list"? (see outbox-nats --help)`,
    );
  }
  const command = commands.find((candidate) => candidate.name === first);
  if (!command) {
    throw new CliUsageError(`unknown command "${first}" (see outbox-nats --help)`);
  }
  return { command, rest: argv.slice(1) };
}

/**
 * Runs the CLI with `argv` (the arguments after the program name) and resolves with the exit
 * code: 0 success, 1 runtime failure, 2 usage error. Errors are written to `io.err` as one line
 * (with stacks when `--verbose` is among the arguments).
 */
export async function run(argv: readonly string[], io: CliIo = processIo()): Promise<number> {
  const verbose = argv.includes("--verbose") || argv.includes("-v");
  try {
    if (argv.length === 0) {
      io.err(mainHelp());
      return 2;
    }
    const first = argv[0];
    if (first === "--help" || first === "-h" || first === "help") {
      const topic = first === "help" ? argv.slice(1) : [];
      if (topic.length > 0) return await run([...topic, "--help"], io);
      io.out(mainHelp());
      return 0;
    }
    if (first === "--version" || first === "-V") {
      io.out(`outbox-nats ${version}\n`);
      return 0;
    }
    if (first.startsWith("-")) {
      throw new CliUsageError(
        `expected a command before ${first} (see outbox-nats --help)`,
      );
    }
    const { command, rest } = findCommand(argv);
    const options = allOptions(command, command.usesStore !== false);
    const parsed = parseCommand(command, options, rest);
    if (parsed.values.help === true) {
      io.out(helpText(command, options));
      return 0;
    }
    return await command.run(parsed, io);
  } catch (error) {
    io.err(`outbox-nats: ${describeError(error)}\n`);
    if (verbose) io.err(describeVerbose(error) + "\n");
    return exitCodeOf(error);
  }
}
