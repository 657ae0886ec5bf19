import type { Deps } from '../deps'
import { errorFields, log } from '../log'

const RETRY_MS = 500

/** Epoch keys whose bump has not reached the store yet, per Deps, with the timer retrying them. */
const pending = new WeakMap<Deps, { keys: Set<string>; timer: ReturnType<typeof setTimeout> | null }>()

/**
 * Tells every instance's cache that these entries changed: call it after the change committed. A
 * store outage must not turn a committed change into an error (a client would retry and duplicate
 * it), so a failed bump is logged and retried in the background until the store answers. While the
 * store is down the client endpoints read PostgreSQL directly or fail closed, so nothing stale is
 * served in between.
 */
export async function invalidate(deps: Deps, epochKeys: readonly string[]): Promise<void> {
  if (epochKeys.length === 0) return
  try {
    await deps.store.bump(epochKeys)
  } catch (err) {
    log.warn('store unreachable: cache invalidation will be retried', { keys: epochKeys.length, ...errorFields(err) })
    const state = pending.get(deps) ?? { keys: new Set<string>(), timer: null }
    pending.set(deps, state)
    for (const key of epochKeys) state.keys.add(key)
    scheduleRetry(deps, state)
  }
}

function scheduleRetry(deps: Deps, state: { keys: Set<string>; timer: ReturnType<typeof setTimeout> | null }): void {
  if (state.timer) return
  state.timer = setTimeout(async () => {
    state.timer = null
    const batch = [...state.keys]
    try {
      await deps.store.bump(batch)
      for (const key of batch) state.keys.delete(key)
    } catch {
      scheduleRetry(deps, state)
    }
  }, RETRY_MS)
  state.timer.unref?.()
}
