/**
 * Postgres server cost per relayed message, by row design (issue #17). For each variant: a fresh
 * outbox made by the library's own `migrate()` (plus the variant's DDL), N unkeyed messages with
 * a ~220-byte payload enqueued through `SqlOutboxRepository.enqueueMany`, then the relay's loop
 * with one batch in flight (claim batch k+1, then mark batch k dispatched, as a relay with
 * `maxInFlight = limit` does), on ONE connection, whose backend is measured:
 *
 * - CPU µs/msg: utime+stime of the backend (`/proc/<pg_backend_pid()>/stat`) over the loop;
 * - vacuum µs/msg: the same backend's CPU for a `VACUUM` of the tables afterwards (autovacuum is
 *   off on them, so the dead tuples each design leaves are paid for here, not in another process);
 * - WAL B/msg: `pg_waldump` of the loop's LSN range, records touching this run's private database
 *   only (other sessions' WAL is left out; commit records, which name no relation, too), and the
 *   number of full-page images among them;
 * - HOT: `n_tup_hot_upd / n_tup_upd` of the outbox table over the loop.
 *
 * Variants: `lib` (the repository itself), `base` (its claim and `markDispatchedFast` texts run
 * directly: must match `lib`), `drop:<index>` (attribution), `ff<N>` (fillfactor), `hot-claim`
 * (the claim writes only unindexed columns), `lease-table` (a narrow leases table), `tx-held`
 * (a transaction holds the claim), `delete-history` (dispatched rows move to a narrow table),
 * `hot+delete`.
 *
 * Run: `OUTBOX_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test deno run -A
 * bench/pg_row_bench.ts [--private] [--n=50000] [--limit=256] [--rounds=3] [--only=lib,base,hot*]` as a user that can read
 * the server's pg_wal (root, or the postgres user); without it WAL is taken from the global LSN
 * difference (includes other sessions).
 *
 * @module
 */

import postgres from "postgres";
import { migrate, postgresJsExecutor, SqlOutboxRepository } from "../mod.ts";
import type { OutboxRecord } from "../mod.ts";
import { outboxStatements } from "../src/stores/sql/dialects.ts";
import { resolveSqlOutboxTables } from "../src/stores/sql/tables.ts";
import { payload } from "./support/records.ts";
import { PostgresServer } from "../tests/kit/mod.ts";

const args = new Map(
  Deno.args.filter((a) => a.startsWith("--")).map((a) => {
    const [k, v = "true"] = a.slice(2).split("=");
    return [k, v] as const;
  }),
);
const n = Number(args.get("n") ?? 50_000);
const defaultLimit = Number(args.get("limit") ?? 256);
const only = args.get("only")?.split(",");
const rounds = Number(args.get("rounds") ?? 1);
const depth = Number(args.get("depth") ?? 1);
const pgBin = "/usr/lib/postgresql/15/bin";

// --private: a private cluster with the bench's settings (the kit's: fsync, synchronous_commit
// and full_page_writes off); otherwise the server of OUTBOX_TEST_POSTGRES_URL (its pg_wal is
// looked for at the Debian path).
const privateServer = args.has("private") ? await PostgresServer.start({ fast: true }) : undefined;
const serverUrl = privateServer?.urlFor("postgres") ??
  Deno.env.get("OUTBOX_TEST_POSTGRES_URL") ?? "postgres://postgres@127.0.0.1:5432/test";
const walDir = privateServer
  ? `${privateServer.dataDir}/pg_wal`
  : "/var/lib/postgresql/15/main/pg_wal";
const dbName = `outbox_bench_rowprobe_${Date.now().toString(36)}`;
const admin = postgres(serverUrl, { max: 1, onnotice: () => {} });
await admin.unsafe(`CREATE DATABASE ${dbName}`);
const url = new URL(serverUrl);
url.pathname = `/${dbName}`;
const sql = postgres(url.toString(), { max: 1, onnotice: () => {} });
const executor = postgresJsExecutor(sql);

