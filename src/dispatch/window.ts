/**
 * The in-flight window: at most `size` deliveries run at once, shared by every batch a
 * dispatcher has claimed (so pipelined batches never exceed it together).
 *
 * @module
 */

/** A counting semaphore with FIFO hand-over. Internal. */
export class InFlightWindow {
  readonly size: number;
  #used = 0;
  #waiting: Array<() => void> = [];

  constructor(size: number) {
    this.size = size;
  }

  /** Resolves when a slot is held; release it with {@linkcode release}. */
  acquire(): Promise<void> | undefined {
    if (this.#used < this.size) {
      this.#used += 1;
      return undefined;
    }
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  /** Frees a slot, handing it straight to the longest waiter. */
  release(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else this.#used -= 1;
  }
}
