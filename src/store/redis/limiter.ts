import { CLOCK_STEP_MS, type Limiter, type TakeResult } from '../store'
import type { Connection, Script } from './connection'

// The token-bucket rule of memory.ts (takeBucket), as one atomic script. Tokens are kept as text to keep fractions.
const TAKE = `
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 1000
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(s[1]) or cap
local ts = tonumber(s[2]) or now
if ts > now + cap / rate + ${CLOCK_STEP_MS} then
  ts = now
  tokens = math.max(tokens, 1)
end
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
local ok = 0
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  ok = 1
else
  retry = math.ceil((cost - tokens) / rate + math.max(0, ts - now))
end
-- The latest time any instance saw: one whose clock is behind must not move it back, or the next
-- take (on a clock ahead) would refill the skew's worth again.
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'ts', math.max(ts, now))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 1000)
return { ok, math.floor(tokens), retry }
`

export interface LimiterCommands {
  lsTake(key: string, cap: number, rate: number, now: number, cost: number): Promise<unknown>
}

/** The script's answer: whether the token was taken (1 or 0), the tokens left, the wait for the next. */
const isTakeReply = (reply: unknown): reply is [0 | 1, number, number] =>
  Array.isArray(reply) &&
  reply.length === 3 &&
  (reply[0] === 0 || reply[0] === 1) &&
  Number.isSafeInteger(reply[1]) &&
  reply[1] >= 0 &&
  Number.isSafeInteger(reply[2]) &&
  reply[2] >= 0

export const limiterScripts: { [name in keyof LimiterCommands]: Script } = {
  lsTake: { numberOfKeys: 1, lua: TAKE },
}

export class RedisLimiter implements Limiter {
  constructor(private readonly conn: Connection<LimiterCommands>) {}

  async take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost = 1): Promise<TakeResult> {
    this.conn.failFastWhenLost()
    const reply = await this.conn.redis.lsTake(key, capacity, refillPerSecond, nowMs, cost)
    // Any other answer (from a broken or impostor server) was read as "limited", with a wait of NaN in
    // the Retry-After header: it is the store failing, as an outage is, and the caller decides.
    if (!isTakeReply(reply)) throw new Error('unexpected limiter reply')
    const [ok, remaining, retryAfterMs] = reply
    return { ok: ok === 1, remaining, retryAfterMs }
  }
}
