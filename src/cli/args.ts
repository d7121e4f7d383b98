/**
 * Command-line parsing: each command declares its options once, and both parsing (node:util
 * `parseArgs`, strict) and its `--help` text come from that declaration.
 *
 * @module
 */

import process from "node:process";
import { parseArgs } from "node:util";
import { CliUsageError } from "./errors.ts";
import { checkedNatsServers } from "./nats.ts";
import { natsSecurity, natsSecurityOptions } from "./nats_auth.ts";
import { parseDuration } from "./format.ts";
import { parseStoreUrl } from "./store_url.ts";
import type { StoreSettings } from "./store.ts";

/** One option of a command. */
export interface OptionSpec {
  /** A flag (`boolean`) or an option with a value (`string`). */
  type: "string" | "boolean";
  /** One-letter alias. */
  short?: string;
  /** Placeholder of the value in the help (`<url>`). */
  value?: string;
  /** The default, as the help shows it (applied by the command). */
  default?: string;
  /** Environment variable read when the option is absent. */
  env?: string;
  /** May be given several times. */
  multiple?: boolean;
  /**
   * The value may be left out (`--watch` or `--watch 5s`): then `omitted` is used. A following
   * argument is taken as the value only if `accepts` says so.
   */
  optionalValue?: { omitted: string; accepts: (text: string) => boolean };
  /** One line of help. */
  description: string;
}

/** A command: its name, help and options. */
export interface CommandSpec {
  /** `status`, `dead list`, ... */
  name: string;
  /** One line for the command list. */
  summary: string;
  /** Arguments after the options in the usage line (`<id...>`). */
  args?: string;
  /** Paragraphs after the usage line. */
  description?: string;
  /** Options of this command (the shared ones are added by the caller). */
  options: Record<string, OptionSpec>;
  /** Positional arguments: how many are allowed. @default {0} */
  maxPositionals?: number;
  /** Example command lines. */
  examples?: string[];
}

/** Parsed values, by option name. */
export type OptionValues = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** What {@linkcode parseCommand} returns. */
export interface ParsedCommand {
  /** Option values (environment fallbacks applied). */
  values: OptionValues;
  /** Positional arguments. */
  positionals: string[];
}

/** Options every command has. */
export const commonOptions: Record<string, OptionSpec> = {
  help: { type: "boolean", short: "h", description: "Show this help and exit" },
  verbose: {
    type: "boolean",
    short: "v",
    description: "Show stack traces (with causes) of errors",
  },
};

/** Options that name the store. */
export const storeOptions: Record<string, OptionSpec> = {
  store: {
    type: "string",
    short: "s",
    value: "<url>",
    env: "OUTBOX_STORE_URL",
    description: "The store: postgres://..., postgresql://..., sqlite:<path> or nats-kv://<bucket>",
  },
  "outbox-table": {
    type: "string",
    value: "<name>",
    default: "trellis_outbox",
    description: "SQL outbox table",
  },
  "inbox-table": {
    type: "string",
    value: "<name>",
    default: "trellis_inbox",
    description: "SQL inbox table (migrate creates it next to the outbox)",
  },
  "migrations-table": {
    type: "string",
    value: "<name>",
    default: "<outbox-table>_migrations",
    description: "SQL table recording applied migrations",
  },
  bucket: {
    type: "string",
    value: "<name>",
    description: "NATS KV bucket, when the store URL is just nats-kv:",
  },
  nats: {
    type: "string",
    value: "<url>",
    env: "OUTBOX_NATS_URL",
    description: "NATS server(s), comma-separated: nats://host:4222 or tls://host:4222",
  },
  ...natsSecurityOptions,
};

/** The options of a command including the shared ones. */
export function allOptions(spec: CommandSpec, withStore = true): Record<string, OptionSpec> {
  return { ...spec.options, ...(withStore ? storeOptions : {}), ...commonOptions };
}

/**
 * Parses `argv` (the arguments after the command name) against `options`. Unknown options,
 * missing values and surplus arguments are usage errors.
 */
export function parseCommand(
  spec: CommandSpec,
  options: Record<string, OptionSpec>,
  argv: readonly string[],
): ParsedCommand {
  const args = expandOptionalValues(options, argv);
  let parsed;
  try {
    parsed = parseArgs({
      args,
      options: Object.fromEntries(
        Object.entries(options).map(([name, option]) => [name, {
          type: option.type,
          ...(option.short ? { short: option.short } : {}),
          ...(option.multiple ? { multiple: true } : {}),
        }]),
      ),
      allowPositionals: true,
      strict: true,
    });
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    throw new CliUsageError(
      `${spec.name}: ${message.replace(/\. To specify a positional.*$/s, "").split("\n")[0]}`,
    );
  }
  const values: OptionValues = { ...parsed.values };
  for (const [name, option] of Object.entries(options)) {
    if (values[name] === undefined && option.env) {
      const fromEnv = process.env[option.env];
      if (fromEnv) values[name] = fromEnv;
    }
  }
  const max = spec.maxPositionals ?? 0;
  if (!values.help && parsed.positionals.length > max) {
    const extra = parsed.positionals.slice(max).join(" ");
    throw new CliUsageError(`${spec.name}: unexpected argument(s): ${extra}`);
  }
  return { values, positionals: parsed.positionals };
}

