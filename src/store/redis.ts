import Redis from 'ioredis'
import { log } from '../log'
import { type AuthorizeInput, type AuthorizeResult, keys, type Store, type TakeResult } from './store'

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

// The public requests that arrived while the previous call was in flight, each checked in order
// (AuthorizeInput in store.ts documents the order of one request's checks; memory.ts mirrors it),
// answered as one array. One call per round trip instead of one per request saves a command, a Lua
// call and a share of the loopback writes and wake-ups each; under load a call carries 10 to 20.
// Every read happens in one MGET and a bucket is one number (GCRA: its theoretical arrival time, a
// token bucket in other words), because each redis.call costs the server about 2 µs. Arguments are
// what costs on the way in (measured per call: client CPU, Redis CPU): one JSON document of the whole
// input ~24 µs, 33 µs; one argument per field ~28, 32 (each argument costs the client ~0.3 µs); every
// number in one comma-separated argument that cjson reads as an array ~19, 33. So a request's first
// argument carries its numbers: now, epoch count, bucket count, ceiling? limit ttl, nonce? ttl, deny,
// charge? cost, counter? every (a flag is 1 or 0; absent parts are 0), then each epoch's expected
// value, then each bucket's capacity and refill per second. Its keys follow, one argument each: the
// epochs', the buckets', the ceiling's, the nonce's, then account, balance, pending, dirty set and
// counter of a charge (each only when present). The next request's numbers come right after.
const AUTHORIZE = `
local function one(b, h)
  local now, ne, nb = h[1], h[2], h[3]
  local p = b + 1 + ne + nb
  local ceil, nonce, ch, acct, bal_key, pend, dirty, ctr
  if h[4] == 1 then ceil = ARGV[p]; p = p + 1 end
  if h[7] == 1 then nonce = ARGV[p]; p = p + 1 end
  if h[10] == 1 then
    ch = true
    acct, bal_key, pend, dirty = ARGV[p], ARGV[p + 1], ARGV[p + 2], ARGV[p + 3]
    if h[12] == 1 then ctr = ARGV[p + 4] end
  end
  local ks = {}
  for i = 1, ne do ks[i] = ARGV[b + i] end
  local off = ne
  if ch then
    off = off + 1
    ks[off] = bal_key
  end
  for i = 1, nb do ks[off + i] = ARGV[b + ne + i] end
  local v = {}
  if #ks > 0 then v = redis.call('MGET', unpack(ks)) end
  local stale = false
  local cur = {}
  for i = 1, ne do
    cur[i] = tonumber(v[i]) or 0
    if cur[i] ~= h[13 + i] then stale = true end
  end
  if stale then return { 'stale', unpack(cur) } end
  local bal
  if ch then
    bal = tonumber(v[off])
    if not bal then return { 'no_balance' } end
  end
  if ceil then
    local n = redis.call('INCR', ceil)
    if n == 1 then redis.call('EXPIRE', ceil, h[6]) end
    if n > h[5] then return { 'quota' } end
  end
  if nb > 0 then
    local tats = {}
    local short = 0
    for i = 1, nb do
      local j = 12 + ne + 2 * i
      local t = 1000 / h[j + 1]
      tats[i] = math.max(tonumber(v[off + i]) or now, now) + t
      local over = tats[i] - now - h[j] * t
      if over > 1e-6 then short = math.max(short, math.ceil(over)) end
    end
    if short > 0 then return { 'limited', short } end
    for i = 1, nb do
      redis.call('SET', ARGV[b + ne + i], string.format('%.17g', tats[i]), 'PX', math.ceil(tats[i] - now) + 1000)
    end
  end
  if nonce then
    if not redis.call('SET', nonce, '1', 'NX', 'EX', h[8]) then return { 'replay' } end
  end
  if h[9] == 1 then return { 'denied' } end
  if not ch then return { 'ok', 0 } end
  local cost = h[11]
  if ctr then
    local n = redis.call('INCR', ctr)
    if n % h[13] ~= 0 then cost = 0 end
  end
  if cost > 0 then
    if bal < cost then
      if ctr then redis.call('DECR', ctr) end
      return { 'no_credits' }
    end
    redis.call('DECRBY', bal_key, cost)
    if redis.call('INCRBY', pend, cost) == cost then redis.call('SADD', dirty, acct) end
  end
  return { 'ok', cost }
end

local out = {}
local b = 1
while b <= #ARGV do
  local h = cjson.decode('[' .. ARGV[b] .. ']')
  out[#out + 1] = one(b, h)
  local size = 1 + h[2] + h[3] + h[4] + h[7]
  if h[10] == 1 then size = size + 4 + h[12] end
  b = b + size
end
return out
`

/**
 * Appends one request's AUTHORIZE arguments to `args`; numbers go as their shortest round-trip text,
 * which cjson reads back exactly.
 */
