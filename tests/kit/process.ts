/**
 * Detached server processes for the test kit. Servers are started through `sh` and run on their
 * own (no child handle stays open), so Deno's resource and op sanitizers stay on in tests that
 * start, kill and restart them.
 *
 * @module
 */

/** A command to run detached. */
export interface DetachedCommand {
  /** Executable path. */
  command: string;
  /** Arguments. */
  args: string[];
  /** File receiving stdout and stderr. */
  logFile: string;
  /** Run as this user (via `runuser`, when the kit runs as root). */
  user?: string;
}

/** Quotes one word for `sh`. */
export function shellQuote(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/** Starts `command` detached from this process and returns its pid. */
export async function startDetached(spec: DetachedCommand): Promise<number> {
  const words = [spec.command, ...spec.args].map(shellQuote).join(" ");
  const run = spec.user ? `runuser -u ${shellQuote(spec.user)} -- ${words}` : words;
  const script = `${run} >>${shellQuote(spec.logFile)} 2>&1 </dev/null & echo $!`;
  const output = await new Deno.Command("setsid", {
    args: ["sh", "-c", script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(output.stdout).trim();
  const pid = Number(text);
  if (!output.success || !Number.isInteger(pid) || pid <= 0) {
    throw new Error(
      `could not start ${spec.command}: ${new TextDecoder().decode(output.stderr)}`,
    );
  }
  return pid;
}

/** Runs a command to completion and returns its stdout; throws with stderr on failure. */
export async function run(
  command: string,
  args: string[],
  options: { user?: string; env?: Record<string, string>; cwd?: string } = {},
): Promise<string> {
  const [cmd, argv] = options.user
    ? ["runuser", ["-u", options.user, "--", command, ...args]]
    : [command, args];
  const output = await new Deno.Command(cmd, {
    args: argv,
    env: options.env,
    cwd: options.cwd,
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const stdout = new TextDecoder().decode(output.stdout);
  if (!output.success) {
    const stderr = new TextDecoder().decode(output.stderr);
    throw new Error(`${command} ${args.join(" ")} failed (${output.code}): ${stderr || stdout}`);
  }
  return stdout;
}

/** Whether `pid` is a running (not zombie) process. */
export function isAlive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/** Sends `signal` to `pid`, ignoring a process that is already gone. */
export function signal(pid: number, sig: Deno.Signal): void {
  try {
    Deno.kill(pid, sig);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound) && isAlive(pid)) throw error;
  }
}

/** Waits until `pid` has exited. */
export async function waitForExit(pid: number, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (isAlive(pid)) {
    if (Date.now() > deadline) throw new Error(`process ${pid} did not exit in ${timeoutMs} ms`);
    await sleep(20);
  }
}

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Finds an executable `name` on PATH (skipped when `name` is empty) or at one of `candidates`. */
export function findExecutable(name: string, candidates: string[] = []): string | undefined {
  const path = name ? Deno.env.get("PATH") ?? "" : "";
  for (
    const dir of [...path.split(":").filter(Boolean).map((d) => `${d}/${name}`), ...candidates]
  ) {
    try {
      const info = Deno.statSync(dir);
      if (info.isFile && (info.mode ?? 0o111) & 0o111) return dir;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** Whether this process runs as root. */
export function isRoot(): boolean {
  return Deno.uid() === 0;
}

/**
 * The user private servers run as when the kit runs as root (Postgres and PgBouncer refuse
 * root): `postgres` when that user exists, else `nobody` (a fresh machine without a Postgres
 * package has no `postgres` user); `undefined` when not root.
 */
export function serviceUser(): string | undefined {
  if (!isRoot()) return undefined;
  try {
    const passwd = Deno.readTextFileSync("/etc/passwd");
    if (/^postgres:/m.test(passwd)) return "postgres";
  } catch {
    // no passwd file to read: try the usual name
    return "postgres";
  }
  return "nobody";
}
