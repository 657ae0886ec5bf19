/**
 * Per-key serial queues: `run(key, fn)` starts `fn` only after every earlier task of that key settled.
 * Order inside one process; SQL conditions and row locks keep the same invariants across processes.
 * A failing task rejects only its own caller; idle keys are dropped so the map stays small.
 */
export class Mailbox {
  readonly #tails = new Map<string, Promise<unknown>>()

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.#tails.get(key) ?? Promise.resolve()
    const result = previous.then(fn, fn)
    const tail = result.then(
      () => undefined,
      () => undefined,
    )
    this.#tails.set(key, tail)
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key)
    })
    return result
  }

  /** Keys with queued or running work (for tests and metrics). */
  get size(): number {
    return this.#tails.size
  }
}
