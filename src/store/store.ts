/**
 * Shared, fast state: token buckets, nonces, cache-invalidation epochs. Two implementations with one
 * meaning: Redis (every instance shares it; each operation is one atomic Lua script) and an in-process
 * twin for a single embedded instance. Time is always passed in so tests control the clock.
 */
export interface Store {
  readonly kind: 'redis' | 'memory'
  /**
   * Token bucket of `capacity` tokens refilling continuously at `refillPerSecond`. Takes `cost`
   * tokens when available. `retryAfterMs` is how long until `cost` tokens are there again.
   */
  take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost?: number): Promise<TakeResult>
  /** Marks `key` used for `ttlSeconds`; false when it was already used. */
  claimOnce(key: string, ttlSeconds: number): Promise<boolean>
  /** Current epoch of each key (0 when never bumped). */
  epochs(keys: readonly string[]): Promise<number[]>
  /** Increments each key's epoch, so every instance's cache entry read under the old value is stale. */
  bump(keys: readonly string[]): Promise<void>
  ping(): Promise<boolean>
  close(): Promise<void>
}

export interface TakeResult {
  ok: boolean
  /** Tokens left after this call, rounded down. */
  remaining: number
  retryAfterMs: number
}

/** Key names, in one place so both implementations and every caller agree. */
export const keys = {
  appEpoch: (appId: string) => `ls:ep:app:${appId}`,
  licenseEpoch: (licenseKey: string) => `ls:ep:lic:${licenseKey}`,
  accountEpoch: (accountId: string) => `ls:ep:acct:${accountId}`,
  bucket: (scope: string, id: string) => `ls:rl:${scope}:${id}`,
  nonce: (appId: string, nonce: string) => `ls:nonce:${appId}:${nonce}`,
}