function pushAuthorizeArgs(args: string[], a: AuthorizeInput): void {
  const { ceiling, nonce, charge } = a
  const counter = charge?.counter
  let numbers =
    `${a.nowMs},${a.epochs.length},${a.buckets.length},` +
    `${ceiling ? `1,${ceiling.limit},${ceiling.ttlSeconds}` : '0,0,0'},${nonce ? `1,${nonce.ttlSeconds}` : '0,0'},` +
    `${a.deny ? 1 : 0},${charge ? `1,${charge.cost}` : '0,0'},${counter ? `1,${counter.every}` : '0,0'}`
  const at = args.push('') - 1
  for (const e of a.epochs) {
    numbers += `,${e.expected}`
    args.push(e.key)
  }
  for (const b of a.buckets) {
    numbers += `,${b.capacity},${b.refillPerSecond}`
    args.push(b.key)
  }
  args[at] = numbers
  if (ceiling) args.push(ceiling.key)
  if (nonce) args.push(nonce.key)
  if (charge) {
    args.push(charge.accountId, keys.balance(charge.accountId), keys.pendingCharges(charge.accountId), keys.dirtyAccounts)
    if (counter) args.push(counter.key)
  }
}

function authorizeResult(reply: (string | number)[]): AuthorizeResult {
  switch (reply[0]) {
    case 'ok':
      return { kind: 'ok', charged: Number(reply[1]) }
    case 'stale':
      return { kind: 'stale', epochs: reply.slice(1).map(Number) }
    case 'limited':
      return { kind: 'limited', retryAfterMs: Number(reply[1]) }
    case 'no_balance':
    case 'quota':
    case 'replay':
    case 'denied':
    case 'no_credits':
      return { kind: reply[0] }
    default:
      throw new Error(`unexpected authorize reply ${String(reply[0])}`)
  }
}

interface PendingAuthorize {
  input: AuthorizeInput
  resolve(result: AuthorizeResult): void
  reject(err: unknown): void
}

// KEYS: balance, pending, flushing, account epoch. ARGV: expected epoch, reconciled balance.
const LOAD_BALANCE = `
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
local f = redis.call('GET', KEYS[3])
local inflight = 0
if f then inflight = tonumber(string.match(f, ':(-?%d+)$')) end
local live = tonumber(ARGV[2]) - tonumber(redis.call('GET', KEYS[2]) or '0') - inflight
redis.call('SET', KEYS[1], math.max(0, live))
return 1
`

// KEYS: balance, account epoch. ARGV: n.
const CREDITS_ADDED = `
redis.call('INCR', KEYS[2])
local live = redis.call('GET', KEYS[1])
if live then redis.call('SET', KEYS[1], math.max(0, tonumber(live) + tonumber(ARGV[1]))) end
return 1
`

// KEYS: balance, pending, dirty set. ARGV: account, n.
const REFUND = `
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], ARGV[2]) end
redis.call('DECRBY', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
`

// KEYS: pending, flushing. ARGV: new flush id.
const BEGIN_FLUSH = `
local f = redis.call('GET', KEYS[2])
if f then return f end
local p = tonumber(redis.call('GET', KEYS[1]) or '0')
if p == 0 then return false end
redis.call('DECRBY', KEYS[1], p)
local record = ARGV[1] .. ':' .. p
redis.call('SET', KEYS[2], record)
return record
`

// KEYS: flushing, pending, dirty set. ARGV: flush id, account.
const END_FLUSH = `
local f = redis.call('GET', KEYS[1])
if f and string.sub(f, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then redis.call('DEL', KEYS[1]) end
if tonumber(redis.call('GET', KEYS[2]) or '0') == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return 1
`

