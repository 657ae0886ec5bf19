import type { Store, TakeResult } from './store'

interface Entry {
  value: unknown
  /** Expiry in ms since the epoch; Infinity when the key never expires. */
  expiresAt: number
}

/**
 * The in-process twin of the Redis store. Every method runs synchronously to completion inside one
 * call, which gives it the same atomicity a Lua script has in Redis. One instance only.
 */
export class MemoryStore implements Store {
  readonly kind = 'memory' as const
  readonly #data = new Map<string, Entry>()
  #sweepAt = 0

  constructor(private readonly clock: () => number = Date.now) {}

  protected get(key: string, now = this.clock()): unknown {
    const entry = this.#data.get(key)
    if (!entry) return undefined
    if (entry.expiresAt <= now) {
      this.#data.delete(key)
      return undefined
    }
    return entry.value
  }

  protected set(key: string, value: unknown, ttlMs = Infinity, now = this.clock()): void {
    this.#data.set(key, { value, expiresAt: now + ttlMs })
    this.#sweep(now)
  }

  protected delete(key: string): void {
    this.#data.delete(key)
  }

  // Expired keys are dropped lazily on read and by a sweep at most once a minute, so memory stays bounded.
  #sweep(now: number): void {
    if (now < this.#sweepAt) return
    this.#sweepAt = now + 60_000
    for (const [key, entry] of this.#data) if (entry.expiresAt <= now) this.#data.delete(key)
  }

  async take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost = 1): Promise<TakeResult> {
    return takeBucket(this, key, capacity, refillPerSecond, nowMs, cost)
  }

  /** Bucket state access for takeBucket; the same state the Redis hash holds. */
  bucketState(key: string, nowMs: number): { tokens: number; ts: number } | undefined {
    return this.get(key, nowMs) as { tokens: number; ts: number } | undefined
  }

  setBucketState(key: string, state: { tokens: number; ts: number }, ttlMs: number, nowMs: number): void {
    this.set(key, state, ttlMs, nowMs)
  }

  async claimOnce(key: string, ttlSeconds: number): Promise<boolean> {
    if (this.get(key) !== undefined) return false
    this.set(key, 1, ttlSeconds * 1000)
    return true
  }

  async epochs(keys: readonly string[]): Promise<number[]> {
    return keys.map((k) => (this.get(k) as number | undefined) ?? 0)
  }

  async bump(keys: readonly string[]): Promise<void> {
    for (const k of keys) this.set(k, ((this.get(k) as number | undefined) ?? 0) + 1)
  }

  async ping(): Promise<boolean> {
    return true
  }

  async close(): Promise<void> {
    this.#data.clear()
  }
}

/** The token-bucket rule, written once for the twin; the Lua script in redis.ts mirrors it line by line. */
function takeBucket(
  store: MemoryStore,
  key: string,
  capacity: number,
  refillPerSecond: number,
  now: number,
  cost: number,
): TakeResult {
  const ratePerMs = refillPerSecond / 1000
  const state = store.bucketState(key, now)
  let tokens = state ? state.tokens : capacity
  const ts = state ? state.ts : now
  tokens = Math.min(capacity, tokens + Math.max(0, now - ts) * ratePerMs)
  let ok = false
  let retryAfterMs = 0
  if (tokens >= cost) {
    tokens -= cost
    ok = true
  } else {
    retryAfterMs = Math.ceil((cost - tokens) / ratePerMs)
  }
  store.setBucketState(key, { tokens, ts: now }, Math.ceil(capacity / ratePerMs) + 1000, now)
  return { ok, remaining: Math.floor(tokens), retryAfterMs }
}
