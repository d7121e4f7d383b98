/**
 * A private 3-node NATS JetStream cluster from the local nats-server binary: each node is a
 * {@linkcode NatsServer} with its own temp dir and JetStream store, client and route ports on
 * loopback below the ephemeral range (so a killed node's ports are still free for its restart),
 * routes to the other nodes. Fault scenarios find a stream's leader, kill -9 / SIGSTOP / restart
 * one node, and wait for a new leader.
 *
 * @module
 */

import { jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats } from "./nats.ts";
import { NatsServer } from "./nats_server.ts";
import { freePort } from "./ports.ts";
import { sleep } from "./process.ts";

/** Options for {@linkcode NatsCluster.start}. */
export interface NatsClusterOptions {
  /** Number of nodes. @default {3} */
  size?: number;
  /** Extra configuration lines for every node. */
  config?: string[];
  /** How long to wait until JetStream can place a stream with a replica on every node. @default {60000} */
  readyTimeoutMs?: number;
}

/**
 * One node of a {@linkcode NatsCluster}. Each node carries the server tag `node:<name>`, so a
 * stream can be placed on it: `placement: { tags: ["node:n1"] }`.
 */
export interface NatsClusterNode {
  /** `server_name`, as stream info reports leaders and replicas (`n1`, `n2`, ...). */
  name: string;
  /** The node's server (kill, pause, resume, restart keep its ports and store). */
  server: NatsServer;
  /** Its cluster (route) port. */
  routePort: number;
}

/** A running private cluster. */
export class NatsCluster implements AsyncDisposable {
  /** The nodes, in start order. */
  readonly nodes: readonly NatsClusterNode[];
  /** The cluster name. */
  readonly name: string;

  private constructor(name: string, nodes: NatsClusterNode[]) {
    this.name = name;
    this.nodes = nodes;
  }

  /** Client URLs of all nodes, comma-separated (a nats.js `servers` list after `split(",")`). */
  get url(): string {
    return this.urls.join(",");
  }

  /** Client URLs of all nodes. */
  get urls(): string[] {
    return this.nodes.map((node) => node.server.url);
  }

  /** Starts the nodes and waits until JetStream answers (the meta group has a leader). */
  static async start(options: NatsClusterOptions = {}): Promise<NatsCluster> {
    const size = options.size ?? 3;
    const name = `outbox-${crypto.randomUUID().slice(0, 8)}`;
    const ports = new Set<number>();
    const pick = () => {
      let port = freePort();
      while (ports.has(port)) port = freePort();
      ports.add(port);
      return port;
    };
    const plan = Array.from({ length: size }, (_, i) => ({
      name: `n${i + 1}`,
      clientPort: pick(),
      routePort: pick(),
    }));
    const nodes: NatsClusterNode[] = [];
    try {
      await Promise.all(plan.map((node) =>
        NatsServer.start({
          port: node.clientPort,
          config: [
            `server_name: ${node.name}`,
            `server_tags: ["node:${node.name}"]`,
            `cluster {`,
            `  name: ${name}`,
            `  listen: "127.0.0.1:${node.routePort}"`,
            `  routes: [${
              plan.filter((other) => other !== node)
                .map((other) => `"nats-route://127.0.0.1:${other.routePort}"`).join(", ")
            }]`,
            `}`,
            ...(options.config ?? []),
          ],
        }).then((server) => {
          nodes.push({ name: node.name, server, routePort: node.routePort });
        })
      ));
      nodes.sort((a, b) => a.name.localeCompare(b.name));
      const cluster = new NatsCluster(name, nodes);
      await cluster.waitForJetStream(options.readyTimeoutMs ?? 60_000);
      return cluster;
    } catch (error) {
      await Promise.all(nodes.map((node) => node.server.stop()));
      throw error;
    }
  }

  /** The node called `name` (`n1`...). */
  node(name: string): NatsClusterNode {
    const node = this.nodes.find((n) => n.name === name);
    if (!node) throw new Error(`no node ${name} in cluster ${this.name}`);
    return node;
  }

  /**
   * Waits until JetStream's account info answers through every running node and the cluster can
   * place a stream with a replica on every node.
   */
  async waitForJetStream(timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let lastError: unknown;
    for (const node of this.nodes) {
      const nc = await connectNats(node.server.url);
      try {
        while (true) {
          try {
            await (await jetstreamManager(nc, { timeout: 2_000 })).getAccountInfo();
            break;
          } catch (error) {
            lastError = error;
            if (Date.now() > deadline) {
              throw new Error(`JetStream cluster not ready in ${timeoutMs} ms: ${lastError}`);
            }
            await sleep(100);
          }
        }
      } finally {
        await nc.close();
      }
    }
    await this.#waitForPlacement(deadline, timeoutMs);
  }

