/**
 * NATS credentials and TLS for the CLI and the relay: a creds file, an nkey seed, user and
 * password, a token, TLS with a CA and a client certificate, `tls://` URLs. Every secret comes
 * from a file or an environment variable, never from the command line, and no secret is ever
 * part of a message the CLI prints: what is used is described by kind only ("token", "creds
 * file /etc/nats/relay.creds").
 *
 * @module
 */

import { readFileSync } from "node:fs";
import process from "node:process";
import {
  type Authenticator,
  credsAuthenticator,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
} from "@nats-io/transport-node";
import type { OptionSpec, OptionValues } from "./args.ts";
import { CliError, CliUsageError } from "./errors.ts";

/** The NATS security options every command that connects to NATS takes. */
export const natsSecurityOptions: Record<string, OptionSpec> = {
  "nats-creds": {
    type: "string",
    value: "<file>",
    description: "NATS credentials file (user JWT and nkey seed); env OUTBOX_NATS_CREDS: a path " +
      "or the file's content",
  },
  "nats-nkey": {
    type: "string",
    value: "<file>",
    description: "File holding an nkey seed (SU...); env OUTBOX_NATS_NKEY: a path or the seed",
  },
  "nats-user": {
    type: "string",
    value: "<name>",
    env: "OUTBOX_NATS_USER",
    description: "NATS user name; the password comes from --nats-password-file or " +
      "OUTBOX_NATS_PASSWORD",
  },
  "nats-password-file": {
    type: "string",
    value: "<file>",
    description: "File holding the NATS user's password (or env OUTBOX_NATS_PASSWORD)",
  },
  "nats-token-file": {
    type: "string",
    value: "<file>",
    description: "File holding a NATS token (or env OUTBOX_NATS_TOKEN)",
  },
  "nats-tls-ca": {
    type: "string",
    value: "<file>",
    description: "CA certificate(s) to verify the NATS server; env OUTBOX_NATS_TLS_CA: a path " +
      "or PEM. Any TLS option, or a tls:// URL, requires TLS",
  },
  "nats-tls-cert": {
    type: "string",
    value: "<file>",
    description: "Client certificate for NATS TLS; env OUTBOX_NATS_TLS_CERT: a path or PEM",
  },
  "nats-tls-key": {
    type: "string",
    value: "<file>",
    description: "Client certificate's private key; env OUTBOX_NATS_TLS_KEY: a path or PEM",
  },
};

/** What to add to nats.js' connection options, and how to describe it without secrets. */
export interface NatsSecurity {
  /** Authenticators (at most one). */
  authenticator?: Authenticator;
  /** TLS settings; `undefined`: TLS only if the server requires it. */
  tls?: { ca?: string; cert?: string; key?: string };
  /** What is used, for messages: `token`, `creds file /etc/nats/relay.creds`, `TLS`. */
  description: string[];
}

/** Where a secret came from, for messages: never the secret itself. */
interface Secret {
  value: string;
  /** `file /path` or `$VARIABLE`. */
  source: string;
}

function readSecretFile(path: string, option: string): Secret {
  try {
    return { value: readFileSync(path, "utf8"), source: `file ${path}` };
  } catch (error) {
    const code = (error as { code?: string }).code ?? "unreadable";
    throw new CliError(`${option}: cannot read ${path} (${code})`);
  }
}

/**
 * A secret from the option (a file path) or else the environment variable, which may hold a
 * path or, when it looks like the secret itself (`looksInline`), the secret.
 */
function secretOf(
  values: OptionValues,
  option: string,
  variable: string,
  looksInline: (text: string) => boolean,
  env: Record<string, string | undefined>,
): Secret | undefined {
  const path = values[option];
  if (typeof path === "string" && path.length > 0) return readSecretFile(path, `--${option}`);
  const fromEnv = env[variable];
  if (fromEnv === undefined || fromEnv.length === 0) return undefined;
  if (looksInline(fromEnv)) return { value: fromEnv, source: `$${variable}` };
  try {
    return { value: readFileSync(fromEnv, "utf8"), source: `$${variable} (file)` };
  } catch (error) {
    // The value may be a mistyped secret: never echo it.
    const code = (error as { code?: string }).code ?? "unreadable";
    throw new CliError(`$${variable}: neither the secret itself nor a readable file (${code})`);
  }
}