interface Claimed {
  id: string;
  attempts: number;
  token: string;
  seq: number;
}
interface Ctx {
  o: string;
  repo: SqlOutboxRepository;
  s: ReturnType<typeof outboxStatements>;
  returning: string;
}
interface Variant {
  name: string;
  /** Claim batch size, when not `--limit`. */
  batch?: number;
  /** `plan_cache_mode` for the loop (default: Postgres's `auto`). */
  planMode?: "force_generic_plan" | "force_custom_plan";
  setup?: (c: Ctx) => string[];
  claim?: (c: Ctx, batch: number) => Promise<Claimed[]>;
  mark?: (c: Ctx, claimed: Claimed[]) => Promise<number>;
  /** claim+publish+mark in one call (transaction-held claims). */
  cycle?: (c: Ctx, batch: number) => Promise<number>;
}

function token(): string {
  return crypto.randomUUID();
}
function leaseTimes(): [string, string] {
  const now = new Date();
  return [now.toISOString(), new Date(now.getTime() + 30_000).toISOString()];
}
/** The library's claim does not return the token it wrote (`written`): it is the one passed. */
const toClaimed = (rows: Record<string, unknown>[], written?: string): Claimed[] =>
  rows.map((r) => ({
    id: r.id as string,
    attempts: Number(r.attempts),
    token: (r.claim_token ?? written) as string,
    seq: Number(r.seq),
  }));
const fenced = (claimed: Claimed[]): string => {
  const f: Record<string, [number, string]> = {};
  for (const c of claimed) f[c.id] = [c.attempts, c.token];
  return JSON.stringify(f);
};

// The library's statements run directly.
/** Runs a claim text with the library's parameters ($1 now, $2 lease, $3 limit, $4 the token). */
async function runClaim(text: string, batch: number): Promise<Claimed[]> {
  const [now, lease] = leaseTimes();
  const written = token();
  return toClaimed(await executor.query(text, [now, lease, batch, written]), written);
}
function baseClaim(c: Ctx, batch: number): Promise<Claimed[]> {
  return runClaim(c.s.claim, batch);
}
async function baseMark(c: Ctx, claimed: Claimed[]): Promise<number> {
  if (claimed.length === 0) return 0;
  const rows = await executor.query(c.s.markDispatchedFast, [
    fenced(claimed),
    new Date().toISOString(),
  ]);
  return rows.length;
}

// (c) A claim that writes only unindexed columns (attempts, claim_token, a new lease_until):
// state stays 'pending' until the mark, so the claim's update can be HOT; the claim skips rows
// whose lease has not expired.
function hotClaimSql(c: Ctx): string {
  const o = c.o;
  return `UPDATE ${o} AS t SET attempts = t.attempts + 1, lease_until = $2::timestamptz, claim_token = $4 WHERE t.id = ANY(ARRAY(WITH p AS (SELECT id, seq FROM ${o} WHERE state = 'pending' AND key_head AND (lease_until IS NULL OR lease_until <= $1::timestamptz) ORDER BY seq LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED), r AS (SELECT id, seq FROM ${o} WHERE state IN ('claimed', 'failed') AND next_attempt_at <= $1::timestamptz ORDER BY next_attempt_at LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED) SELECT c.id FROM (SELECT id, seq FROM p UNION ALL SELECT id, seq FROM r) AS c ORDER BY c.seq LIMIT $3::int))${c.returning}`;
}
function hotClaim(c: Ctx, batch: number): Promise<Claimed[]> {
  return runClaim(hotClaimSql(c), batch);
}
async function hotMark(c: Ctx, claimed: Claimed[]): Promise<number> {
  if (claimed.length === 0) return 0;
  const o = c.o;
  const rows = await executor.query(
    `UPDATE ${o} AS t SET state = 'dispatched', updated_at = $2::timestamptz, next_attempt_at = NULL, last_error = NULL, lease_until = NULL WHERE t.id = ANY(ARRAY(SELECT jsonb_object_keys($1::text::jsonb))) AND t.state || '' = 'pending' AND t.claim_token = (SELECT $1::text::jsonb) -> t.id ->> 1 AND t.attempts = ((SELECT $1::text::jsonb) -> t.id ->> 0)::int AND t.ordering_key IS NULL RETURNING t.id`,
    [fenced(claimed), new Date().toISOString()],
  );
  return rows.length;
}