type Commands = Redis & {
  lsAuthorize(...args: string[]): Promise<(string | number)[][]>
  lsLoadBalance(bal: string, pend: string, fl: string, ep: string, expected: number, reconciled: number): Promise<number>
  lsCreditsAdded(bal: string, ep: string, n: number): Promise<number>
  lsRefund(bal: string, pend: string, dirty: string, account: string, n: number): Promise<number>
  lsBeginFlush(pend: string, fl: string, id: string): Promise<string | null>
  lsEndFlush(fl: string, pend: string, dirty: string, id: string, account: string): Promise<number>
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
  #authorizeQueue: PendingAuthorize[] = []
  /** One authorize call at a time: the requests that arrive meanwhile ride together on the next. */
  #authorizeInFlight = false

  constructor(url: string, options: RedisStoreOptions = {}) {
    const redis = new Redis(url, {
      lazyConnect: false,
      enableAutoPipelining: true,
      // Already one call per round trip; auto-pipelining would hold it for a setImmediate.
      autoPipeliningIgnoredCommands: ['lsAuthorize'],
      connectTimeout: options.connectTimeoutMs ?? 2000,
      // Fail a command fast while Redis is down instead of queueing it for ever; reconnect in the background.
      maxRetriesPerRequest: 1,
      retryStrategy: (times) => Math.min(times * 200, 2000),
    })
    redis.on('error', (err: Error) => log.debug('redis connection error', { message: err.message }))
    // defineCommand sends EVALSHA and falls back to EVAL once after a Redis restart (NOSCRIPT).
    redis.defineCommand('lsAuthorize', { numberOfKeys: 0, lua: AUTHORIZE })
    redis.defineCommand('lsTake', { numberOfKeys: 1, lua: TAKE })
    redis.defineCommand('lsBump', { lua: BUMP })
    redis.defineCommand('lsLoadBalance', { numberOfKeys: 4, lua: LOAD_BALANCE })
    redis.defineCommand('lsCreditsAdded', { numberOfKeys: 2, lua: CREDITS_ADDED })
    redis.defineCommand('lsRefund', { numberOfKeys: 3, lua: REFUND })
    redis.defineCommand('lsBeginFlush', { numberOfKeys: 2, lua: BEGIN_FLUSH })
    redis.defineCommand('lsEndFlush', { numberOfKeys: 3, lua: END_FLUSH })
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
    this.#failFastWhenLost()
    const values = await this.redis.mget(...keys)
    return values.map((v) => (v === null ? 0 : Number(v)))
  }

  async bump(keys: readonly string[]): Promise<void> {
    if (keys.length > 0) await this.redis.lsBump(keys.length, ...keys)
  }

  /**
   * While a lost connection is being re-established, the hot path fails at once instead of waiting
   * for a reconnect attempt (the caller fails open or closed). Before the first connect, commands queue.
   */
  #failFastWhenLost(): void {
    if (this.redis.status === 'reconnecting' || this.redis.status === 'close') {
      throw new Error(`redis connection ${this.redis.status}`)
    }
  }

  authorize(input: AuthorizeInput): Promise<AuthorizeResult> {
    try {
      this.#failFastWhenLost()
    } catch (err) {
      return Promise.reject(err)
    }
    return new Promise((resolve, reject) => {
      // The first request after a quiet spell goes at once (a microtask: Bun runs setImmediate late
      // enough to leave the CPU idle); later ones wait for the call in flight to come back.
      if (this.#authorizeQueue.push({ input, resolve, reject }) === 1 && !this.#authorizeInFlight) {
        queueMicrotask(this.#sendAuthorize)
      }
    })
  }

  readonly #sendAuthorize = (): void => {
    const batch = this.#authorizeQueue
    if (batch.length === 0 || this.#authorizeInFlight) return
    this.#authorizeQueue = []
    this.#authorizeInFlight = true
    const args: string[] = []
    for (const p of batch) pushAuthorizeArgs(args, p.input)
    const settle = (replies: (string | number)[][] | null, err: unknown) => {
      this.#authorizeInFlight = false
      // What queued meanwhile goes out before this batch's requests go on, so Redis works alongside them.
      this.#sendAuthorize()
      for (let i = 0; i < batch.length; i++) {
        const p = batch[i] as PendingAuthorize
        if (!replies) {
          p.reject(err)
          continue
        }
        try {
          p.resolve(authorizeResult(replies[i] as (string | number)[]))
        } catch (e) {
          p.reject(e)
        }
      }
    }
    this.redis.lsAuthorize(...args).then(
      (replies) => settle(replies, null),
      (err: unknown) => settle(null, err),
    )
  }

  async loadBalance(accountId: string, expectedEpoch: number, reconciled: number): Promise<'ok' | 'stale'> {
    const done = await this.redis.lsLoadBalance(
      keys.balance(accountId),
      keys.pendingCharges(accountId),
      keys.flushing(accountId),
      keys.accountEpoch(accountId),
      expectedEpoch,
      reconciled,
    )
    return done === 1 ? 'ok' : 'stale'
  }

  async balance(accountId: string): Promise<number | null> {
    const v = await this.redis.get(keys.balance(accountId))
    return v === null ? null : Number(v)
  }

  async creditsAdded(accountId: string, n: number): Promise<void> {
    await this.redis.lsCreditsAdded(keys.balance(accountId), keys.accountEpoch(accountId), n)
  }

  async refund(accountId: string, n: number): Promise<void> {
    await this.redis.lsRefund(
      keys.balance(accountId),
      keys.pendingCharges(accountId),
      keys.dirtyAccounts,
      accountId,
      n,
    )
  }

  async dirtyAccounts(): Promise<string[]> {
    return this.redis.smembers(keys.dirtyAccounts)
  }

  async beginFlush(accountId: string, newId: string): Promise<{ id: string; amount: number } | null> {
    const record = await this.redis.lsBeginFlush(keys.pendingCharges(accountId), keys.flushing(accountId), newId)
    if (!record) return null
    const cut = record.lastIndexOf(':')
    return { id: record.slice(0, cut), amount: Number(record.slice(cut + 1)) }
  }

  async endFlush(accountId: string, id: string): Promise<void> {
    await this.redis.lsEndFlush(
      keys.flushing(accountId),
      keys.pendingCharges(accountId),
      keys.dirtyAccounts,
      id,
      accountId,
    )
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
