/**
 * Clean-up for `Deno.bench` files. A bench module has no teardown hook and its event loop does
 * not run again after the last bench, so resources are registered here and removed at `unload`
 * by a short synchronous subprocess (this file run as a script), which may use async clients.
 * Bench databases also have names that let the next run sweep what a killed run left behind
 * (see `sweepStaleDatabases` in ./postgres.ts).
 *
 * @module
 */

import { Kvm } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import postgres from "postgres";

/** Something a bench created that must not outlive it. */
export type BenchResource =
  | { kind: "postgres-database"; serverUrl: string; name: string }
  | { kind: "kv-bucket"; natsUrl: string; name: string }
  | { kind: "stream"; natsUrl: string; name: string }
  | { kind: "dir"; path: string };

const registered: BenchResource[] = [];
let hooked = false;

/**
 * Removes `resource` when this process unloads (normal end of `deno bench`). Resources on a
 * server this process started itself (the kit starts private servers when
 * OUTBOX_TEST_NATS_URL / OUTBOX_TEST_POSTGRES_URL are unset) are skipped: the kit stops that
 * server and deletes its data first.
 */
export function cleanUpAtExit(resource: BenchResource): void {
  if (resource.kind === "postgres-database" && !Deno.env.get("OUTBOX_TEST_POSTGRES_URL")) return;
  if (resource.kind !== "dir" && resource.kind !== "postgres-database") {
    if (!Deno.env.get("OUTBOX_TEST_NATS_URL")) return;
  }
  registered.push(resource);
  if (hooked) return;
  hooked = true;
  globalThis.addEventListener("unload", () => {
    const dirs = registered.filter((r) => r.kind === "dir");
    for (const dir of dirs) {
      try {
        Deno.removeSync(dir.path, { recursive: true });
      } catch {
        // already gone
      }
    }
    const remote = registered.filter((r) => r.kind !== "dir");
    if (remote.length === 0) return;
    const result = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL(import.meta.url).pathname, JSON.stringify(remote)],
      stdout: "inherit",
      stderr: "inherit",
    }).outputSync();
    if (!result.success) console.error("bench clean-up failed; resources:", remote);
  });
}

/** Removes the given resources now. */
export async function cleanUp(resources: readonly BenchResource[]): Promise<void> {
  for (const resource of resources) {
    switch (resource.kind) {
      case "dir":
        await Deno.remove(resource.path, { recursive: true }).catch(() => {});
        break;
      case "postgres-database": {
        const sql = postgres(resource.serverUrl, { max: 1, onnotice: () => {} });
        try {
          await sql.unsafe(`DROP DATABASE IF EXISTS ${resource.name} WITH (FORCE)`);
        } finally {
          await sql.end();
        }
        break;
      }
      case "kv-bucket":
      case "stream": {
        const nc = await connect({ servers: resource.natsUrl });
        try {
          if (resource.kind === "kv-bucket") {
            const kv = await new Kvm(nc).open(resource.name);
            await kv.destroy();
          } else {
            const jsm = await jetstreamManager(nc);
            await jsm.streams.delete(resource.name).catch(() => {});
          }
        } finally {
          await nc.close();
        }
        break;
      }
    }
  }
}

if (import.meta.main) {
  await cleanUp(JSON.parse(Deno.args[0]) as BenchResource[]);
}
