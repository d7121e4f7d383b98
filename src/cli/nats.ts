/**
 * Connecting to NATS for the CLI (the CLI's own dependency on `@nats-io/transport-node`; the
 * library itself stays transport-agnostic).
 *
 * @module
 */

import { connect, type NatsConnection } from "@nats-io/transport-node";
import { CliError, CliUsageError, describeError } from "./errors.ts";
import { redactUrl } from "./format.ts";
import type { NatsSecurity } from "./nats_auth.ts";

/** Options of {@linkcode connectNats}. */
export interface ConnectNatsOptions {
  /** The connection name the server shows (`outbox-nats <command>`). */
  name: string;
  /** Keep reconnecting forever after the first connection (the relay). @default {false} */
  reconnectForever?: boolean;
  /** How long the first connection may take. @default {10000} */
  timeoutMs?: number;
  /** Credentials and TLS (from the `--nats-*` options). */
  security?: NatsSecurity;
}

/**
 * Connects to `url` (servers separated by commas). An unreachable server rejects with a
 * {@linkcode CliError} naming it.
 */
export async function connectNats(
  url: string,
  options: ConnectNatsOptions,
): Promise<NatsConnection> {
  const servers = checkedNatsServers(url);
  try {
    return await connect({
      // nats.js takes host:port; tls:// is honoured through the tls option (natsSecurity).
      servers: servers.map((server) => server.replace(/^tls:\/\//i, "nats://")),
      name: options.name,
      timeout: options.timeoutMs ?? 10_000,
      maxReconnectAttempts: options.reconnectForever ? -1 : 10,
      ...(options.security?.authenticator ? { authenticator: options.security.authenticator } : {}),
      ...(options.security?.tls ? { tls: options.security.tls } : {}),
    });
  } catch (error) {
    const using = options.security?.description.length
      ? ` (${options.security.description.join(", ")})`
      : "";
    throw new CliError(
      `cannot connect to NATS at ${redactUrl(url)}${using}: ${describeError(error)}`,
      { cause: error },
    );
  }
}

/**
 * The servers of a `--nats` value (comma separated): `nats://`, `tls://` or a bare `host:port`.
 * Anything else (`http://...`, a typo) is a usage error rather than a silent misconnection.
 */
export function checkedNatsServers(url: string): string[] {
  const servers = url.split(",").map((server) => server.trim()).filter(Boolean);
  if (servers.length === 0) {
    throw new CliUsageError("--nats needs a server URL, such as nats://127.0.0.1:4222");
  }
  for (const server of servers) {
    const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(server)?.[1]?.toLowerCase();
    if (scheme !== undefined && scheme !== "nats" && scheme !== "tls") {
      throw new CliUsageError(
        `--nats: ${JSON.stringify(redactUrl(server))} is not a NATS URL; use nats://host:4222 ` +
          "(or tls://host:4222)",
      );
    }
  }
  return servers;
}
