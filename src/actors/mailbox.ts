const settled = (): undefined => undefined

/**
 * An actor's serial queue: `run(fn)` starts `fn` only after every earlier task settled, in the order
 * they were given (FIFO). A failing task rejects only its own caller. An idle mailbox holds no
 * promise, so a quiet actor keeps no chain alive.
 *
 * The order holds inside one process only; across processes the same invariants rest on SQL
 * conditions, row locks and the store's epochs (see the callers).
 */
export class Mailbox {
  #tail: Promise<unknown> | null = null

  run<T>(fn: () => Promise<T>): Promise<T> {
    // Always a later turn, even when idle: a caller may still be filling what `fn` will read.
    const result = (this.#tail ?? Promise.resolve()).then(fn, fn)
    const tail = result.then(settled, settled)
    this.#tail = tail
    void tail.then(() => {
      if (this.#tail === tail) this.#tail = null
    })
    return result
  }

  /** No task queued or running. */
  get idle(): boolean {
    return this.#tail === null
  }
}
