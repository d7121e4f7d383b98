/**
 * Runs the NATS-facing suites (the NATS KV store's conformance and behaviour, the dispatcher to
 * JetStream, the inbox consumer) against the nats-server of each Debian suite named, fetched by
 * `scripts/fetch_nats_server.ts` and started privately by the test kit. Postgres comes from
 * `OUTBOX_TEST_POSTGRES_URL` or the kit as usual.
 *
 * Usage: deno run -A scripts/test_nats_versions.ts [--fast] <suite>...
 *   --fast   the conformance, dispatcher and inbox files only (what CI runs on the newest line)
 *
 * Each suite's `deno test` output is passed through, so its summary line is the last one printed
 * for that suite. Exits non-zero when any run failed.
 *
 * @module
 */

import { fetchNatsServer } from "./fetch_nats_server.ts";

/** The files run against every server version. */
export const fastFiles = [
  "tests/nats_kv_conformance_test.ts",
  "tests/dispatcher_test.ts",
  "tests/dispatch_outbox_test.ts",
  "tests/inbox_consume_test.ts",
  "tests/inbox_sql_test.ts",
  "tests/key_fence_test.ts",
];

/** Added without `--fast`. */
export const slowFiles = [
  "tests/dispatcher_faults_test.ts",
  "tests/nats_kv_test.ts",
  "tests/nats_kv_fault_test.ts",
];

if (import.meta.main) {
  const fast = Deno.args.includes("--fast");
  const wanted = Deno.args.filter((arg) => !arg.startsWith("--"));
  if (wanted.length === 0) {
    console.error("usage: deno run -A scripts/test_nats_versions.ts [--fast] <suite>...");
    Deno.exit(2);
  }
  const files = fast ? fastFiles : [...fastFiles, ...slowFiles];
  const failures: string[] = [];
  for (const suite of wanted) {
    let binary: string;
    let version: string;
    try {
      ({ binary, version } = await fetchNatsServer(suite));
    } catch (error) {
      console.error(
        `test_nats_versions: ${suite}: ${error instanceof Error ? error.message : error}`,
      );
      failures.push(suite);
      continue;
    }
    console.error(`test_nats_versions: ${suite}: nats-server ${version} (${binary})`);
    const env: Record<string, string> = { ...Deno.env.toObject(), OUTBOX_NATS_SERVER_BIN: binary };
    delete env.OUTBOX_TEST_NATS_URL; // the kit starts a private server from the binary
    const status = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "tests/kit/run.ts",
        Deno.execPath(),
        "test",
        "-A",
        "--sanitize-ops",
        "--sanitize-resources",
        ...files,
      ],
      env,
      clearEnv: true,
      stdin: "null",
      stdout: "inherit",
      stderr: "inherit",
    }).spawn().status;
    if (!status.success) failures.push(`${suite} (nats-server ${version})`);
  }
  if (failures.length > 0) {
    console.error(`test_nats_versions: failed on ${failures.join(", ")}`);
    Deno.exit(1);
  }
}
