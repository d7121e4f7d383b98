/**
 * Loopback ports for private servers.
 *
 * @module
 */

import { sleep } from "./process.ts";

/**
 * A port that was free on 127.0.0.1 a moment ago, picked at random BELOW the kernel's ephemeral
 * range: ports the kernel hands out (port 0 listeners, outgoing connections) are reused quickly
 * and another process could take a private server's port between a kill and its restart.
 */
export function freePort(): number {
  const [low] = ephemeralRange();
  const start = Math.max(1024, low - 12_000);
  const span = Math.max(1_000, low - start);
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = start + Math.floor(Math.random() * span);
    if (port < low && isPortFree(port)) return port;
  }
  throw new Error("no free loopback port found");
}

function ephemeralRange(): [number, number] {
  try {
    const [low, high] = Deno.readTextFileSync("/proc/sys/net/ipv4/ip_local_port_range")
      .trim().split(/\s+/).map(Number);
    if (low > 0 && high > low) return [low, high];
  } catch {
    // not Linux
  }
  return [32768, 60999];
}

/** Whether nothing listens on 127.0.0.1:`port`. */
export function isPortFree(port: number): boolean {
  try {
    const listener = Deno.listen({ hostname: "127.0.0.1", port });
    listener.close();
    return true;
  } catch {
    return false;
  }
}

/** Whether something accepts TCP connections on `host:port`. */
export async function isListening(host: string, port: number): Promise<boolean> {
  try {
    const conn = await Deno.connect({ hostname: host, port });
    conn.close();
    return true;
  } catch {
    return false;
  }
}

/** Waits until `port` is free again (after a server was killed). */
export async function waitForPortFree(port: number, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!isPortFree(port)) {
    if (Date.now() > deadline) throw new Error(`port ${port} still in use after ${timeoutMs} ms`);
    await sleep(25);
  }
}