// (d) A narrow leases table: the outbox row is written once (by the mark).
async function leaseClaim(c: Ctx, batch: number): Promise<Claimed[]> {
  const [now, lease] = leaseTimes();
  const o = c.o;
  const rows = await executor.query(
    `WITH p AS (SELECT id, seq FROM ${o} AS x WHERE state = 'pending' AND key_head AND NOT EXISTS (SELECT 1 FROM ${o}_leases AS l WHERE l.seq = x.seq AND l.lease_until > $1::timestamptz) ORDER BY seq LIMIT $3::int FOR NO KEY UPDATE SKIP LOCKED), ins AS (INSERT INTO ${o}_leases AS l (seq, token, attempts, lease_until) SELECT seq, $4, 1, $2::timestamptz FROM p ON CONFLICT (seq) DO UPDATE SET token = excluded.token, attempts = l.attempts + 1, lease_until = excluded.lease_until RETURNING seq, attempts, token) SELECT t.seq, t.id, t.kind, t.name, t.subject, t.payload, t.headers::text AS headers, t.state, ins.attempts, t.created_at, t.updated_at, ins.token AS claim_token, t.ordering_key FROM ins JOIN ${o} AS t ON t.seq = ins.seq`,
    [now, lease, batch, token()],
  );
  return toClaimed(rows);
}
async function leaseMark(c: Ctx, claimed: Claimed[]): Promise<number> {
  if (claimed.length === 0) return 0;
  const o = c.o;
  const rows = await executor.query(
    `WITH u AS (UPDATE ${o} AS t SET state = 'dispatched', updated_at = $2::timestamptz, next_attempt_at = NULL, last_error = NULL WHERE t.id = ANY(ARRAY(SELECT jsonb_object_keys($1::text::jsonb))) AND t.state || '' = 'pending' AND EXISTS (SELECT 1 FROM ${o}_leases AS l WHERE l.seq = t.seq AND l.token = (SELECT $1::text::jsonb) -> t.id ->> 1) RETURNING t.id, t.seq), d AS (DELETE FROM ${o}_leases AS l WHERE l.seq = ANY(ARRAY(SELECT seq FROM u))) SELECT id FROM u`,
    [fenced(claimed), new Date().toISOString()],
  );
  return rows.length;
}

// (e) The claim is a transaction's row locks: select FOR UPDATE SKIP LOCKED, (publish), update
// to dispatched, commit. One row version per message; the lease is the connection.
async function txCycle(c: Ctx, batch: number): Promise<number> {
  const o = c.o;
  return await sql.begin(async (tx) => {
    const rows = await tx.unsafe(
      `SELECT t.seq, t.id, t.kind, t.name, t.subject, t.payload, t.headers::text AS headers, t.state, t.attempts, t.created_at, t.ordering_key FROM ${o} AS t WHERE t.id = ANY(ARRAY(SELECT id FROM ${o} WHERE state = 'pending' AND key_head ORDER BY seq LIMIT $1::int FOR UPDATE SKIP LOCKED)) FOR UPDATE`,
      [batch],
      { prepare: true },
    );
    if (rows.length === 0) return 0;
    const done = await tx.unsafe(
      `UPDATE ${o} SET state = 'dispatched', attempts = attempts + 1, updated_at = $2::timestamptz WHERE id = ANY($1::text[]) RETURNING id`,
      [rows.map((r) => r.id as string), new Date().toISOString()],
      { prepare: true },
    );
    return done.length;
  });
}

