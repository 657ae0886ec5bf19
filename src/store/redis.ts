import Redis from 'ioredis'
import { log } from '../log'
import type { Store, TakeResult } from './store'

// The token-bucket rule of memory.ts, as one atomic script. Tokens are kept as text to keep fractions.
const TAKE = `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 1000
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(s[1]) or cap
local ts = tonumber(s[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
local ok = 0
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  ok = 1
else
  retry = math.ceil((cost - tokens) / rate)
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 1000)
return { ok, math.floor(tokens), retry }
`

const BUMP = `
for i = 1, #KEYS do redis.call('INCR', KEYS[i]) end
return #KEYS
`

type Commands = Redis & {
  lsTake(key: string, cap: number, rate: number, now: number, cost: number): Promise<[number, number, number]>
  lsBump(n: number, ...keys: string[]): Promise<number>
}

/** Options for tests: a short connect timeout and no retry storm against a stopped Redis. */
export interface RedisStoreOptions {
  connectTimeoutMs?: number
}

export class RedisStore implements Store {
  readonly kind = 'redis' as const
  readonly redis: Commands

  constructor(url: string, options: RedisStoreOptions = {}) {
    const redis = new Redis(url, {
      lazyConnect: false,
      enableAutoPipelining: true,
      connectTimeout: options.connectTimeoutMs ?? 2000,
      // Fail a command fast while Redis is down instead of queueing it for ever; reconnect in the background.
      maxRetriesPerRequest: 1,
      retryStrategy: (times) => Math.min(times * 200, 2000),
    })
    redis.on('error', (err: Error) => log.debug('redis connection error', { message: err.message }))
    redis.defineCommand('lsTake', { numberOfKeys: 1, lua: TAKE })
    redis.defineCommand('lsBump', { lua: BUMP })
    this.redis = redis as Commands
  }

  async take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost = 1): Promise<TakeResult> {
    const [ok, remaining, retryAfterMs] = await this.redis.lsTake(key, capacity, refillPerSecond, nowMs, cost)
    return { ok: ok === 1, remaining, retryAfterMs }
  }

  async claimOnce(key: string, ttlSeconds: number): Promise<boolean> {
    return (await this.redis.set(key, '1', 'EX', ttlSeconds, 'NX')) === 'OK'
  }

  async epochs(keys: readonly string[]): Promise<number[]> {
    if (keys.length === 0) return []
    const values = await this.redis.mget(...keys)
    return values.map((v) => (v === null ? 0 : Number(v)))
  }

  async bump(keys: readonly string[]): Promise<void> {
    if (keys.length > 0) await this.redis.lsBump(keys.length, ...keys)
  }

  async ping(): Promise<boolean> {
    try {
      return (await this.redis.ping()) === 'PONG'
    } catch {
      return false
    }
  }

  async close(): Promise<void> {
    this.redis.disconnect()
  }
}

export async function openStore(redisUrl: string | null): Promise<Store> {
  if (!redisUrl) {
    const { MemoryStore } = await import('./memory')
    log.info('REDIS_URL is not set: rate-limit, nonce and session state is kept in this process (one instance only)')
    return new MemoryStore()
  }
  return new RedisStore(redisUrl)
}
