/**
 * Connecting to NATS for the CLI (the CLI's own dependency on `@nats-io/transport-node`; the
 * library itself stays transport-agnostic).
 *
 * @module
 */

import { connect, type NatsConnection } from "@nats-io/transport-node";
import { CliError, describeError } from "./errors.ts";
import { redactUrl } from "./format.ts";

/** Options of {@linkcode connectNats}. */
export interface ConnectNatsOptions {
  /** The connection name the server shows (`outbox-nats <command>`). */
  name: string;
  /** Keep reconnecting forever after the first connection (the relay). @default {false} */
  reconnectForever?: boolean;
  /** How long the first connection may take. @default {10000} */
  timeoutMs?: number;
}

/**
 * Connects to `url` (servers separated by commas). An unreachable server rejects with a
 * {@linkcode CliError} naming it.
 */
export async function connectNats(
  url: string,
  options: ConnectNatsOptions,
): Promise<NatsConnection> {
  const servers = url.split(",").map((server) => server.trim()).filter(Boolean);
  if (servers.length === 0) {
    throw new CliError("--nats needs a server URL, such as nats://127.0.0.1:4222");
  }
  try {
    return await connect({
      servers,
      name: options.name,
      timeout: options.timeoutMs ?? 10_000,
      maxReconnectAttempts: options.reconnectForever ? -1 : 10,
    });
  } catch (error) {
    throw new CliError(`cannot connect to NATS at ${redactUrl(url)}: ${describeError(error)}`, {
      cause: error,
    });
  }
}
