/**
 * The relay's HTTP health endpoint (node:http): GET on any path answers with a JSON report,
 * status 200 when the relay is ready and 503 when it is not (circuit breaker open, store
 * failing, shutting down), for orchestrators' readiness and liveness probes.
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

/**
 * Listens on `host:port` and answers every GET / HEAD with `report()`; other methods get 405.
 * A failing `report()` answers 503 with the error.
 */
export async function startHealthServer(
  host: string,
  port: number,
  report: () => Promise<HealthAnswer>,
): Promise<HealthServer> {
  const server: Server = createServer((request, response) => {
    if (request.method !== "GET" && request.method !== "HEAD") {
      response.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" });
      response.end("method not allowed\n");
      return;
    }
    report().then(
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
