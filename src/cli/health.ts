/**
 * The relay's HTTP health endpoint (node:http): `GET /livez` answers 200 while the process
 * serves (liveness: restarting would not help a broker outage); `GET /readyz` (and any other
 * path) answers with a JSON report, status 200 when the relay is ready or degraded and 503 when
 * it is not (circuit breaker open, JetStream disabled, store failing, shutting down).
 *
 * @module
 */

import { createServer, type Server } from "node:http";
import { CliError, describeError } from "./errors.ts";

/** What the endpoint serves: readiness and a JSON-serialisable body. */
export interface HealthAnswer {
  /** 200 when true, 503 when false. */
  ready: boolean;
  /** The JSON body. */
  body: unknown;
}

/** A listening health server. */
export interface HealthServer {
  /** The port it listens on (useful with port 0). */
  readonly port: number;
  /** The address it listens on. */
  readonly host: string;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

/** The liveness path: 200 while the process serves, whatever the broker or the store do. */
export const livenessPath = "/livez";

/**
 * Listens on `host:port`: `GET /livez` answers `live()`; every other GET / HEAD answers
 * `report()`; other methods get 405. A failing `report()` answers 503 with the error.
 */
export async function startHealthServer(
  host: string,
  port: number,
  report: () => Promise<HealthAnswer>,
  live: () => HealthAnswer = () => ({ ready: true, body: { status: "alive" } }),
): Promise<HealthServer> {
  const server: Server = createServer((request, response) => {
    if (request.method !== "GET" && request.method !== "HEAD") {
      response.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" });
      response.end("method not allowed\n");
      return;
    }
    const path = (request.url ?? "/").split("?")[0];
    const answering = path === livenessPath ? Promise.resolve().then(live) : report();
    answering.then(
      (answer) => answer,
      (error): HealthAnswer => ({
        ready: false,
        body: { status: "error", ready: false, error: describeError(error) },
      }),
    ).then((answer) => {
      const text = JSON.stringify(answer.body, null, 2) + "\n";
      response.writeHead(answer.ready ? 200 : 503, {
        "content-type": "application/json",
        "cache-control": "no-store",
      });
      response.end(request.method === "HEAD" ? undefined : text);
    });
  });
  await new Promise<void>((resolve, reject) => {
    const onError = (error: Error) => {
      reject(
        new CliError(
          `cannot serve --health on ${host}:${port}: ${describeError(error)}`,
          { cause: error },
        ),
      );
    };
    server.once("error", onError);
    server.listen(port, host, () => {
      server.off("error", onError);
      resolve();
    });
  });
  const address = server.address();
  const actualPort = typeof address === "object" && address !== null ? address.port : port;
  return {
    port: actualPort,
    host,
    close() {
      return new Promise<void>((resolve) => {
        server.close(() => resolve());
        (server as { closeAllConnections?: () => void }).closeAllConnections?.();
      });
    },
  };
}
