/**
 * The CLI and the relay reach a NATS server that requires credentials and TLS: private
 * nats-servers with mutual TLS and a token, and with a user/password and an nkey user. Secrets
 * come from environment variables and files, and never appear in anything the CLI prints (logs,
 * status lines, the health endpoint, errors).
 */

import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { join } from "node:path";
import { jetstreamManager } from "@nats-io/jetstream";
import { createAccount, createOperator, createUser, type KeyPair } from "@nats-io/nkeys";
import { connect, credsAuthenticator, type NodeConnectionOptions } from "@nats-io/transport-node";
import { migrate, nodeSqliteExecutor, SqlOutboxRepository } from "../mod.ts";
import { CliProcess, type CliResult, runCli } from "./helpers/cli.ts";
import { eventually, NatsServer, uniqueName } from "./kit/mod.ts";
import { natsServerBinary } from "./kit/nats_server.ts";

const ignore = natsServerBinary() === undefined;

async function openssl(args: string[], cwd: string): Promise<void> {
  const output = await new Deno.Command("openssl", { args, cwd, stdout: "null", stderr: "piped" })
    .output();
  if (!output.success) {
    throw new Error(`openssl ${args.join(" ")}: ${new TextDecoder().decode(output.stderr)}`);
  }
}

/** A CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`. */
async function certificates(dir: string): Promise<void> {
  const subject = (cn: string) => ["-subj", `/CN=${cn}`];
  await openssl([
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    "ca-key.pem",
    "-out",
    "ca.pem",
    "-days",
    "2",
    ...subject("outbox test CA"),
  ], dir);
  for (const name of ["server", "client"]) {
    await openssl([
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      `${name}-key.pem`,
      "-out",
      `${name}.csr`,
      ...subject(`outbox ${name}`),
    ], dir);
    await Deno.writeTextFile(
      join(dir, `${name}.ext`),
      name === "server"
        ? "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        : "extendedKeyUsage=clientAuth\n",
    );
    await openssl([
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca-key.pem",
      "-CAcreateserial",
      "-out",
      `${name}.pem`,
      "-days",
      "2",
      "-extfile",
      `${name}.ext`,
    ], dir);
  }
}

/** A SQLite store with `count` messages for `subject`, and a stream capturing it. */
async function seedSqlite(path: string, subject: string, count: number): Promise<void> {
  const db = new DatabaseSync(path);
  try {
    const executor = nodeSqliteExecutor(db);
    await migrate(executor, { dialect: "sqlite" });
    const outbox = new SqlOutboxRepository(executor, "sqlite");
    for (let i = 0; i < count; i++) {
      await outbox.enqueue({
        id: `${subject}-${i}`,
        kind: "event.publish",
        name: "secured",
        subject,
        payload: JSON.stringify({ i }),
        headers: {},
      });
    }
  } finally {
    db.close();
  }
}

async function streamCount(options: NodeConnectionOptions, stream: string): Promise<number> {
  const nc = await connect(options);
  try {
    return (await (await jetstreamManager(nc)).streams.info(stream)).state.messages;
  } finally {
    await nc.close();
  }
}

function assertNoSecret(text: string, secrets: string[]): void {
  for (const secret of secrets) {
    assert.ok(!text.includes(secret.trim()), `a secret leaked into:\n${text}`);
  }
}

function oneLine(result: CliResult, pattern: RegExp): void {
  assert.equal(result.code, 1, result.stderr);
  const lines = result.stderr.split("\n").filter(Boolean);
  assert.equal(lines.length, 1, result.stderr);
  assert.match(lines[0], pattern);
}