  /**
   * Account info can answer before the meta group is ready to place an asset on every node (a
   * fresh cluster then answers "JetStream system temporarily unavailable" to the first stream
   * create): create a probe stream with one replica per node until it has a leader, then delete it.
   */
  async #waitForPlacement(deadline: number, timeoutMs: number): Promise<void> {
    const nc = await connectNats(this.urls.join(","));
    const probe = `OUTBOX_KIT_PROBE_${crypto.randomUUID().slice(0, 8)}`;
    let lastError: unknown = "no answer yet";
    try {
      while (Date.now() <= deadline) {
        try {
          const jsm = await jetstreamManager(nc, { timeout: 2_000 });
          const info = await jsm.streams.add({
            name: probe,
            subjects: [`${probe}.>`],
            num_replicas: this.nodes.length,
          }).catch(() => jsm.streams.info(probe));
          if (info.cluster?.leader) {
            await jsm.streams.delete(probe);
            return;
          }
          lastError = "probe stream has no leader yet";
        } catch (error) {
          lastError = error;
        }
        await sleep(100);
      }
      throw new Error(`JetStream cluster cannot place a stream in ${timeoutMs} ms: ${lastError}`);
    } finally {
      await nc.close();
    }
  }

  /** The node leading `stream` now (as the stream's info reports), or `undefined` if none. */
  async leaderOf(nc: NatsConnection, stream: string): Promise<NatsClusterNode | undefined> {
    const jsm = await jetstreamManager(nc, { timeout: 2_000 });
    const info = await jsm.streams.info(stream);
    const leader = info.cluster?.leader;
    return leader ? this.nodes.find((node) => node.name === leader) : undefined;
  }

  /**
   * Waits until `stream` has a leader that is not `notOn` (a node name), then returns it and how
   * long that took. Followers may still be catching up: {@linkcode waitForReplicas} waits for them.
   */
  async waitForLeader(
    nc: NatsConnection,
    stream: string,
    { notOn, timeoutMs = 30_000 }: { notOn?: string; timeoutMs?: number } = {},
  ): Promise<{ node: NatsClusterNode; waitedMs: number }> {
    const started = performance.now();
    const deadline = Date.now() + timeoutMs;
    let last: unknown = "no answer yet";
    while (Date.now() < deadline) {
      try {
        const node = await this.leaderOf(nc, stream);
        if (node && node.name !== notOn) {
          return { node, waitedMs: Math.round(performance.now() - started) };
        }
        last = `leader ${node?.name ?? "none"}`;
      } catch (error) {
        last = error;
      }
      await sleep(100);
    }
    throw new Error(`stream ${stream}: no new leader in ${timeoutMs} ms (${last})`);
  }

  /**
   * Waits until `stream` has a leader and every other node is a current replica of it (a node
   * restarted after kill -9 rejoins the stream's group and catches up some time after it answers
   * clients). Freezing or killing the leader before that leaves a group whose only healthy
   * follower may not be enough to elect a new leader quickly.
   */
  async waitForReplicas(
    nc: NatsConnection,
    stream: string,
    { timeoutMs = 30_000 }: { timeoutMs?: number } = {},
  ): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last: unknown = "no answer yet";
    while (Date.now() < deadline) {
      try {
        const jsm = await jetstreamManager(nc, { timeout: 2_000 });
        const cluster = (await jsm.streams.info(stream)).cluster;
        const replicas = cluster?.replicas ?? [];
        if (
          cluster?.leader && replicas.length === this.nodes.length - 1 &&
          replicas.every((replica) => replica.current)
        ) return;
        last = `leader ${cluster?.leader ?? "none"}, replicas ${
          replicas.map((replica) => `${replica.name}${replica.current ? "" : " (behind)"}`).join(
            ", ",
          ) || "none"
        }`;
      } catch (error) {
        last = error;
      }
      await sleep(100);
    }
    throw new Error(`stream ${stream}: replicas not all current in ${timeoutMs} ms (${last})`);
  }

  /** Kills `node` with SIGKILL (ports stay reserved below the ephemeral range). */
  async kill(node: NatsClusterNode): Promise<void> {
    await node.server.kill("SIGKILL");
  }

  /** Freezes `node` (SIGSTOP): its connections stay open, nothing answers. */
  pause(node: NatsClusterNode): void {
    node.server.pause();
  }

  /** Resumes a paused node (SIGCONT). */
  resume(node: NatsClusterNode): void {
    node.server.resume();
  }

  /** Starts a killed node again on the same ports and store. */
  async restart(node: NatsClusterNode): Promise<void> {
    await node.server.restart();
  }

  /** Stops every node and removes their temp dirs. */
  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((node) => node.server.stop()));
  }

  /** Synchronous best-effort stop, for `unload` handlers. */
  stopSync(): void {
    for (const node of this.nodes) node.server.stopSync();
  }

  /** Stops the cluster. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}
