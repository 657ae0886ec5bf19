import { errorFields, log } from '../lib/log'
import type { Store } from '../store/store'

const RETRY_MS = 500

/**
 * Bumps the store's epochs of entries whose data changed: every process's actors then find their copy
 * stale at its next use (the store script compares epochs on every client request), which is what keeps
 * the caches of several processes honest. Call it after the change committed. A store outage must not
 * turn a committed change into an error (a client would retry and duplicate it), so a failed bump is
 * logged and retried in the background until the store answers. While the store is down the client
 * endpoints read PostgreSQL directly or fail closed, so nothing stale is served in between.
 */
export class Invalidator {
  /** Epoch keys whose bump has not reached the store yet. */
  readonly #pending = new Set<string>()
  #timer: ReturnType<typeof setTimeout> | null = null

  constructor(private readonly store: Store) {}

  async bump(epochKeys: readonly string[]): Promise<void> {
    if (epochKeys.length === 0) return
    try {
      await this.store.bump(epochKeys)
    } catch (err) {
      log.warn('store unreachable: cache invalidation will be retried', { keys: epochKeys.length, ...errorFields(err) })
      for (const key of epochKeys) this.#pending.add(key)
      this.#scheduleRetry()
    }
  }

  #scheduleRetry(): void {
    if (this.#timer) return
    this.#timer = setTimeout(async () => {
      this.#timer = null
      const batch = [...this.#pending]
      try {
        await this.store.bump(batch)
        for (const key of batch) this.#pending.delete(key)
      } catch {
        this.#scheduleRetry()
      }
    }, RETRY_MS)
    this.#timer.unref?.()
  }
}
