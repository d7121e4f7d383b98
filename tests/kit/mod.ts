/**
 * The test kit: real NATS JetStream and Postgres for every test, on any machine.
 *
 * - `natsUrl()` / `postgresUrl()`: the shared servers (env URL, else private local, else Docker).
 * - `NatsServer` / `PostgresServer`: private instances for fault tests (kill -9, pause,
 *   restart on the same port and store); `NatsCluster`: a private 3-node JetStream cluster with
 *   stream-leader helpers.
 * - `createTestDatabase()`, `createTestStream()`, `uniqueName()`: isolation per test.
 *
 * @module
 */

export { KitError, natsUrl, postgresUrl, resolveNats, resolvePostgres } from "./services.ts";
export { NatsServer, type NatsServerOptions } from "./nats_server.ts";
export { NatsCluster, type NatsClusterNode, type NatsClusterOptions } from "./nats_cluster.ts";
export { PostgresServer, type PostgresServerOptions } from "./postgres_server.ts";
export { createTestDatabase, type TestDatabase, withDatabase } from "./databases.ts";
export { connectNats, createTestStream, type TestStream } from "./nats.ts";
export { uniqueName } from "./names.ts";
export { freePort, isPortFree } from "./ports.ts";
export { sleep } from "./process.ts";
export { eventually } from "./eventually.ts";
