/**
 * Scenario (b): the reference's algorithm on Postgres (./../support/reference.ts): claim 25 with
 * the version 1 schema and claim statement, then publish and `UPDATE` one message at a time.
 * The table was seeded by the parent.
 *
 * @module
 */

import { headers as natsHeaders } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import postgres from "postgres";
import { referenceDrain } from "../support/reference.ts";
import { readConfig, report, timed } from "./child.ts";

/** Configuration of the reference scenario. */
export interface ReferenceDispatchConfig {
  natsUrl: string;
  postgresUrl: string;
  table: string;
  count: number;
}

if (import.meta.main) {
  const config = readConfig<ReferenceDispatchConfig>();
  const nc = await connect({ servers: config.natsUrl });
  const js = jetstream(nc);
  const sql = postgres(config.postgresUrl, { max: 1, onnotice: () => {} });
  let dispatched = 0;
  const { seconds, cpuSeconds, mainThreadCpuSeconds } = await timed(async () => {
    dispatched = await referenceDrain(sql, config.table, async (row) => {
      const h = natsHeaders();
      for (const [name, value] of Object.entries(row.headers ?? {})) h.set(name, value);
      await js.publish(row.subject, row.payload, { msgID: row.id, headers: h });
    });
  });
  await sql.end();
  await nc.close();
  if (dispatched !== config.count) throw new Error(`dispatched ${dispatched} of ${config.count}`);
  report({ messages: dispatched, seconds, cpuSeconds, mainThreadCpuSeconds });
}
