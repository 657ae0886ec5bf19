import { randomUUID } from 'node:crypto'
import Redis from 'ioredis'
import { errorFields, log } from '../lib/log'
import {
  type Admission,
  type AuthorizeInput,
  type AuthorizeResult,
  type CreditState,
  keys,
  type Snapshot,
  type Store,
  type TakeResult,
} from './store'

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
// The script works on the batch, not on each request: every key is read once by one MGET, each
// request sees the changes of those before it in a Lua table, and each bucket or balance is written
// once at the end, so the ones many requests share (the caller's IP, the account) cost one write per
// call; nonces, counters and ceilings are written as each request goes. First of all the script checks
// the store generation (ARGV[2], the ls:gen value this process read its epochs under; ARGV[3] is
// written when the key is missing): on any other value it answers -1 and the current value and runs
// nothing, since epochs that restarted after a data loss would make old cache entries look fresh.
// The call's main argument (ARGV[1], AuthorizeArgs.packed) holds each distinct key once, then every number of the batch as a
// little-endian double (struct.unpack reads it exactly, ~1 µs a request against ~3.5 for cjson, and
// one argument spares ioredis its per-argument work). A request's numbers are
// their count, then now, epoch count, bucket count, deny, the ceiling's key, limit and ttl, the
// nonce's key and ttl, the charge's account, balance, pending and dirty-set keys and cost, the
// counter's key and period (a key is its position among the keys, 0 when absent), then each epoch's
// key and expected value and each bucket's key, capacity and refill per second.
const AUTHORIZE = `
local gen = redis.call('GET', '${keys.generation}')
if not gen then
  gen = ARGV[3]
  redis.call('SET', '${keys.generation}', gen)
end
if gen ~= ARGV[2] then return { -1, gen } end
local packed = ARGV[1]
local key_count, pos = struct.unpack('<I4', packed, 1)
local names = {}
for i = 1, key_count do names[i], pos = struct.unpack('<Hc0', packed, pos) end
local reqs = {}
local formats = {}
while pos <= #packed do
  local count = struct.unpack('<d', packed, pos)
  local format = formats[count]
  if not format then
    format = '<' .. string.rep('d', count)
    formats[count] = format
  end
  local h = { struct.unpack(format, packed, pos + 8) }
  pos = h[count + 1]
  reqs[#reqs + 1] = h
end
local val = {}
local bucket_px = {}
local spent = {}
local charged_by = {}

local reads, seen = {}, {}
local function read(i)
  if i > 0 and not seen[i] then
    seen[i] = true
    reads[#reads + 1] = i
  end
end
for _, h in ipairs(reqs) do
  read(h[11])
  local p = 17
  for _ = 1, h[2] do read(h[p]); p = p + 2 end
  for _ = 1, h[3] do read(h[p]); p = p + 3 end
end
-- unpack has a stack limit: a large batch reads in slices.
for from = 1, #reads, 500 do
  local slice = {}
  for i = from, math.min(from + 499, #reads) do slice[#slice + 1] = names[reads[i]] end
  local v = redis.call('MGET', unpack(slice))
  for i = 1, #slice do val[reads[from + i - 1]] = tonumber(v[i]) end
end

-- One request's answer, appended to out as integers: 0 and the amount charged (ok), 1, the epoch
-- count and the current epochs (stale), 2 and the wait in ms (limited), or one code of 3 no_balance,
-- 4 quota, 5 replay, 6 denied, 7 no_credits.
local out = {}
local function put(x) out[#out + 1] = x end
local function one(h)
  local now, ne, nb = h[1], h[2], h[3]
  local b = 17 + 2 * ne
  local stale = false
  for i = 17, b - 1, 2 do
    if (val[h[i]] or 0) ~= h[i + 1] then stale = true end
  end
  if stale then
    put(1)
    put(ne)
    for i = 17, b - 1, 2 do put(val[h[i]] or 0) end
    return
  end
  local bal = h[11]
  if bal > 0 and not val[bal] then return put(3) end
  local ceil = h[5]
  if ceil > 0 then
    local count = redis.call('INCR', names[ceil])
    if count == 1 then redis.call('EXPIRE', names[ceil], h[7]) end
    if count > h[6] then return put(4) end
  end
  if nb > 0 then
    local tats = {}
    local short = 0
    for j = b, b + 3 * nb - 1, 3 do
      local t = 1000 / h[j + 2]
      local tat = math.max(val[h[j]] or now, now) + t
      tats[j] = tat
      local over = tat - now - h[j + 1] * t
      if over > 1e-6 then short = math.max(short, math.ceil(over)) end
    end
    if short > 0 then
      put(2)
      return put(short)
    end
    for j = b, b + 3 * nb - 1, 3 do
      val[h[j]] = tats[j]
      bucket_px[h[j]] = math.ceil(tats[j] - now) + 1000
    end
  end
  local nonce = h[8]
  if nonce > 0 and not redis.call('SET', names[nonce], '1', 'NX', 'EX', h[9]) then return put(5) end
  if h[4] == 1 then return put(6) end
  local cost = 0
  if bal > 0 then
    cost = h[14]
    local ctr = h[15]
    if ctr > 0 and redis.call('INCR', names[ctr]) % h[16] ~= 0 then cost = 0 end
    if cost > 0 then
      if val[bal] < cost then
        if ctr > 0 then redis.call('DECR', names[ctr]) end
        return put(7)
      end
      val[bal] = val[bal] - cost
      spent[bal] = (spent[bal] or 0) + cost
      charged_by[bal] = h
    end
  end
  put(0)
  put(cost)
end

for _, h in ipairs(reqs) do one(h) end
for k, px in pairs(bucket_px) do
  redis.call('SET', names[k], val[k], 'PX', px)
end
for bal, amount in pairs(spent) do
  local h = charged_by[bal]
  redis.call('DECRBY', names[bal], amount)
  if redis.call('INCRBY', names[h[12]], amount) == amount then redis.call('SADD', names[h[13]], names[h[10]]) end
end
return out
`