/** `--watch` / `--watch 5s` -> `--watch=<value>`, for options with an optional value. */
function expandOptionalValues(
  options: Record<string, OptionSpec>,
  argv: readonly string[],
): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--") {
      out.push(...argv.slice(i));
      break;
    }
    const name = arg.startsWith("--") ? arg.slice(2) : undefined;
    const next = argv[i + 1];
    if (
      name !== undefined && options[name]?.type === "string" && !options[name].optionalValue &&
      next !== undefined && /^-\d/.test(next)
    ) {
      // parseArgs would call it an ambiguous option; no option of ours takes a negative number.
      throw new CliUsageError(
        `--${name}: negative values are not accepted, got ${JSON.stringify(next)}`,
      );
    }
    const optional = name !== undefined ? options[name]?.optionalValue : undefined;
    if (optional) {
      if (next !== undefined && optional.accepts(next)) {
        out.push(`${arg}=${next}`);
        i += 1;
      } else {
        out.push(`${arg}=${optional.omitted}`);
      }
      continue;
    }
    out.push(arg);
  }
  return out;
}

/** The help text of a command. */
export function helpText(spec: CommandSpec, options: Record<string, OptionSpec>): string {
  const lines = [
    `outbox-nats ${spec.name}: ${spec.summary}`,
    "",
    `Usage: outbox-nats ${spec.name} [options]${spec.args ? ` ${spec.args}` : ""}`,
  ];
  if (spec.description) lines.push("", spec.description);
  lines.push("", "Options:");
  const rows = Object.entries(options).map(([name, option]) => {
    let flag = option.short ? `-${option.short}, --${name}` : `    --${name}`;
    if (option.type === "string") {
      flag += option.optionalValue
        ? ` [${option.value ?? "<value>"}]`
        : ` ${option.value ?? "<value>"}`;
    }
    const notes: string[] = [];
    if (option.default !== undefined) notes.push(`default: ${option.default}`);
    if (option.env) notes.push(`env: ${option.env}`);
    return [flag, option.description + (notes.length ? ` (${notes.join("; ")})` : "")];
  });
  const width = Math.max(...rows.map(([flag]) => flag.length));
  for (const [flag, text] of rows) lines.push(`  ${flag.padEnd(width)}  ${text}`);
  if (spec.examples?.length) {
    lines.push("", "Examples:");
    for (const example of spec.examples) lines.push(`  ${example}`);
  }
  lines.push(
    "",
    "Exit codes: 0 success, 1 failure (store or NATS unreachable, missing tables, ...), 2 usage error.",
  );
  return lines.join("\n") + "\n";
}

/** A string option's value (environment fallback applied), or `undefined`. */
export function stringValue(values: OptionValues, name: string): string | undefined {
  const value = values[name];
  return typeof value === "string" ? value : undefined;
}

/** A duration option in milliseconds, `fallback` when absent. */
export function durationValue(values: OptionValues, name: string, fallback: number): number;
/** A duration option in milliseconds, or `undefined` when absent. */
export function durationValue(values: OptionValues, name: string): number | undefined;
export function durationValue(
  values: OptionValues,
  name: string,
  fallback?: number,
): number | undefined {
  const text = stringValue(values, name);
  return text === undefined ? fallback : parseDuration(text, `--${name}`);
}

/** An integer option >= `min`, `fallback` when absent. */
export function integerValue(
  values: OptionValues,
  name: string,
  fallback: number,
  min = 1,
): number {
  const text = stringValue(values, name);
  if (text === undefined) return fallback;
  const value = Number(text);
  if (!/^\s*\d+\s*$/.test(text) || !Number.isSafeInteger(value) || value < min) {
    throw new CliUsageError(
      `--${name}: expected an integer >= ${min}, got ${JSON.stringify(text)}`,
    );
  }
  return value;
}

/** The store settings from the shared store options; `--store` is required. */
export function storeSettings(
  values: OptionValues,
  client: string,
): StoreSettings {
  const url = stringValue(values, "store");
  if (!url) {
    throw new CliUsageError(
      "no store given: pass --store <url> (or set OUTBOX_STORE_URL), e.g. --store postgres://localhost/app",
    );
  }
  const natsUrl = checkedNatsUrl(stringValue(values, "nats"));
  return {
    target: parseStoreUrl(url, stringValue(values, "bucket")),
    tables: {
      outbox: stringValue(values, "outbox-table"),
      inbox: stringValue(values, "inbox-table"),
      migrations: stringValue(values, "migrations-table"),
    },
    natsUrl,
    // Read only when NATS is used: a command on a SQL store ignores NATS settings.
    natsSecurity: natsUrl === undefined ? undefined : natsSecurity(values, natsUrl),
    client,
  };
}

/** `--nats` checked before anything connects (a usage error for `http://...`). */
function checkedNatsUrl(url: string | undefined): string | undefined {
  if (url !== undefined) checkedNatsServers(url);
  return url;
}

/** A command the CLI runs: its declaration and what it does. */
export interface Command extends CommandSpec {
  /** Whether the store options apply. @default {true} */
  usesStore?: boolean;
  /** Runs the command; resolves with the exit code. */
  run(parsed: ParsedCommand, io: import("./io.ts").CliIo): Promise<number>;
}
