import type { Limiter, TakeResult } from '../store'
import type { Connection, Script } from './connection'

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

export interface LimiterCommands {
  lsTake(key: string, cap: number, rate: number, now: number, cost: number): Promise<[number, number, number]>
}

export const limiterScripts: { [name in keyof LimiterCommands]: Script } = {
  lsTake: { numberOfKeys: 1, lua: TAKE },
}

export class RedisLimiter implements Limiter {
  constructor(private readonly conn: Connection<LimiterCommands>) {}

  async take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost = 1): Promise<TakeResult> {
    this.conn.failFastWhenLost()
    const [ok, remaining, retryAfterMs] = await this.conn.redis.lsTake(key, capacity, refillPerSecond, nowMs, cost)
    return { ok: ok === 1, remaining, retryAfterMs }
  }
}