/** One AUTHORIZE call's single argument: each distinct key once, then the numbers of every request. */
class AuthorizeArgs {
  readonly #keys: string[] = []
  readonly #positions = new Map<string, number>()
  readonly #numbers: number[] = []

  /** The key's position among the keys (1-based), sending it only the first time. */
  #key(name: string): number {
    let at = this.#positions.get(name)
    if (at === undefined) {
      at = this.#keys.push(name)
      this.#positions.set(name, at)
    }
    return at
  }

  add(a: AuthorizeInput): void {
    const { ceiling, nonce, charge } = a
    const counter = charge?.counter
    const n = this.#numbers
    const countAt = n.push(0) - 1
    n.push(a.nowMs, a.epochs.length, a.buckets.length, a.deny ? 1 : 0)
    if (ceiling) n.push(this.#key(ceiling.key), ceiling.limit, ceiling.ttlSeconds)
    else n.push(0, 0, 0)
    if (nonce) n.push(this.#key(nonce.key), nonce.ttlSeconds)
    else n.push(0, 0)
    if (charge) {
      const { accountId } = charge
      n.push(
        this.#key(accountId),
        this.#key(keys.balance(accountId)),
        this.#key(keys.pendingCharges(accountId)),
        this.#key(keys.dirtyAccounts),
        charge.cost,
      )
    } else n.push(0, 0, 0, 0, 0)
    if (counter) n.push(this.#key(counter.key), counter.every)
    else n.push(0, 0)
    for (const e of a.epochs) n.push(this.#key(e.key), e.expected)
    for (const b of a.buckets) n.push(this.#key(b.key), b.capacity, b.refillPerSecond)
    n[countAt] = n.length - countAt - 1
  }

  /**
   * The key count (uint32), each key as its UTF-8 length (uint16; keys are far shorter) and bytes, then
   * every number as a double, all little-endian: one Buffer, because ioredis spends ~0.5 µs on each
   * argument of a call, and a call carries 3 to 9 keys a request.
   */
  packed(): Buffer {
    let size = 4 + this.#numbers.length * 8
    // A UTF-16 code unit is at most 3 bytes of UTF-8.
    for (const k of this.#keys) size += 2 + k.length * 3
    const out = Buffer.allocUnsafe(size)
    out.writeUInt32LE(this.#keys.length, 0)
    let at = 4
    for (const k of this.#keys) {
      const length = out.write(k, at + 2)
      out.writeUInt16LE(length, at)
      at += 2 + length
    }
    for (const n of this.#numbers) at = out.writeDoubleLE(n, at)
    return out.subarray(0, at)
  }
}

const REFUSALS = [undefined, undefined, undefined, 'no_balance', 'quota', 'replay', 'denied', 'no_credits'] as const

/** Reads one request's answer from the script's integers at `at`; returns it and where the next starts. */
function authorizeResult(flat: number[], at: number): [AuthorizeResult, number] {
  const code = flat[at] as number
  switch (code) {
    case 0:
      return [{ kind: 'ok', charged: flat[at + 1] as number }, at + 2]
    case 1: {
      const count = flat[at + 1] as number
      return [{ kind: 'stale', epochs: flat.slice(at + 2, at + 2 + count) }, at + 2 + count]
    }
    case 2:
      return [{ kind: 'limited', retryAfterMs: flat[at + 1] as number }, at + 2]
    default: {
      const kind = REFUSALS[code]
      if (kind === undefined) throw new Error(`unexpected authorize reply ${String(code)}`)
      return [{ kind }, at + 1]
    }
  }
}

interface PendingAuthorize {
  input: AuthorizeInput
  resolve(result: AuthorizeResult): void
  reject(err: unknown): void
}

// KEYS: balance, pending, flushing, account epoch. ARGV: expected epoch, expected flush id ('' for
// none), '1' when PostgreSQL already has that flush, reconciled balance.
const LOAD_BALANCE = `
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
local id, inflight = '', 0
local f = redis.call('GET', KEYS[3])
if f then id, inflight = string.match(f, '^(.*):(-?%d+)$') end
if id ~= ARGV[2] then return 0 end
if ARGV[3] == '1' then inflight = 0 end
local live = tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[2]) or '0') - tonumber(inflight)
redis.call('SET', KEYS[1], math.max(0, live))
return 1
`

// KEYS: the generation key, the epoch keys, then the admission bucket when ARGV[2] is given. ARGV: a
// fresh generation id (written when the key is missing), then the bucket's now, capacity and refill per
// second. Answers the generation, the wait in ms (0: admitted) and, when admitted, each epoch.
const SNAPSHOT = `
local gen = redis.call('GET', KEYS[1])
if not gen then
  gen = ARGV[1]
  redis.call('SET', KEYS[1], gen)
end
local last = #KEYS
if ARGV[2] then
  local now, t = tonumber(ARGV[2]), 1000 / tonumber(ARGV[4])
  local tat = math.max(tonumber(redis.call('GET', KEYS[last])) or now, now) + t
  local over = tat - now - tonumber(ARGV[3]) * t
  if over > 1e-6 then return { gen, math.ceil(over) } end
  redis.call('SET', KEYS[last], tat, 'PX', math.ceil(tat - now) + 1000)
  last = last - 1
end
local out = { gen, 0 }
for i = 2, last do out[#out + 1] = tonumber(redis.call('GET', KEYS[i]) or '0') end
return out
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
  lsAuthorize(packed: Buffer, generation: string, fresh: string): Promise<number[] | [-1, string]>
  lsSnapshot(n: number, ...keysAndArgs: (string | number)[]): Promise<[string, number, ...number[]]>
  lsLoadBalance(
    bal: string,
    pend: string,
    fl: string,
    ep: string,
    expectedEpoch: number,
    expectedFlush: string,
    committed: '0' | '1',
    reconciled: number,
  ): Promise<number>
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
  /** Snapshot.generation: this process's name for the store contents its callers' epochs were read from. */
  #generation = 1
  /** The ls:gen value read under #generation; null until one is read on the current connection. */
  #storeGeneration: string | null = null

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
    redis.on('error', (err: Error) => log.debug('redis connection error', errorFields(err)))
    // A new connection may reach a server that restarted with older data or a replica that lost writes
    // while keeping ls:gen: whatever was read before it is suspect.
    redis.on('close', () => {
      this.#generation++
      this.#storeGeneration = null
    })
    // defineCommand sends EVALSHA and falls back to EVAL once after a Redis restart (NOSCRIPT).
    redis.defineCommand('lsAuthorize', { numberOfKeys: 0, lua: AUTHORIZE })
    redis.defineCommand('lsTake', { numberOfKeys: 1, lua: TAKE })
    redis.defineCommand('lsBump', { lua: BUMP })
    redis.defineCommand('lsSnapshot', { lua: SNAPSHOT })
    redis.defineCommand('lsLoadBalance', { numberOfKeys: 4, lua: LOAD_BALANCE })
    redis.defineCommand('lsCreditsAdded', { numberOfKeys: 2, lua: CREDITS_ADDED })
    redis.defineCommand('lsRefund', { numberOfKeys: 3, lua: REFUND })
    redis.defineCommand('lsBeginFlush', { numberOfKeys: 2, lua: BEGIN_FLUSH })
    redis.defineCommand('lsEndFlush', { numberOfKeys: 3, lua: END_FLUSH })
    this.redis = redis as Commands
  }

  async take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost = 1): Promise<TakeResult> {
    this.#failFastWhenLost()
    const [ok, remaining, retryAfterMs] = await this.redis.lsTake(key, capacity, refillPerSecond, nowMs, cost)
    return { ok: ok === 1, remaining, retryAfterMs }
  }

  async claimOnce(key: string, ttlSeconds: number): Promise<boolean> {
    this.#failFastWhenLost()
    return (await this.redis.set(key, '1', 'EX', ttlSeconds, 'NX')) === 'OK'
  }

  async epochs(keys: readonly string[]): Promise<number[]> {
    if (keys.length === 0) return []
    this.#failFastWhenLost()
    const values = await this.redis.mget(...keys)
    return values.map((v) => (v === null ? 0 : Number(v)))
  }

  async bump(keys: readonly string[]): Promise<void> {
    this.#failFastWhenLost()
    if (keys.length > 0) await this.redis.lsBump(keys.length, ...keys)
  }

  async snapshot(epochKeys: readonly string[], admission?: Admission): Promise<Snapshot> {
    this.#failFastWhenLost()
    const sentAt = this.#generation
    const args: (string | number)[] = [keys.generation, ...epochKeys]
    if (admission) args.push(admission.key)
    args.push(randomUUID())
    if (admission) args.push(admission.nowMs, admission.capacity, admission.refillPerSecond)
    const [seen, waitMs, ...epochs] = await this.redis.lsSnapshot(epochKeys.length + (admission ? 2 : 1), ...args)
    if (waitMs > 0) return { kind: 'limited', retryAfterMs: waitMs }
    return { kind: 'ok', generation: this.#observe(seen, sentAt), epochs }
  }

  /**
   * The generation a read of ls:gen belongs to. A reply to a call sent before the connection dropped
   * keeps its old generation, which callers no longer accept; a changed value starts a new one.
   */
  #observe(seen: string, sentAt: number): number {
    if (sentAt !== this.#generation) return sentAt
    if (this.#storeGeneration !== seen) {
      if (this.#storeGeneration !== null) this.#generation++
      this.#storeGeneration = seen
    }
    return this.#generation
  }

  /**
   * While a lost connection is being re-established, every operation fails at once instead of waiting
   * for a reconnect attempt (seconds each): the hot path fails open or closed, a Developer API request
   * goes unlimited, a cache bump is retried in the background, a credit flush waits for the next pass.
   * Before the first connect, commands queue.
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
    if (input.generation !== this.#generation) return Promise.resolve(this.#newGeneration())
    return new Promise((resolve, reject) => {
      // The first request after a quiet spell goes at once (a microtask: Bun runs setImmediate late
      // enough to leave the CPU idle); later ones wait for the call in flight to come back.
      if (this.#authorizeQueue.push({ input, resolve, reject }) === 1 && !this.#authorizeInFlight) {
        queueMicrotask(this.#sendAuthorize)
      }
    })
  }

  #newGeneration(): AuthorizeResult {
    return { kind: 'new_generation', generation: this.#generation }
  }

  readonly #sendAuthorize = (): void => {
    const queued = this.#authorizeQueue
    if (queued.length === 0 || this.#authorizeInFlight) return
    this.#authorizeQueue = []
    const sentAt = this.#generation
    let batch = queued
    // The generation moved while some of them waited for the call in flight (rare: no copy otherwise).
    if (!queued.every((p) => p.input.generation === sentAt)) {
      batch = queued.filter((p) => p.input.generation === sentAt)
      for (const p of queued) if (p.input.generation !== sentAt) p.resolve(this.#newGeneration())
      if (batch.length === 0) return
    }
    this.#authorizeInFlight = true
    const call = new AuthorizeArgs()
    for (const p of batch) call.add(p.input)
    const settle = (reply: number[] | [-1, string] | null, err: unknown) => {
      this.#authorizeInFlight = false
      let replies = reply as number[] | null
      if (reply?.[0] === -1) {
        // Nothing ran: the store's generation is not the one these requests' epochs were read under.
        if (sentAt === this.#generation) {
          this.#generation++
          this.#storeGeneration = String(reply[1])
        }
        replies = null
      } else if (replies && sentAt !== this.#generation) {
        // ioredis re-sent the call on a new connection, where ls:gen may have survived a loss of
        // later writes (a failover): its verdicts cannot be trusted, and its charges are given back.
        err = new Error('redis connection was replaced during the call')
        this.#refundAll(batch, replies)
        replies = null
      }
      // What queued meanwhile goes out before this batch's requests go on, so Redis works alongside them.
      this.#sendAuthorize()
      let at = 0
      for (const p of batch) {
        if (!replies) {
          if (err) p.reject(err)
          else p.resolve(this.#newGeneration())
          continue
        }
        try {
          const [result, next] = authorizeResult(replies, at)
          at = next
          p.resolve(result)
        } catch (e) {
          p.reject(e)
        }
      }
    }
    this.redis.lsAuthorize(call.packed(), this.#storeGeneration ?? '', randomUUID()).then(
      (replies) => settle(replies, null),
      (err: unknown) => settle(null, err),
    )
  }

  #refundAll(batch: PendingAuthorize[], replies: number[]): void {
    let at = 0
    for (const p of batch) {
      const [result, next] = authorizeResult(replies, at)
      at = next
      const accountId = p.input.charge?.accountId
      if (result.kind === 'ok' && result.charged > 0 && accountId) {
        this.refund(accountId, result.charged).catch((e: unknown) =>
          log.warn('refund after a replaced redis connection failed', errorFields(e)),
        )
      }
    }
  }

  async loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean): Promise<'ok' | 'stale'> {
    this.#failFastWhenLost()
    const done = await this.redis.lsLoadBalance(
      keys.balance(accountId),
      keys.pendingCharges(accountId),
      keys.flushing(accountId),
      keys.accountEpoch(accountId),
      seen.epoch,
      seen.flushId ?? '',
      flushCommitted ? '1' : '0',
      reconciled,
    )
    return done === 1 ? 'ok' : 'stale'
  }

  async creditState(accountId: string): Promise<CreditState> {
    this.#failFastWhenLost()
    const [epoch, flushing] = await this.redis.mget(keys.accountEpoch(accountId), keys.flushing(accountId))
    return { epoch: Number(epoch ?? 0), flushId: flushing ? flushIdOf(flushing) : null }
  }

  async balance(accountId: string): Promise<number | null> {
    this.#failFastWhenLost()
    const v = await this.redis.get(keys.balance(accountId))
    return v === null ? null : Number(v)
  }

  async creditsAdded(accountId: string, n: number): Promise<void> {
    this.#failFastWhenLost()
    await this.redis.lsCreditsAdded(keys.balance(accountId), keys.accountEpoch(accountId), n)
  }

  async refund(accountId: string, n: number): Promise<void> {
    this.#failFastWhenLost()
    await this.redis.lsRefund(
      keys.balance(accountId),
      keys.pendingCharges(accountId),
      keys.dirtyAccounts,
      accountId,
      n,
    )
  }

  async dirtyAccounts(): Promise<string[]> {
    this.#failFastWhenLost()
    return this.redis.smembers(keys.dirtyAccounts)
  }

  async beginFlush(accountId: string, newId: string): Promise<{ id: string; amount: number } | null> {
    this.#failFastWhenLost()
    const record = await this.redis.lsBeginFlush(keys.pendingCharges(accountId), keys.flushing(accountId), newId)
    if (!record) return null
    return { id: flushIdOf(record), amount: Number(record.slice(record.lastIndexOf(':') + 1)) }
  }

  async endFlush(accountId: string, id: string): Promise<void> {
    this.#failFastWhenLost()
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

/** The id of a flush record "<flush id>:<amount>". */
const flushIdOf = (record: string) => record.slice(0, record.lastIndexOf(':'))

export async function openStore(redisUrl: string | null): Promise<Store> {
  if (!redisUrl) {
    const { MemoryStore } = await import('./memory')
    log.info('REDIS_URL is not set: rate-limit, nonce and session state is kept in this process (one instance only)')
    return new MemoryStore()
  }
  return new RedisStore(redisUrl)
}
