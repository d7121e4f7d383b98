/**
 * A proxy over a store's handle (a SQL executor, a NATS KV handle, a memory repository) that
 * injects the partial failures a whole-process fault suite cannot produce, at one chosen call:
 *
 * - `fail`: the call throws before it reaches the store (nothing applied);
 * - `lost`: the call runs to completion, then throws (applied, reply lost);
 * - `pause`: the call waits until released, then runs (another actor overtakes its request);
 * - `hold`: the call runs, its reply waits until released (another actor overtakes the reply).
 *
 * A fault is armed for the next operation and counts the handle's calls from there: `at: 2` hits
 * the operation's second call. Calls the proxy does not count (watches, status) pass through.
 *
 * @module
 */

/** What happens at the chosen call. */
export type FaultKind = "fail" | "lost" | "pause" | "hold";

/** The error every injected fault throws. */
export class InjectedFaultError extends Error {
  constructor(readonly kind: "fail" | "lost", readonly method: string) {
    super(`injected ${kind === "fail" ? "failure before" : "lost reply after"} ${method}()`);
    this.name = "InjectedFaultError";
  }
}

interface Armed {
  kind: FaultKind;
  at: number;
  seen: number;
}

/** Controls one proxy: arm a fault, see whether it hit, release a pause. */
export class FaultController {
  #armed: Armed | undefined;
  #hit = false;
  #paused: { release: () => void; reached: Promise<void>; reach: () => void } | undefined;

  /** Arms `kind` at the `at`-th counted call from now (1 = the next one). */
  arm(kind: FaultKind, at: number): void {
    this.#armed = { kind, at, seen: 0 };
    this.#hit = false;
    if (kind === "pause" || kind === "hold") {
      let reach!: () => void;
      const reached = new Promise<void>((resolve) => reach = resolve);
      this.#paused = { release: () => {}, reached, reach };
    }
  }

  /** Whether the armed fault fired. */
  get hit(): boolean {
    return this.#hit;
  }

  /** Resolves when the armed pause is reached (never, if the operation makes fewer calls). */
  get reached(): Promise<void> {
    return this.#paused?.reached ?? new Promise(() => {});
  }

  /** Lets a paused call continue; disarms. */
  release(): void {
    const paused = this.#paused;
    this.#paused = undefined;
    this.#armed = undefined;
    paused?.release();
  }

  /** Disarms without releasing anything (after a fault fired or was not reached). */
  disarm(): void {
    this.#armed = undefined;
  }

  #wait(): Promise<void> {
    const paused = this.#paused!;
    const released = new Promise<void>((resolve) => paused.release = resolve);
    paused.reach();
    return released;
  }

  /** @internal Called by the proxy for every counted call. */
  async around<T>(method: string, call: () => Promise<T>): Promise<T> {
    const armed = this.#armed;
    if (!armed) return await call();
    armed.seen += 1;
    if (armed.seen !== armed.at) return await call();
    this.#hit = true;
    this.#armed = undefined;
    switch (armed.kind) {
      case "fail":
        throw new InjectedFaultError("fail", method);
      case "lost":
        await call();
        throw new InjectedFaultError("lost", method);
      case "pause": {
        await this.#wait();
        return await call();
      }
      case "hold": {
        const result = await call();
        await this.#wait();
        return result;
      }
    }
  }
}

/**
 * Wraps `target` so each call of a method named in `counted` goes through `controller`.
 * Other properties (and methods not counted) pass through, bound to the target.
 */
export function faultyHandle<T extends object>(
  target: T,
  counted: readonly string[],
  controller: FaultController,
): T {
  const names = new Set(counted);
  return new Proxy(target, {
    get(object, property) {
      const value = Reflect.get(object, property, object);
      if (typeof value !== "function") return value;
      if (typeof property !== "string" || !names.has(property)) return value.bind(object);
      return (...args: unknown[]) =>
        controller.around(property, () => Promise.resolve(value.apply(object, args)));
    },
  });
}
