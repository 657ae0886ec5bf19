import type { Context } from '../context'
import { errorFields, log } from '../lib/log'

const RETRY_MS = 500

/** Epoch keys whose bump has not reached the store yet, per Context, with the timer retrying them. */
const pending = new WeakMap<Context, { keys: Set<string>; timer: ReturnType<typeof setTimeout> | null }>()

/**
 * Tells every instance's cache that these entries changed: call it after the change committed. A
 * store outage must not turn a committed change into an error (a client would retry and duplicate
 * it), so a failed bump is logged and retried in the background until the store answers. While the
 * store is down the client endpoints read PostgreSQL directly or fail closed, so nothing stale is
 * served in between.
 */
export async function invalidate(ctx: Context, epochKeys: readonly string[]): Promise<void> {
  if (epochKeys.length === 0) return
  try {
    await ctx.store.bump(epochKeys)
  } catch (err) {
    log.warn('store unreachable: cache invalidation will be retried', { keys: epochKeys.length, ...errorFields(err) })
    const state = pending.get(ctx) ?? { keys: new Set<string>(), timer: null }
    pending.set(ctx, state)
    for (const key of epochKeys) state.keys.add(key)
    scheduleRetry(ctx, state)
  }
}

function scheduleRetry(ctx: Context, state: { keys: Set<string>; timer: ReturnType<typeof setTimeout> | null }): void {
  if (state.timer) return
  state.timer = setTimeout(async () => {
    state.timer = null
    const batch = [...state.keys]
    try {
      await ctx.store.bump(batch)
      for (const key of batch) state.keys.delete(key)
    } catch {
      scheduleRetry(ctx, state)
    }
  }, RETRY_MS)
  state.timer.unref?.()
}