// (f) Dispatched rows leave the outbox: DELETE + insert into a narrow history table (id, seq,
// dispatched_at), which keeps ids unique for dedup/get and counts for stats/prune.
function deleteMarkSql(c: Ctx, claimedState: string): string {
  const o = c.o;
  return `WITH d AS (DELETE FROM ${o} AS t WHERE t.id = ANY(ARRAY(SELECT jsonb_object_keys($1::text::jsonb))) AND t.state || '' = '${claimedState}' AND t.claim_token = (SELECT $1::text::jsonb) -> t.id ->> 1 AND t.attempts = ((SELECT $1::text::jsonb) -> t.id ->> 0)::int AND t.ordering_key IS NULL RETURNING t.id, t.seq, t.attempts) INSERT INTO ${o}_done (id, seq, attempts, dispatched_at) SELECT id, seq, attempts, $2::timestamptz FROM d RETURNING id`;
}
function deleteMark(claimedState: string) {
  return async (c: Ctx, claimed: Claimed[]): Promise<number> => {
    if (claimed.length === 0) return 0;
    const rows = await executor.query(deleteMarkSql(c, claimedState), [
      fenced(claimed),
      new Date().toISOString(),
    ]);
    return rows.length;
  };
}
const doneTable = (c: Ctx) =>
  `CREATE TABLE ${c.o}_done (id text PRIMARY KEY, seq bigint NOT NULL, attempts integer NOT NULL, dispatched_at timestamptz NOT NULL)`;
// The history keeps the whole row (get() of a dispatched message, enqueue's identity check).
const wideDoneTable = (c: Ctx) =>
  `CREATE TABLE ${c.o}_done (LIKE ${c.o} INCLUDING DEFAULTS, PRIMARY KEY (id))`;
function wideDeleteMark(claimedState: string) {
  return async (c: Ctx, claimed: Claimed[]): Promise<number> => {
    if (claimed.length === 0) return 0;
    const o = c.o;
    const rows = await executor.query(
      `WITH d AS (DELETE FROM ${o} AS t WHERE t.id = ANY(ARRAY(SELECT jsonb_object_keys($1::text::jsonb))) AND t.state || '' = '${claimedState}' AND t.claim_token = (SELECT $1::text::jsonb) -> t.id ->> 1 AND t.attempts = ((SELECT $1::text::jsonb) -> t.id ->> 0)::int AND t.ordering_key IS NULL RETURNING t.*) INSERT INTO ${o}_done (id, kind, name, subject, payload, headers, state, attempts, created_at, updated_at, next_attempt_at, last_error, outcome, seq, claim_token, ordering_key, key_head) SELECT id, kind, name, subject, payload, headers, 'dispatched', attempts, created_at, $2::timestamptz, NULL, NULL, outcome, seq, claim_token, ordering_key, key_head FROM d RETURNING id`,
      [fenced(claimed), new Date().toISOString()],
    );
    return rows.length;
  };
}
const hotSetup = (ff: number) => (c: Ctx) => [
  `ALTER TABLE ${c.o} ADD COLUMN lease_until timestamptz`,
  ...(ff < 100 ? [`ALTER TABLE ${c.o} SET (fillfactor = ${ff})`] : []),
];

// claim_idx is gone since schema version 6 (pg_row_results_2026_12_02.md measured dropping it).
const indexes = ["retention_idx", "pending_idx", "retry_idx"];
const keyIndexes = ["key_head_idx", "key_next_idx", "key_held_idx", "key_settled_idx"];

