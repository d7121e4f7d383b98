/**
 * Fetches the nats-server binary that a Debian suite ships, with apt itself, and prints its path.
 *
 * Debian bookworm ships nats-server 2.9, trixie 2.10, sid the current release line (2.15 when this
 * was written). For each suite named on the command line the script keeps a private apt state
 * (its own sources list, lists and archive cache: the machine's apt configuration is not touched)
 * under the cache directory, runs `apt-get update` and `apt-get download nats-server` there,
 * unpacks the .deb with `dpkg-deb -x`, and prints `<suite> <version> <binary path>` on stdout.
 * A binary fetched less than a week ago is reused without asking apt again (`--refresh` asks).
 *
 * Usage: deno run -A scripts/fetch_nats_server.ts [--refresh] [--path] <suite>...
 *   --path      print only the binary path (one line per suite), for shell scripts
 *   --refresh   ask apt even when a cached binary is fresh
 *
 * Cache: `$OUTBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/outbox-nats`, else `~/.cache/outbox-nats`.
 * Needs `apt-get` and `dpkg-deb` (Debian or Ubuntu) and access to deb.debian.org.
 *
 * @module
 */

/** Debian suites the script knows, with the nats-server line each shipped when written. */
export const suites: Record<string, string> = {
  bookworm: "2.9",
  trixie: "2.10",
  sid: "2.15",
};

const keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
const mirror = Deno.env.get("OUTBOX_DEBIAN_MIRROR") ?? "http://deb.debian.org/debian";
const maxAgeMs = 7 * 24 * 3600 * 1000;

/** A fetched binary. */
export interface FetchedServer {
  suite: string;
  /** The Debian package version, for example `2.15.1-1`. */
  version: string;
  /** Absolute path of the unpacked `nats-server`. */
  binary: string;
}

/** The cache root for fetched servers. */
export function cacheRoot(): string {
  const explicit = Deno.env.get("OUTBOX_CACHE_DIR");
  if (explicit) return explicit;
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  const home = Deno.env.get("HOME") ?? "/tmp";
  return `${xdg ?? `${home}/.cache`}/outbox-nats`;
}

/** Fetches (or reuses) the nats-server binary of `suite`. */
export async function fetchNatsServer(suite: string, refresh = false): Promise<FetchedServer> {
  if (!/^[a-z][a-z0-9-]*$/.test(suite)) throw new Error(`not a Debian suite name: ${suite}`);
  const dir = `${cacheRoot()}/nats-server/${suite}`;
  const marker = `${dir}/current`;
  if (!refresh) {
    const cached = await readCurrent(marker);
    if (cached && Date.now() - cached.fetchedAt < maxAgeMs) return cached.server;
  }
  const state = `${dir}/apt`;
  for (
    const sub of ["lists/partial", "archives/partial", "etc/sources.list.d", "etc/preferences.d"]
  ) {
    await Deno.mkdir(`${state}/${sub}`, { recursive: true });
  }
  await Deno.writeTextFile(
    `${state}/etc/sources.list`,
    `deb [signed-by=${keyring}] ${mirror} ${suite} main\n`,
  );
  await Deno.writeTextFile(`${state}/status`, "");
  const options = [
    `Dir::Etc::SourceList=${state}/etc/sources.list`,
    `Dir::Etc::SourceParts=${state}/etc/sources.list.d`,
    `Dir::Etc::Preferences=${state}/etc/preferences`,
    `Dir::Etc::PreferencesParts=${state}/etc/preferences.d`,
    `Dir::State::Lists=${state}/lists`,
    `Dir::State::Status=${state}/status`,
    `Dir::Cache=${state}`,
    `Dir::Cache::Archives=${state}/archives`,
    "APT::Architecture=amd64",
    "APT::Sandbox::User=root",
    "Acquire::Languages=none",
    "Debug::NoLocking=1",
  ].flatMap((option) => ["-o", option]);
  await run("apt-get", [...options, "-q", "update"]);
  const debs = `${dir}/debs`;
  await Deno.mkdir(debs, { recursive: true });
  const before = new Set(await list(debs));
  await run("apt-get", [...options, "-q", "download", "nats-server"], debs);
  const files = (await list(debs)).filter((name) => /^nats-server_.*\.deb$/.test(name));
  const fresh = files.find((name) => !before.has(name)) ?? files.sort().at(-1);
  if (!fresh) throw new Error(`apt-get download nats-server left no .deb in ${debs}`);
  const version = decodeURIComponent(fresh.split("_")[1]);
  const unpacked = `${dir}/${version}`;
  await Deno.remove(unpacked, { recursive: true }).catch(() => {});
  await run("dpkg-deb", ["-x", `${debs}/${fresh}`, unpacked]);
  const binary = `${unpacked}/usr/sbin/nats-server`;
  await Deno.stat(binary); // throws when the package layout changed
  const server = { suite, version, binary };
  for (const name of files) if (name !== fresh) await Deno.remove(`${debs}/${name}`);
  await Deno.writeTextFile(marker, JSON.stringify({ fetchedAt: Date.now(), server }));
  return server;
}

async function readCurrent(
  marker: string,
): Promise<{ fetchedAt: number; server: FetchedServer } | undefined> {
  try {
    const parsed = JSON.parse(await Deno.readTextFile(marker));
    await Deno.stat(parsed.server.binary);
    return parsed;
  } catch {
    return undefined;
  }
}

async function list(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names;
}

async function run(command: string, args: string[], cwd?: string): Promise<void> {
  const output = await new Deno.Command(command, { args, cwd, stdout: "piped", stderr: "piped" })
    .output();
  if (!output.success) {
    const text = new TextDecoder().decode(output.stderr) || new TextDecoder().decode(output.stdout);
    throw new Error(`${command} ${args.at(-1)} failed (${output.code}): ${text.trim()}`);
  }
}

if (import.meta.main) {
  const refresh = Deno.args.includes("--refresh");
  const pathOnly = Deno.args.includes("--path");
  const wanted = Deno.args.filter((arg) => !arg.startsWith("--"));
  if (wanted.length === 0) {
    console.error(
      `usage: deno run -A scripts/fetch_nats_server.ts [--refresh] [--path] <suite>...  (${
        Object.entries(suites).map(([s, v]) => `${s}: ${v}`).join(", ")
      })`,
    );
    Deno.exit(2);
  }
  try {
    for (const suite of wanted) {
      const server = await fetchNatsServer(suite, refresh);
      console.log(pathOnly ? server.binary : `${server.suite} ${server.version} ${server.binary}`);
    }
  } catch (error) {
    console.error(`fetch_nats_server: ${error instanceof Error ? error.message : error}`);
    Deno.exit(1);
  }
}
