/**
 * NATS and Postgres for the throughput script: the servers named by OUTBOX_TEST_NATS_URL /
 * OUTBOX_TEST_POSTGRES_URL, else private ones started through the test kit. Unlike the kit's
 * test cluster (fsync and synchronous_commit off), a private Postgres started here keeps the
 * default durable settings: commit latency is part of what the throughput script measures.
 *
 * @module
 */

import { NatsServer, PostgresServer, resolveNats, resolvePostgres } from "../../tests/kit/mod.ts";
import type { Service } from "../../tests/kit/services.ts";
import { natsServerBinary } from "../../tests/kit/nats_server.ts";
import { postgresBinDir } from "../../tests/kit/postgres_server.ts";

/** The servers a run uses, with a line saying where each came from. */
export interface BenchServers extends AsyncDisposable {
  natsUrl: string;
  postgresUrl: string;
  description: string;
}

/** Resolves both servers (see the module doc). */
export async function benchServers(): Promise<BenchServers> {
  const stops: Array<() => Promise<void>> = [];
  const described: string[] = [];
  let natsUrl = Deno.env.get("OUTBOX_TEST_NATS_URL");
  if (natsUrl) described.push(`NATS from OUTBOX_TEST_NATS_URL`);
  else if (natsServerBinary()) {
    const server = await NatsServer.start();
    stops.push(() => server.stop());
    natsUrl = server.url;
    described.push("a private nats-server (JetStream file store) started by the kit");
  } else {
    const service: Service = await resolveNats();
    stops.push(() => service.stop());
    natsUrl = service.url;
    described.push(`NATS from the kit (${service.source})`);
  }
  let postgresUrl = Deno.env.get("OUTBOX_TEST_POSTGRES_URL");
  if (postgresUrl) described.push("Postgres from OUTBOX_TEST_POSTGRES_URL");
  else if (postgresBinDir()) {
    const server = await PostgresServer.start({ fast: false });
    stops.push(() => server.stop());
    postgresUrl = server.url;
    described.push("a private Postgres cluster with default (durable) settings started by the kit");
  } else {
    const service = await resolvePostgres();
    stops.push(() => service.stop());
    postgresUrl = service.url;
    described.push(`Postgres from the kit (${service.source})`);
  }
  return {
    natsUrl,
    postgresUrl,
    description: described.join("; "),
    async [Symbol.asyncDispose]() {
      for (const stop of stops.reverse()) await stop().catch(() => {});
    },
  };
}