const variants: Variant[] = [
  { name: "lib" },
  { name: "base", claim: baseClaim, mark: baseMark },
  ...indexes.map((ix): Variant => ({
    name: `drop:${ix}`,
    setup: (c) => [`DROP INDEX ${c.o}_${ix}`],
    claim: baseClaim,
    mark: baseMark,
  })),
  { name: "base L64", batch: 64, claim: baseClaim, mark: baseMark },
  { name: "base L16", batch: 16, claim: baseClaim, mark: baseMark },
  {
    name: "base generic",
    planMode: "force_generic_plan",
    claim: baseClaim,
    mark: baseMark,
  },
  {
    name: "base custom",
    planMode: "force_custom_plan",
    claim: baseClaim,
    mark: baseMark,
  },
  {
    name: "base L16 generic",
    batch: 16,
    planMode: "force_generic_plan",
    claim: baseClaim,
    mark: baseMark,
  },
  {
    name: "drop:key indexes",
    setup: (c) => keyIndexes.map((ix) => `DROP INDEX ${c.o}_${ix}`),
    claim: baseClaim,
    mark: baseMark,
  },
  {
    name: "ff70",
    setup: (c) => [`ALTER TABLE ${c.o} SET (fillfactor = 70)`],
    claim: baseClaim,
    mark: baseMark,
  },
  { name: "hot-claim ff100", setup: hotSetup(100), claim: hotClaim, mark: hotMark },
  { name: "hot-claim ff70", setup: hotSetup(70), claim: hotClaim, mark: hotMark },
  { name: "hot-claim ff50", setup: hotSetup(50), claim: hotClaim, mark: hotMark },
  {
    name: "lease-table",
    setup: (c) => [
      `CREATE TABLE ${c.o}_leases (seq bigint PRIMARY KEY, token text NOT NULL, attempts integer NOT NULL, lease_until timestamptz NOT NULL)`,
    ],
    claim: leaseClaim,
    mark: leaseMark,
  },
  { name: "tx-held", cycle: txCycle },
  {
    name: "delete-history",
    setup: (c) => [doneTable(c)],
    claim: baseClaim,
    mark: deleteMark("claimed"),
  },
  {
    name: "delete-history wide",
    setup: (c) => [wideDoneTable(c)],
    claim: baseClaim,
    mark: wideDeleteMark("claimed"),
  },
  {
    name: "hot+delete ff50",
    setup: (c) => [...hotSetup(50)(c), doneTable(c)],
    claim: hotClaim,
    mark: deleteMark("pending"),
  },
  {
    name: "hot+delete-wide ff50",
    setup: (c) => [...hotSetup(50)(c), wideDoneTable(c)],
    claim: hotClaim,
    mark: wideDeleteMark("pending"),
  },
];

async function backendCpuUs(pid: number): Promise<number> {
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // fields[0] is field 3 (state): utime is field 14, stime field 15.
  return (Number(fields[11]) + Number(fields[12])) * 10_000; // 100 ticks/s
}

/** CPU µs of the private server's process tree (postmaster, children, reaped children). */
function treeCpuUs(): number {
  const root = privateServer?.pid;
  if (!root) return NaN;
  const stat = (pid: number) => {
    try {
      const text = Deno.readTextFileSync(`/proc/${pid}/stat`);
      const f = text.slice(text.lastIndexOf(")") + 2).split(" ");
      return {
        ppid: Number(f[1]),
        own: Number(f[11]) + Number(f[12]),
        kids: Number(f[13]) + Number(f[14]),
      };
    } catch {
      return undefined;
    }
  };
  const top = stat(root);
  if (!top) return NaN;
  let ticks = top.own + top.kids;
  for (const entry of Deno.readDirSync("/proc")) {
    const pid = Number(entry.name);
    if (!Number.isInteger(pid) || pid === root) continue;
    const child = stat(pid);
    if (child?.ppid === root) ticks += child.own;
  }
  return ticks * 10_000;
}

