/**
 * Callers asking for the same key while its work is under way share that work's promise, so a burst
 * of requests missing one cache entry makes one load, not one each.
 */
export class SingleFlight<T> {
  readonly #running = new Map<string, Promise<T>>()

  run(key: string, work: () => Promise<T>): Promise<T> {
    let running = this.#running.get(key)
    if (!running) {
      running = work().finally(() => this.#running.delete(key))
      this.#running.set(key, running)
    }
    return running
  }
}