Deno.test({
  name:
    "cli nats security: mutual TLS and a token from env/files; the relay publishes; no secret is printed",
  ignore,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "outbox_tls_" });
    await certificates(dir);
    const token = `tok-${crypto.randomUUID()}`;
    const server = await NatsServer.start({
      config: [
        `tls { cert_file: "${dir}/server.pem", key_file: "${dir}/server-key.pem", ca_file: "${dir}/ca.pem", verify: true, timeout: 5 }`,
        `authorization { token: "${token}" }`,
      ],
    });
    const clientKey = await Deno.readTextFile(join(dir, "client-key.pem"));
    const tls = {
      ca: await Deno.readTextFile(join(dir, "ca.pem")),
      cert: await Deno.readTextFile(join(dir, "client.pem")),
      key: clientKey,
    };
    const admin: NodeConnectionOptions = { servers: `127.0.0.1:${server.port}`, token, tls };
    const url = `tls://127.0.0.1:${server.port}`;
    const secrets = [token, clientKey.split("\n")[1]];
    try {
      const prefix = uniqueName("sec");
      const nc = await connect(admin);
      const stream = `S_${prefix}`;
      await (await jetstreamManager(nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });
      await nc.close();
      const path = join(dir, "app.db");
      await seedSqlite(path, `${prefix}.created`, 3);
      await Deno.writeTextFile(join(dir, "token"), `${token}\n`);

      // The token from a file, the client key from an environment variable (PEM content).
      const relay = new CliProcess([
        "relay",
        "--store",
        `sqlite:${path}`,
        "--nats",
        url,
        "--nats-token-file",
        join(dir, "token"),
        "--nats-tls-ca",
        join(dir, "ca.pem"),
        "--nats-tls-cert",
        join(dir, "client.pem"),
        "--health",
        "0",
        "--health-host",
        "127.0.0.1",
        "--status-interval",
        "200ms",
        "--poll",
        "100ms",
      ], { OUTBOX_NATS_TLS_KEY: clientKey });
      let health = "";
      try {
        const line = await relay.waitForLine(/^relay: health endpoint on http:\/\/\S+\/( |$)/);
        await relay.waitForLine(/^relay: started: sqlite:.* -> JetStream at tls:\/\/127\.0\.0\.1/);
        await eventually(async () => assert.equal(await streamCount(admin, stream), 3));
        await relay.waitForLine(/^relay: published 3 /);
        const response = await fetch(/http:\/\/\S+\//.exec(line)![0]);
        health = await response.text();
        relay.kill("SIGTERM");
        const result = await relay.done;
        assert.equal(result.code, 0, result.stderr);
        assertNoSecret(`${result.stdout}\n${result.stderr}\n${health}`, secrets);
      } finally {
        await relay.cleanup();
      }

      // The token and TLS from environment variables only, for a KV store command.
      const bucket = uniqueName("secb");
      const env = {
        OUTBOX_NATS_TOKEN: token,
        OUTBOX_NATS_TLS_CA: join(dir, "ca.pem"),
        OUTBOX_NATS_TLS_CERT: tls.cert,
        OUTBOX_NATS_TLS_KEY: join(dir, "client-key.pem"),
      };
      const kv = ["--store", `nats-kv://${bucket}`, "--nats", url];
      const created = await runCli(["migrate", ...kv], env);
      assert.equal(created.code, 0, created.stderr);
      const status = await runCli(["status", ...kv, "--json"], env);
      assert.equal(status.code, 0, status.stderr);
      assert.equal(JSON.parse(status.stdout).pending, 0);
      assertNoSecret(created.stdout + created.stderr + status.stdout + status.stderr, secrets);

      // Failures are one line, name what was used by kind, and show no secret.
      const wrongToken = await runCli(["status", ...kv], { ...env, OUTBOX_NATS_TOKEN: "nope" });
      oneLine(
        wrongToken,
        /^outbox-nats: cannot connect to NATS at tls:\/\/127\.0\.0\.1:\d+ \(token \$OUTBOX_NATS_TOKEN, TLS \(own CA\) with a client certificate\): .*[Aa]uthorization/,
      );
      const noCa = await runCli(["status", ...kv], { ...env, OUTBOX_NATS_TLS_CA: "" });
      oneLine(noCa, /^outbox-nats: cannot connect to NATS at .*certificate/i);
      const noClientCert = await runCli(["status", ...kv], {
        OUTBOX_NATS_TOKEN: token,
        OUTBOX_NATS_TLS_CA: join(dir, "ca.pem"),
      });
      assert.equal(noClientCert.code, 1, noClientCert.stderr);
      const plain = await runCli([
        "status",
        "--store",
        `nats-kv://${bucket}`,
        "--nats",
        `nats://${token}@127.0.0.1:${server.port}`,
      ]);
      assert.equal(plain.code, 1);
      assert.match(plain.stderr, /nats:\/\/\*\*\*@127\.0\.0\.1/);
      const missingFile = await runCli(["status", ...kv, "--nats-token-file", join(dir, "nope")]);
      oneLine(missingFile, /--nats-token-file: cannot read .*nope \(ENOENT\)/);
      for (const result of [wrongToken, noCa, noClientCert, plain, missingFile]) {
        assertNoSecret(result.stdout + result.stderr, secrets);
      }
    } finally {
      await server.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "cli nats security: user/password and nkey seed, from files and env; contradictions are usage errors",
  ignore,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "outbox_auth_" });
    const password = `pw-${crypto.randomUUID()}`;
    const user = createUser();
    const seed = new TextDecoder().decode(user.getSeed());
    const server = await NatsServer.start({
      config: [
        `authorization { users: [ { user: "alice", password: "${password}" }, { nkey: "${user.getPublicKey()}" } ] }`,
      ],
    });
    const url = `nats://127.0.0.1:${server.port}`;
    const secrets = [password, seed];
    try {
      await Deno.writeTextFile(join(dir, "password"), `${password}\n`);
      await Deno.writeTextFile(join(dir, "seed.nk"), `${seed}\n`);
      const bucket = uniqueName("authb");
      const kv = ["--store", `nats-kv://${bucket}`, "--nats", url];
      const runs: CliResult[] = [];
      const ok = async (args: string[], env: Record<string, string> = {}) => {
        const result = await runCli(args, env);
        runs.push(result);
        assert.equal(result.code, 0, result.stderr);
        return result;
      };
      await ok([
        "migrate",
        ...kv,
        "--nats-user",
        "alice",
        "--nats-password-file",
        join(dir, "password"),
      ]);
      await ok(["status", ...kv], { OUTBOX_NATS_USER: "alice", OUTBOX_NATS_PASSWORD: password });
      await ok(["status", ...kv, "--nats-nkey", join(dir, "seed.nk")]);
      await ok(["status", ...kv], { OUTBOX_NATS_NKEY: seed });

      const noAuth = await runCli(["status", ...kv]);
      oneLine(
        noAuth,
        /^outbox-nats: cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+: .*[Aa]uthorization/,
      );
      const wrong = await runCli(["status", ...kv], {
        OUTBOX_NATS_USER: "alice",
        OUTBOX_NATS_PASSWORD: "nope",
      });
      oneLine(wrong, /\(user alice, password \$OUTBOX_NATS_PASSWORD\): .*[Aa]uthorization/);
      const both = await runCli(["status", ...kv, "--nats-nkey", join(dir, "seed.nk")], {
        OUTBOX_NATS_TOKEN: "t",
      });
      assert.equal(both.code, 2, both.stderr);
      assert.match(both.stderr, /give one way to authenticate to NATS, not 2: nkey, token/);
      const userOnly = await runCli(["status", ...kv, "--nats-user", "alice"]);
      assert.equal(userOnly.code, 2, userOnly.stderr);
      assert.match(userOnly.stderr, /--nats-user alice needs a password/);
      const typo = await runCli(["status", ...kv], { OUTBOX_NATS_NKEY: `${seed}x!` });
      oneLine(
        typo,
        /\$OUTBOX_NATS_NKEY: neither the secret itself nor a readable file \(ENOENT\)$/,
      );
      assertNoSecret(typo.stderr, [seed.slice(0, 20)]);
      const badSeed = await runCli(["status", ...kv, "--nats-nkey", join(dir, "password")]);
      oneLine(badSeed, /nkey seed from file .*password is not an nkey seed/);
      for (const result of [...runs, noAuth, wrong, both, userOnly, badSeed]) {
        assertNoSecret(result.stdout + result.stderr, secrets);
      }
    } finally {
      await server.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

function base64url(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes)).replaceAll("+", "-").replaceAll("/", "_")
    .replace(/=+$/, "");
}