async function walOfDb(from: string, to: string, dbOid: number): Promise<[number, number]> {
  try {
    const out = await new Deno.Command(`${pgBin}/pg_waldump`, {
      args: ["-p", walDir, "-s", from, "-e", to],
      stdout: "piped",
      stderr: "null",
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    let bytes = 0;
    let fpi = 0;
    const marker = `/${dbOid}/`;
    for (const line of text.split("\n")) {
      if (!line.includes(marker)) continue;
      const m = /len \(rec\/tot\):\s*\d+\/\s*(\d+)/.exec(line);
      if (m) bytes += Number(m[1]);
      fpi += (line.match(/ FPW/g) ?? []).length;
    }
    return [bytes, fpi];
  } catch {
    return [NaN, NaN];
  }
}

async function tableStats(o: string): Promise<{ upd: number; hot: number }> {
  await sql.unsafe("SELECT pg_stat_force_next_flush()");
  await sql.unsafe("SELECT 1");
  await sql.unsafe("SELECT pg_stat_clear_snapshot()");
  const [row] = await sql.unsafe(
    `SELECT n_tup_upd::int AS upd, n_tup_hot_upd::int AS hot FROM pg_stat_user_tables WHERE relname = $1`,
    [o],
  );
  return { upd: row.upd, hot: row.hot };
}

function record(i: number, tag: string): OutboxRecord {
  return {
    id: `${tag}-${i}`,
    kind: "event.publish",
    name: "order.created",
    subject: `bench.s${i % 16}`,
    payload: payload(i).replace('"note":"', `"note":"${"y".repeat(20)}`),
    headers: {},
  };
}

const [{ pid }] = await sql.unsafe("SELECT pg_backend_pid() AS pid");
const [{ oid: dbOid }] = await sql.unsafe(
  "SELECT oid::int AS oid FROM pg_database WHERE datname = current_database()",
);
console.log(
  `n=${n} limit=${defaultLimit} depth=${depth} backend pid=${pid} db=${dbName}; ${
    new TextDecoder().decode((await new Deno.Command("uptime").output()).stdout).trim()
  }`,
);
console.log(
  "| variant | loop CPU µs/msg | vacuum CPU µs/msg | WAL B/msg (own db) | FPI/msg | global WAL B/msg | HOT % | msgs | wall s |",
);
console.log("|---|---|---|---|---|---|---|---|---|---|");

interface Result {
  heap: number;
  enq: number;
  tree: number;
  cpu: number;
  vac: number;
  wal: number;
  fpi: number;
  hot: string;
}
const results = new Map<string, Result[]>();
let index = 0;
try {
  for (let round = 0; round < rounds; round++) {
    for (const v of variants) {
      if (
        only &&
        !only.some((name) =>
          v.name === name || (name.endsWith("*") && v.name.startsWith(name.slice(0, -1)))
        )
      ) continue;
      const o = `v${index++}_outbox`;
      const tables = { outbox: o, inbox: o.replace("outbox", "inbox") };
      await migrate(executor, { dialect: "postgres", tables });
      const repo = new SqlOutboxRepository(executor, "postgres", tables);
      const s = outboxStatements("postgres", resolveSqlOutboxTables(tables), false);
      const c: Ctx = { o, repo, s, returning: s.claim.slice(s.claim.lastIndexOf(" RETURNING ")) };
      for (const statement of v.setup?.(c) ?? []) await sql.unsafe(statement);
      await sql.unsafe(`ALTER TABLE ${o} SET (autovacuum_enabled = false)`);
      const enq0 = await backendCpuUs(pid);
      for (let i = 0; i < n; i += 1000) {
        await repo.enqueueMany(
          Array.from({ length: Math.min(1000, n - i) }, (_, k) => record(i + k, o)),
        );
      }
      const enq1 = await backendCpuUs(pid);
      const [{ heap }] = await sql.unsafe(
        `SELECT pg_relation_size('${o}')::float8 / 1048576 AS heap`,
      );
      await sql.unsafe(`VACUUM ANALYZE ${o}`);
      for (const t of [`${o}_leases`, `${o}_done`]) {
        await sql.unsafe(
          `DO $$BEGIN IF to_regclass('${t}') IS NOT NULL THEN EXECUTE 'ANALYZE ${t}'; END IF; END$$`,
        );
      }
      // Each variant's statements are new texts, so new prepared statements planned now.
      await sql.unsafe(`SET plan_cache_mode = ${v.planMode ?? "auto"}`);
      const before = await tableStats(o);
      const [{ lsn: lsn0 }] = await sql.unsafe("SELECT pg_current_wal_insert_lsn()::text AS lsn");
      const cpu0 = await backendCpuUs(pid);
      const tree0 = treeCpuUs();
      const t0 = performance.now();
      const limit = v.batch ?? defaultLimit;
      let done = 0;
      if (v.cycle) {
        while (true) {
          const k = await v.cycle(c, limit);
          if (k === 0) break;
          done += k;
        }
      } else if (v.claim && v.mark) {
        // `--depth` batches stay claimed (leased) while the next is claimed: a relay's window.
        const window: Claimed[][] = [];
        for (let k = 0; k < depth; k++) window.push(await v.claim(c, limit));
        while (true) {
          const next = await v.claim(c, limit);
          const oldest = window.shift()!;
          done += await v.mark(c, oldest);
          window.push(next);
          if (window.every((batch) => batch.length === 0)) break;
        }
      } else {
        // lib: the repository's own claimDue and markMany, unkeyed dispatched marks with tokens.
        let prev = await repo.claimDue(limit, new Date());
        while (true) {
          const next = await repo.claimDue(limit, new Date());
          if (prev.length > 0) {
            const ok = await repo.markMany(
              prev.map((m) => ({
                claim: { id: m.id, attempts: m.attempts, claimToken: m.claimToken },
                state: "dispatched" as const,
              })),
              new Date(),
            );
            done += ok.filter(Boolean).length;
          }
          if (prev.length === 0 && next.length === 0) break;
          prev = next;
        }
      }
      const wall = (performance.now() - t0) / 1000;
      const cpu1 = await backendCpuUs(pid);
      const tree1 = treeCpuUs();
      const [{ lsn: lsn1, diff }] = await sql.unsafe(
        "SELECT pg_current_wal_insert_lsn()::text AS lsn, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8 AS diff",
        [lsn0],
      );
      await sql.unsafe("RESET plan_cache_mode");
      const after = await tableStats(o);
      const [walBytes, fpi] = await walOfDb(lsn0, lsn1, dbOid);
      const vac0 = await backendCpuUs(pid);
      await sql.unsafe(`VACUUM ${o}`);
      for (const t of [`${o}_leases`, `${o}_done`]) {
        const [{ e }] = await sql.unsafe(`SELECT to_regclass('${t}') IS NOT NULL AS e`);
        if (e) await sql.unsafe(`VACUUM ${t}`);
      }
      const vac1 = await backendCpuUs(pid);
      const upd = after.upd - before.upd;
      const hot = after.hot - before.hot;
      const per = (x: number) => (done > 0 ? (x / done).toFixed(1) : "-");
      console.log(
        `| ${v.name} | ${per(cpu1 - cpu0)} | ${per(vac1 - vac0)} | ${per(walBytes)} | ${
          done > 0 ? (fpi / done).toFixed(3) : "-"
        } | ${per(diff)} | ${
          upd > 0 ? ((100 * hot) / upd).toFixed(0) : "-"
        } (${hot}/${upd}) | ${done} | ${wall.toFixed(1)} |`,
      );
      const list = results.get(v.name) ?? [];
      list.push({
        heap: heap,
        enq: (enq1 - enq0) / n,
        cpu: (cpu1 - cpu0) / done,
        tree: (tree1 - tree0) / done,
        vac: (vac1 - vac0) / done,
        wal: walBytes / done,
        fpi: fpi / done,
        hot: upd > 0 ? ((100 * hot) / upd).toFixed(0) : "-",
      });
      results.set(v.name, list);
      if (done !== n) console.log(`  (!) ${v.name}: dispatched ${done} of ${n}`);
      await sql.unsafe(
        `DROP TABLE IF EXISTS ${o}, ${o}_leases, ${o}_done, ${o}_keys, ${tables.inbox} CASCADE`,
      );
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const range = (xs: number[]) =>
    `${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}-${Math.max(...xs).toFixed(1)})`;
  const base = results.get("base") ?? results.get("lib");
  console.log(`\nmedians over ${rounds} round(s), (min-max):`);
  console.log(
    "| variant | loop CPU µs/msg | vs base | loop+vacuum µs/msg | server tree µs/msg | WAL B/msg | FPI/msg | HOT % | enqueue µs/msg | heap MB after enqueue |",
  );
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const [name, list] of results) {
    const cpu = list.map((r) => r.cpu);
    const total = list.map((r) => r.cpu + r.vac);
    const rel = base
      ? `${((median(cpu) / median(base.map((r) => r.cpu)) - 1) * 100).toFixed(0)}%`
      : "-";
    console.log(
      `| ${name} | ${range(cpu)} | ${rel} | ${range(total)} | ${
        median(list.map((r) => r.tree)).toFixed(1)
      } | ${median(list.map((r) => r.wal)).toFixed(0)} | ${
        median(list.map((r) => r.fpi)).toFixed(3)
      } | ${list.map((r) => r.hot).join("/")} | ${median(list.map((r) => r.enq)).toFixed(1)} | ${
        median(list.map((r) => r.heap)).toFixed(1)
      } |`,
    );
  }
} finally {
  await sql.end();
  await admin.unsafe(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  await admin.end();
  await privateServer?.stop();
}