const always = () => true;
const pem = (text: string) => text.trimStart().startsWith("-----BEGIN");
const seed = (text: string) => /^\s*S[A-Z]{2}[A-Z2-7]{50,}\s*$/.test(text);

/**
 * Reads the NATS security options (and their environment variables). Throws
 * {@linkcode CliUsageError} for contradictory options (two ways to authenticate, a password
 * without a user) and {@linkcode CliError} for a file that cannot be read; neither message
 * contains a secret.
 */
export function natsSecurity(
  values: OptionValues,
  natsUrl: string | undefined,
  env: Record<string, string | undefined> = process.env,
): NatsSecurity {
  const description: string[] = [];
  const authenticators: Array<[string, Authenticator]> = [];
  const encoder = new TextEncoder();

  const creds = secretOf(values, "nats-creds", "OUTBOX_NATS_CREDS", pem, env);
  if (creds) {
    authenticators.push([`creds ${creds.source}`, credsAuthenticator(encoder.encode(creds.value))]);
  }
  const nkey = secretOf(values, "nats-nkey", "OUTBOX_NATS_NKEY", seed, env);
  if (nkey) {
    const text = nkey.value.trim();
    if (!seed(text)) {
      throw new CliError(`nkey seed from ${nkey.source} is not an nkey seed (S...)`);
    }
    authenticators.push([`nkey ${nkey.source}`, nkeyAuthenticator(encoder.encode(text))]);
  }
  const user = typeof values["nats-user"] === "string" ? values["nats-user"] : undefined;
  const password = secretOf(values, "nats-password-file", "OUTBOX_NATS_PASSWORD", always, env);
  if (password && !user) {
    throw new CliUsageError(
      "a NATS password was given (--nats-password-file or OUTBOX_NATS_PASSWORD) without " +
        "--nats-user (or OUTBOX_NATS_USER)",
    );
  }
  if (user) {
    if (!password) {
      throw new CliUsageError(
        `--nats-user ${user} needs a password: --nats-password-file <file> or OUTBOX_NATS_PASSWORD`,
      );
    }
    authenticators.push([
      `user ${user}, password ${password.source}`,
      usernamePasswordAuthenticator(user, password.value.replace(/\r?\n$/, "")),
    ]);
  }
  const token = secretOf(values, "nats-token-file", "OUTBOX_NATS_TOKEN", always, env);
  if (token) {
    authenticators.push([
      `token ${token.source}`,
      tokenAuthenticator(token.value.replace(/\r?\n$/, "")),
    ]);
  }
  if (authenticators.length > 1) {
    throw new CliUsageError(
      `give one way to authenticate to NATS, not ${authenticators.length}: ${
        authenticators.map(([what]) => what.split(" ")[0]).join(", ")
      }`,
    );
  }
  const security: NatsSecurity = { description };
  if (authenticators.length === 1) {
    const [what, authenticator] = authenticators[0];
    security.authenticator = authenticator;
    description.push(what);
  }

  const ca = secretOf(values, "nats-tls-ca", "OUTBOX_NATS_TLS_CA", pem, env);
  const cert = secretOf(values, "nats-tls-cert", "OUTBOX_NATS_TLS_CERT", pem, env);
  const key = secretOf(values, "nats-tls-key", "OUTBOX_NATS_TLS_KEY", pem, env);
  if ((cert === undefined) !== (key === undefined)) {
    throw new CliUsageError(
      "a NATS client certificate needs both --nats-tls-cert and --nats-tls-key",
    );
  }
  const tlsUrl = (natsUrl ?? "").split(",").some((server) => /^\s*tls:\/\//i.test(server));
  if (ca || cert || tlsUrl) {
    security.tls = {};
    if (ca) security.tls.ca = ca.value;
    if (cert && key) {
      security.tls.cert = cert.value;
      security.tls.key = key.value;
    }
    description.push(
      `TLS${ca ? " (own CA)" : ""}${cert ? " with a client certificate" : ""}`,
    );
  }
  return security;
}
