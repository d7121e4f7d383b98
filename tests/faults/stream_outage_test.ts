/**
 * Scenario: one stream loses its servers while another stream keeps working (issue #20's
 * two-nodes-down case, dispatcher side). A private 3-node cluster; stream STUCK is R1 on node 2,
 * stream FLOWING is R1 on node 0 (where the client is connected). Nodes 1 and 2 are killed: a
 * publish to STUCK answers "no responders" at once. FLOWING must keep flowing, nothing of STUCK
 * may go dead, and STUCK's messages must be delivered within seconds of its node's return
 * (its backoff does not keep growing during the outage). Zero lost, zero duplicated.
 *
 * (Issue #20's own test kit for clusters belongs to the scale-out work; this file starts the
 * three servers with the single-server kit and a `cluster {}` block.)
 */

import assert from "node:assert/strict";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { createJetStreamRuntime, MemoryOutboxRepository, OutboxDispatcher } from "../../mod.ts";
import { eventually, freePort, NatsServer, sleep, uniqueName } from "../kit/mod.ts";
import { events, signal, streamIds } from "../helpers/dispatch.ts";

/** How long the two nodes stay down. The scenario, not a wait for a condition. */
const outageMs = 5_000;

async function startCluster(): Promise<{ name: string; nodes: NatsServer[] }> {
  const routePorts = [freePort(), freePort(), freePort()];
  const routes = routePorts.map((port) => `"nats-route://127.0.0.1:${port}"`).join(", ");
  const name = uniqueName("cluster");
  const nodes: NatsServer[] = [];
  try {
    for (let index = 0; index < 3; index++) {
      nodes.push(
        await NatsServer.start({
          config: [
            `server_name: ${name}_n${index}`,
            `server_tags: ["node:n${index}"]`,
            `cluster { name: ${name}, listen: "127.0.0.1:${
              routePorts[index]
            }", routes: [${routes}] }`,
          ],
        }),
      );
    }
  } catch (error) {
    for (const node of nodes) await node.stop();
    throw error;
  }
  return { name, nodes };
}

Deno.test("stream outage: two of three nodes down; the R1 stream on the survivor flows, the stuck stream waits (nothing dead) and is delivered within seconds of its return", async () => {
  const { name: cluster, nodes } = await startCluster();
  try {
    const nc = await connect({ servers: nodes[0].url });
    try {
      const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: 2_000 });
      await eventually(() => jsm.getAccountInfo(), { timeoutMs: 30_000, intervalMs: 200 });
      const stuck = { name: uniqueName("STUCK"), prefix: uniqueName("stuck") };
      const flowing = { name: uniqueName("FLOWING"), prefix: uniqueName("flowing") };
      for (const [stream, node] of [[stuck, "n2"], [flowing, "n0"]] as const) {
        await eventually(() =>
          jsm.streams.add({
            name: stream.name,
            subjects: [`${stream.prefix}.>`],
            num_replicas: 1,
            placement: { cluster, tags: [`node:${node}`] },
          }), { timeoutMs: 20_000, intervalMs: 200 });
      }

      await nodes[1].kill();
      await nodes[2].kill();
      const outageStarted = Date.now();

      const outbox = new MemoryOutboxRepository();
      const stuckRecords = events(stuck.prefix, 100);
      const flowingRecords = events(flowing.prefix, 100);
      await outbox.enqueueMany(stuckRecords); // the oldest: the head of the line
      await outbox.enqueueMany(flowingRecords);
      const dead: string[] = [];
      // Counted from the PubAcks: the JetStream API itself does not answer during the outage.
      const acked = new Map<string, number>();
      const flowingDone = signal();
      const stuckDone = signal();
      const scopePaused = signal<string>();
      const scopeResumed = signal<number>();
      const dispatcher = new OutboxDispatcher(
        outbox,
        createJetStreamRuntime(jetstream(nc, { timeout: 2_000 }), { timeoutMs: 2_000 }),
        {
          limit: 50,
          leaseMs: 10_000,
          probeIntervalMs: 100,
          probeMaxIntervalMs: 1_000,
          idleRetryMs: 500,
          retry: { maxAttempts: 2 },
          onError: () => {},
          onDead: (message, info) => dead.push(`${message.id}: ${info.lastError}`),
          onDispatched: (_message, info) => {
            const stream = info.receipt?.stream ?? "?";
            const count = (acked.get(stream) ?? 0) + 1;
            acked.set(stream, count);
            if (count === 100) (stream === flowing.name ? flowingDone : stuckDone).resolve();
          },
          onScopePaused: (info) => scopePaused.resolve(`${info.scope.kind} ${info.error.code}`),
          onScopeResumed: (info) => scopeResumed.resolve(info.pausedMs),
        },
      );
      try {
        console.log(`  scope paused: ${await scopePaused.promise}`);
        await flowingDone.promise;
        const flowedMs = Date.now() - outageStarted;
        assert.equal(dispatcher.state, "closed", "the broker-wide breaker stayed closed");
        const remaining = outageMs - (Date.now() - outageStarted);
        if (remaining > 0) await sleep(remaining);
        assert.deepEqual(dead, [], "nothing of the stuck stream went dead during the outage");
        const attemptsDuringOutage = Math.max(
          ...(await Promise.all(
            stuckRecords.map(async (r) => (await outbox.get(r.id))?.attempts ?? 0),
          )),
        );

        await nodes[2].restart();
        await nodes[1].restart();
        const returnedAt = Date.now();
        // When the stream itself answers again (stream info with a leader), for comparison.
        const answering = eventually(async () => {
          const info = await jsm.streams.info(stuck.name);
          assert.ok(info.cluster?.leader, "no leader yet");
          return Date.now() - returnedAt;
        }, { timeoutMs: 30_000, intervalMs: 50 });
        await stuckDone.promise;
        const recoveredMs = Date.now() - returnedAt;
        const answeredMs = await answering;
        await scopeResumed.promise;
        await eventually(() => jsm.getAccountInfo(), { timeoutMs: 30_000, intervalMs: 200 });
        assert.deepEqual(dead, []);
        const stuckIds = await streamIds(nc, stuck.name);
        assert.equal(new Set(stuckIds).size, 100, "no duplicate in the stuck stream");
        assert.deepEqual(
          new Set(stuckIds),
          new Set(stuckRecords.map((record) => record.id)),
          "nothing lost",
        );
        const flowingIds = await streamIds(nc, flowing.name);
        assert.equal(new Set(flowingIds).size, 100, "no duplicate in the flowing stream");
        console.log(
          `  flowing stream done ${flowedMs} ms into the outage; stuck stream delivered ` +
            `${recoveredMs} ms after its nodes' return (the stream answered stream info after ` +
            `${answeredMs} ms); at most ` +
            `${attemptsDuringOutage} attempts per stuck message during the ${outageMs} ms outage`,
        );
        assert.ok(recoveredMs < 10_000, `stuck stream delivered ${recoveredMs} ms after return`);
      } finally {
        await dispatcher.stop();
      }
    } finally {
      await nc.close();
    }
  } finally {
    for (const node of nodes) await node.stop();
  }
});
