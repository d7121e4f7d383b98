/**
 * Loopback ports for private servers.
 *
 * @module
 */

import { sleep } from "./process.ts";

/** A port that was free on 127.0.0.1 a moment ago. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
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