/** A NATS JWT (v2) for `subject`, signed by `issuer`. */
function natsJwt(issuer: KeyPair, subject: string, name: string, nats: object): string {
  const encoder = new TextEncoder();
  const header = base64url(encoder.encode(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" })));
  const claims = {
    jti: crypto.randomUUID().replaceAll("-", "").toUpperCase(),
    iat: Math.floor(Date.now() / 1000),
    iss: issuer.getPublicKey(),
    name,
    sub: subject,
    nats: { ...nats, version: 2 },
  };
  const payload = base64url(encoder.encode(JSON.stringify(claims)));
  const signature = base64url(issuer.sign(encoder.encode(`${header}.${payload}`)));
  return `${header}.${payload}.${signature}`;
}

Deno.test({
  name: "cli nats security: a creds file (operator mode, user JWT and seed); the relay publishes",
  ignore,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "outbox_creds_" });
    const operator = createOperator();
    const account = createAccount();
    const system = createAccount(); // JetStream needs a system account in operator mode
    const user = createUser();
    const unlimited = { subs: -1, data: -1, payload: -1 };
    const systemJwt = natsJwt(operator, system.getPublicKey(), "SYS", {
      type: "account",
      limits: { ...unlimited, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 },
    });
    const operatorJwt = natsJwt(operator, operator.getPublicKey(), "op", { type: "operator" });
    const accountJwt = natsJwt(operator, account.getPublicKey(), "app", {
      type: "account",
      limits: {
        ...unlimited,
        imports: -1,
        exports: -1,
        wildcards: true,
        conn: -1,
        leaf: -1,
        mem_storage: -1,
        disk_storage: -1,
        streams: -1,
        consumer: -1,
      },
      default_permissions: { pub: {}, sub: {} },
    });
    const userJwt = natsJwt(account, user.getPublicKey(), "relay", {
      type: "user",
      pub: {},
      sub: {},
      ...unlimited,
    });
    const seed = new TextDecoder().decode(user.getSeed());
    const creds = [
      "-----BEGIN NATS USER JWT-----",
      userJwt,
      "------END NATS USER JWT------",
      "",
      "-----BEGIN USER NKEY SEED-----",
      seed,
      "------END USER NKEY SEED------",
      "",
    ].join("\n");
    await Deno.writeTextFile(join(dir, "relay.creds"), creds);
    const server = await NatsServer.start({
      config: [
        `operator: "${operatorJwt}"`,
        "resolver: MEMORY",
        `system_account: ${system.getPublicKey()}`,
        `resolver_preload: { ${account.getPublicKey()}: "${accountJwt}", ${system.getPublicKey()}: "${systemJwt}" }`,
      ],
    });
    const url = `nats://127.0.0.1:${server.port}`;
    try {
      const admin: NodeConnectionOptions = {
        servers: url,
        authenticator: credsAuthenticator(new TextEncoder().encode(creds)),
      };
      const prefix = uniqueName("creds");
      const stream = `S_${prefix}`;
      const nc = await connect(admin);
      await (await jetstreamManager(nc)).streams.add({ name: stream, subjects: [`${prefix}.>`] });
      await nc.close();
      const path = join(dir, "app.db");
      await seedSqlite(path, `${prefix}.created`, 2);

      const relay = new CliProcess([
        "relay",
        "--store",
        `sqlite:${path}`,
        "--nats",
        url,
        "--nats-creds",
        join(dir, "relay.creds"),
        "--status-interval",
        "200ms",
        "--poll",
        "100ms",
      ]);
      try {
        await relay.waitForLine(/^relay: started/);
        await eventually(async () => assert.equal(await streamCount(admin, stream), 2));
        relay.kill("SIGTERM");
        const result = await relay.done;
        assert.equal(result.code, 0, result.stderr);
        assertNoSecret(result.stdout + result.stderr, [seed, userJwt]);
      } finally {
        await relay.cleanup();
      }
      // The creds' content from the environment; no creds at all is refused by the server.
      const kv = ["--store", `nats-kv://${uniqueName("credsb")}`, "--nats", url];
      const created = await runCli(["migrate", ...kv], { OUTBOX_NATS_CREDS: creds });
      assert.equal(created.code, 0, created.stderr);
      const refused = await runCli(["status", ...kv]);
      oneLine(refused, /^outbox-nats: cannot connect to NATS at nats:\/\/127\.0\.0\.1:\d+: /);
      assertNoSecret(created.stdout + created.stderr + refused.stderr, [seed, userJwt]);
    } finally {
      await server.stop();
      await Deno.remove(dir, { recursive: true });
    }
  },
});
