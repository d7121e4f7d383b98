/**
 * The reference's outbox algorithm, re-created for comparison only (never part of the library):
 * its version 1 Postgres schema, its claim statement (`state != 'dispatched' ... ORDER BY
 * created_at LIMIT 25 FOR UPDATE SKIP LOCKED`), and its dispatch loop, which publishes one
 * message and then runs one `UPDATE` for it before the next (see /work/shared/seed/NOTES.md,
 * "Dispatcher" and defects 1 and 2, and `dispatchOutbox` / `SqlOutboxRepository` in the seed).
 *
 * @module
 */

import type postgres from "postgres";

/** The reference's version 1 DDL for Postgres (the same text as `schemaV1` in src/stores/sql/schema.ts). */
export function referenceSchema(outbox: string, inbox: string): string[] {
  return [
    `CREATE TABLE IF NOT EXISTS ${outbox} (id text PRIMARY KEY, kind text NOT NULL, name text NOT NULL, subject text NOT NULL, payload text NOT NULL, headers jsonb NOT NULL, state text NOT NULL, attempts integer NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, next_attempt_at timestamptz, last_error text, outcome jsonb)`,
    `CREATE INDEX IF NOT EXISTS ${outbox}_due_idx ON ${outbox} (state, next_attempt_at)`,
    `CREATE TABLE IF NOT EXISTS ${inbox} (message_id text PRIMARY KEY, received_at timestamptz NOT NULL)`,
  ];
}

/** The reference's claim: 30 s lease, `RETURNING *`. */
export function referenceClaimSql(outbox: string): string {
  return `UPDATE ${outbox} SET state = $1, attempts = attempts + 1, updated_at = $2, next_attempt_at = $3 WHERE id IN (
        SELECT id FROM ${outbox} WHERE state != $4
        AND (next_attempt_at IS NULL OR next_attempt_at <= $5)
        ORDER BY created_at LIMIT $6 FOR UPDATE SKIP LOCKED
      ) RETURNING *`;
}

/** The reference's `markDispatched`, fenced by state and attempts only. */
export function referenceMarkDispatchedSql(outbox: string): string {
  return `UPDATE ${outbox} SET state = $1, updated_at = $2, next_attempt_at = NULL, last_error = NULL, outcome = $3 WHERE id = $4 AND state = 'claimed' AND attempts = $5 RETURNING id`;
}

/** A message as the reference's loop needs it. */
export interface ReferenceRow {
  id: string;
  subject: string;
  payload: string;
  headers: Record<string, string>;
  attempts: number;
}

/** Publishes one message and resolves once JetStream acknowledged it. */
export type ReferencePublish = (row: ReferenceRow) => Promise<void>;

/**
 * The reference's drain: claim 25, then for each message publish and await the PubAck, then one
 * `UPDATE` marking it dispatched; repeat until a claim returns nothing. Returns how many
 * messages were marked dispatched.
 */
export async function referenceDrain(
  sql: postgres.Sql,
  outbox: string,
  publish: ReferencePublish,
  limit = 25,
): Promise<number> {
  const claim = referenceClaimSql(outbox);
  const mark = referenceMarkDispatchedSql(outbox);
  let dispatched = 0;
  while (true) {
    const now = new Date();
    const rows = await sql.unsafe(claim, [
      "claimed",
      now.toISOString(),
      new Date(now.getTime() + 30_000).toISOString(),
      "dispatched",
      now.toISOString(),
      limit,
    ], { prepare: true });
    if (rows.length === 0) return dispatched;
    for (const row of rows) {
      const message = row as unknown as ReferenceRow;
      await publish(message);
      const marked = await sql.unsafe(mark, [
        "dispatched",
        now.toISOString(),
        null,
        message.id,
        message.attempts,
      ], { prepare: true });
      if (marked.length === 1) dispatched += 1;
    }
  }
}

/**
 * Inserts `rows` as pending messages with the reference's column values, in one statement
 * (seeding for the comparison; the reference itself inserted one row per statement).
 */
export async function referenceSeed(
  sql: postgres.Sql,
  outbox: string,
  rows: ReadonlyArray<{ id: string; name: string; subject: string; payload: string }>,
): Promise<void> {
  const start = Date.now();
  await sql.unsafe(
    `INSERT INTO ${outbox} (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome)
     SELECT r.id, 'event.publish', r.name, r.subject, r.payload, '{}'::jsonb, 'pending', 0, r.created_at, r.created_at, NULL, NULL, NULL
     FROM json_to_recordset($1::text::json) AS r(id text, name text, subject text, payload text, created_at timestamptz)`,
    [JSON.stringify(
      rows.map((row, i) => ({ ...row, created_at: new Date(start + i).toISOString() })),
    )],
  );
}
