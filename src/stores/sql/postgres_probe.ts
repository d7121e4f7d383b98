/**
 * A first-contact check for a Postgres URL: does something at that host and port speak the
 * Postgres protocol? Drivers wait forever on a server that answers in another protocol (a URL
 * pointing at NATS's 4222, say); this check answers within a timeout, in one line.
 *
 * @module
 */

import { connect } from "node:net";

/**
 * The server at a Postgres URL could not be reached or does not speak Postgres.
 *
 * @example
 * ```ts
 * import { PostgresServerError } from "@outbox/nats";
 * const error = new PostgresServerError("127.0.0.1", 4222, "it answered 'INFO {...'");
 * console.log(error.message); // 127.0.0.1:4222 is not a Postgres server? it answered 'INFO {...'
 * ```
 */
export class PostgresServerError extends Error {
  /** The host the URL names. */
  readonly host: string;
  /** The port the URL names (5432 when it names none). */
  readonly port: number;
  /** Creates the error: `<host>:<port> is not a Postgres server? <detail>` (or the reason). */
  constructor(host: string, port: number, detail: string, options: ErrorOptions = {}) {
    const where = `${host.includes(":") ? `[${host}]` : host}:${port}`;
    super(
      detail.startsWith("cannot connect")
        ? `${detail.replace("cannot connect", `cannot connect to ${where}`)}`
        : `${where} is not a Postgres server? ${detail}`,
      options,
    );
    this.name = "PostgresServerError";
    this.host = host;
    this.port = port;
  }
}

/**
 * Options for {@linkcode checkPostgresServer}.
 *
 * @example
 * ```ts
 * import type { CheckPostgresServerOptions } from "@outbox/nats";
 * const options: CheckPostgresServerOptions = { timeoutMs: 5_000 };
 * ```
 */
export interface CheckPostgresServerOptions {
  /**
   * How long to wait for the TCP connection and the server's answer, in milliseconds.
   *
   * @default {10000}
   */
  timeoutMs?: number;
}

/** The single host and port of a Postgres URL, or `undefined` (socket path, several hosts). */
export function postgresHostPort(url: string): { host: string; port: number } | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  if (parsed.searchParams.has("host") || parsed.hostname === "") return undefined;
  const host = parsed.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = parsed.port === "" ? 5432 : Number(parsed.port);
  if (!Number.isSafeInteger(port) || port < 1 || port > 65535) return undefined;
  return { host: decodeURIComponent(host), port };
}

/**
 * Checks that the server a Postgres URL names speaks Postgres, before a driver connects to it:
 * it opens a TCP connection, sends the protocol's 8-byte SSL request and expects Postgres' (or
 * PgBouncer's) one-byte answer. Resolves when it came (and, for a URL with `sslmode=require`,
 * `verify-ca` or `verify-full`, said TLS is available); rejects with a one-line
 * {@linkcode PostgresServerError} naming host and port when the connection is refused, the
 * server says something else first (NATS greets with `INFO`), closes the connection, or stays
 * silent for `timeoutMs`. Sends no credentials. URLs it cannot check (a Unix socket `?host=`,
 * several hosts) resolve at once.
 *
 * @example
 * ```ts ignore
 * import postgres from "postgres";
 * import { checkPostgresServer, postgresJsExecutor } from "@outbox/nats";
 *
 * const url = "postgres://postgres@127.0.0.1:5432/app";
 * await checkPostgresServer(url); // throws at once for a URL pointing at, say, NATS's port
 * const executor = postgresJsExecutor(postgres(url, { connect_timeout: 10 }));
 * ```
 */
export function checkPostgresServer(
  url: string,
  options: CheckPostgresServerOptions = {},
): Promise<void> {
  const target = postgresHostPort(url);
  if (!target) return Promise.resolve();
  const timeoutMs = options.timeoutMs ?? 10_000;
  const { host, port } = target;
  const tlsRequired = requiredSslMode(url);
  return new Promise<void>((resolve, reject) => {
    const socket = connect({ host, port });
    let settled = false;
    const finish = (error?: PostgresServerError) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.removeAllListeners();
      socket.on("error", () => {});
      socket.destroy();
      if (error) reject(error);
      else resolve();
    };
    const timer = setTimeout(() => {
      finish(
        new PostgresServerError(
          host,
          port,
          `no Postgres answer within ${timeoutMs} ms`,
        ),
      );
    }, timeoutMs);
    socket.on("connect", () => {
      // SSLRequest: length 8, code 80877103. Postgres and PgBouncer answer 'S' or 'N'.
      socket.write(new Uint8Array([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]));
    });
    socket.on("data", (chunk: Uint8Array) => {
      const first = chunk[0];
      if (first === 0x4e && tlsRequired) {
        // 'N': Postgres, without TLS; the driver would fail with a bare socket error.
        return finish(
          new PostgresServerError(
            host,
            port,
            `cannot connect: the server does not accept TLS, but the URL asks for sslmode=${tlsRequired}`,
          ),
        );
      }
      // 'S' / 'N': an SSL answer; 'E': an error response (a server refusing the request).
      if (first === 0x53 || first === 0x4e || first === 0x45) return finish();
      finish(new PostgresServerError(host, port, `it answered ${describeAnswer(chunk)}`));
    });
    socket.on("end", () => {
      finish(new PostgresServerError(host, port, "it closed the connection without answering"));
    });
    socket.on("error", (error: Error & { code?: string }) => {
      finish(
        new PostgresServerError(
          host,
          port,
          `cannot connect: ${error.code ?? error.message}`,
          { cause: error },
        ),
      );
    });
  });
}

/** The URL's `sslmode` (or `ssl`) when it insists on TLS: `require`, `verify-ca`, `verify-full`. */
function requiredSslMode(url: string): string | undefined {
  try {
    const query = new URL(url).searchParams;
    const mode = query.get("sslmode") ?? query.get("ssl") ?? undefined;
    return mode === "require" || mode === "verify-ca" || mode === "verify-full" ? mode : undefined;
  } catch {
    return undefined;
  }
}

function describeAnswer(chunk: Uint8Array): string {
  const text = new TextDecoder().decode(chunk.subarray(0, 40)).replace(/[^\x20-\x7e]/g, ".");
  const nats = text.startsWith("INFO ") ? " (NATS)" : "";
  return `'${text.length < chunk.length ? `${text}...` : text}'${nats}`;
}
