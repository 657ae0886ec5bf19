/** At most `limit` pieces of work of one key under way at a time in this process; past it, none waits. */
export class InFlightLimit {
  readonly #running = new Map<string, number>()

  constructor(readonly limit: number) {}

  /** Counts one more of `key` under way and returns what ends it; null, counting nothing, when `key` is at the limit. */
  enter(key: string): (() => void) | null {
    const running = this.#running.get(key) ?? 0
    if (running >= this.limit) return null
    this.#running.set(key, running + 1)
    let left = false
    return () => {
      if (left) return
      left = true
      const now = (this.#running.get(key) ?? 1) - 1
      if (now === 0) this.#running.delete(key)
      else this.#running.set(key, now)
    }
  }
}
