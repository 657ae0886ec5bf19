import {
  type Admission,
  type AuthorizeInput,
  type AuthorizeResult,
  type BegunFlush,
  BUCKET_SLACK_MS,
  CLOCK_STEP_MS,
  type CreditCharges,
  type CreditState,
  type EpochRead,
  HEARTBEAT_COUNT_TTL_SECONDS,
  keys,
  type Shard,
  shardOf,
  type Snapshot,
  type Snapshots,
  type Store,
  type TakeResult,
} from './store'

import { logEvery } from '../lib/log'
import { EpochTable } from './epoch-table'
import { NonceMemory } from './nonce-memory'

const ONE_SHARD = shardOf('', 1)
/** What every license epoch key starts with: those live in the EpochTable, not in the map. */
const LICENSE_EPOCH = keys.licenseEpoch(ONE_SHARD, '')

/**
 * A bucket's time as of `now` (GCRA: its theoretical arrival time): the stored one, or `now` when that is
 * past or missing. One further ahead than a bucket emptied now (its capacity's intervals) was written by
 * a clock ahead of this one. Another instance's, a little ahead, is kept: read as now, the instance behind
 * took a token on every call and the one ahead found the difference's worth refilled, so two instances
 * 250 ms apart admitted four times the limit. A lead past CLOCK_STEP_MS is this clock stepped back (read
 * as it is, it refused every request for as long as the step): read as a bucket with one token left, as
 * takeBucket does. (The scripts' bucket_time, redis/wire.ts.)
 */
function bucketTime(stored: number | undefined, now: number, b: Pick<Admission, 'capacity' | 'refillPerSecond'>): number {
  if (stored === undefined || stored < now) return now
  const t = 1000 / b.refillPerSecond
  return stored > now + b.capacity * t + CLOCK_STEP_MS ? now + (b.capacity - 1) * t : stored
}

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
  readonly shards: number = 1
  readonly #data = new Map<string, Entry>()
  readonly #nonces = new NonceMemory((count) =>
    logEvery('warn', 'more nonces than the in-process store remembers: the oldest were forgotten before their 7 days', () => ({ count })),
  )
  readonly #licenseEpochs = new EpochTable()
  #sweepAt = 0
  /** Snapshot.generation: the data is lost only by close(), which starts a new one. */
  #generation = 1

  constructor(private readonly clock: () => number = Date.now) {}

  /** One process, one shard. */
  shardOf(accountId: string): Shard {
    return shardOf(accountId, 1)
  }

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
    const result = takeBucket(this, key, capacity, refillPerSecond, nowMs, cost)
    // Answers after a turn of the event loop, as a Redis round trip does. Answered at once, a request
    // would run on into its PGlite queries, which hold the thread, before the next request of a burst
    // took its token: the burst would be spread over that time and the bucket refill under it.
    await new Promise((resolve) => setImmediate(resolve))
    return result
  }

  /** Bucket state access for takeBucket; the same state the Redis hash holds. */
  bucketState(key: string, nowMs: number): { tokens: number; ts: number } | undefined {
    return this.get(key, nowMs) as { tokens: number; ts: number } | undefined
  }

  setBucketState(key: string, state: { tokens: number; ts: number }, ttlMs: number, nowMs: number): void {
    this.set(key, state, ttlMs, nowMs)
  }

  async epochs(keys: readonly string[]): Promise<number[]> {
    return keys.map((k) => this.#num(k))
  }

  async bump(keys: readonly string[]): Promise<void> {
    for (const k of keys) {
      if (k.startsWith(LICENSE_EPOCH)) this.#licenseEpochs.bump(k)
      else this.set(k, this.#num(k) + 1)
    }
  }

  async snapshot(epochKeys: readonly string[]): Promise<Snapshot> {
    return { generation: this.#generation, epochs: epochKeys.map((k) => this.#num(k)) }
  }

  async snapshotEach(reads: readonly EpochRead[]): Promise<Snapshots> {
    return {
      generation: this.#generation,
      reads: reads.map(({ key, admission }) => {
        const retryAfterMs = admission ? this.#takeBuckets([admission], admission.nowMs) : 0
        return retryAfterMs > 0 ? { kind: 'limited', retryAfterMs } : { kind: 'ok', epoch: this.#num(key) }
      }),
    }
  }

  /**
   * GCRA, as in the scripts: a bucket is its theoretical arrival time. Takes one token from each bucket,
   * all or none; returns 0, or the wait in ms until all of them have one.
   */
  #takeBuckets(buckets: readonly Omit<Admission, 'nowMs'>[], now: number): number {
    if (buckets.length === 0) return 0
    const tats = buckets.map((b) => {
      const stored = this.get(b.key, now) as number | undefined
      const tat = bucketTime(stored, now, b)
      // Read as a clock stepped back: kept so whatever the other buckets answer, as the script does.
      if (stored !== undefined && stored > tat) this.set(b.key, tat, Math.ceil(tat - now) + 1000, now)
      return tat + 1000 / b.refillPerSecond
    })
    let short = 0
    buckets.forEach((b, i) => {
      const over = (tats[i] ?? now) - now - b.capacity * (1000 / b.refillPerSecond)
      if (over > BUCKET_SLACK_MS) short = Math.max(short, Math.ceil(over))
    })
    if (short > 0) return short
    buckets.forEach((b, i) => {
      const tat = tats[i] ?? now
      this.set(b.key, tat, Math.ceil(tat - now) + 1000, now)
    })
    return 0
  }

  // Mirrors AUTHORIZE in redis/authorize-script.ts step by step; runs without awaiting, so it is atomic like the script.
  async authorize(a: AuthorizeInput): Promise<AuthorizeResult> {
    if (a.generation !== this.#generation) return { kind: 'new_generation', generation: this.#generation }
    const now = a.nowMs
    const current = a.epochs.map((e) => this.#num(e.key, now))
    if (a.epochs.some((e, i) => current[i] !== e.expected)) return { kind: 'stale', epochs: current }
    if (a.charge && this.get(keys.balance(a.shard, a.charge.accountId), now) === undefined) return { kind: 'no_balance' }
    if (a.ceiling) {
      const count = this.#num(a.ceiling.key, now) + 1
      const entry = this.get(a.ceiling.key, now) === undefined ? a.ceiling.ttlSeconds * 1000 : this.#ttl(a.ceiling.key, now)
      this.set(a.ceiling.key, count, entry, now)
      if (count > a.ceiling.limit) return { kind: 'quota' }
    }
    const short = this.#takeBuckets(a.buckets, now)
    if (short > 0) return { kind: 'limited', retryAfterMs: short }
    if (a.nonce && !this.#nonces.claim(a.nonce.key, a.nonce.ttlSeconds * 1000, now)) return { kind: 'replay' }
    if (a.deny) return { kind: 'denied' }
    // The in-process store loses its data only with the process, and its refunds with it.
    if (!a.charge) return { kind: 'ok', charged: 0, chargedUnder: '' }
    let cost = a.charge.cost
    const counter = a.charge.counter
    if (counter) {
      const n = this.#num(counter.key, now) + 1
      this.set(counter.key, n, (n - 1) % counter.every === 0 ? HEARTBEAT_COUNT_TTL_SECONDS * 1000 : this.#ttl(counter.key, now), now)
      if (n % counter.every !== 0) cost = 0
    }
    if (cost > 0) {
      const balanceKey = keys.balance(a.shard, a.charge.accountId)
      const balance = this.#num(balanceKey, now)
      if (balance < cost) {
        if (counter) this.set(counter.key, this.#num(counter.key, now) - 1, this.#ttl(counter.key, now), now)
        this.#dirty(now).add(a.charge.accountId)
        return { kind: 'no_credits' }
      }
      this.set(balanceKey, balance - cost, Infinity, now)
      this.#addPending(a.charge.accountId, cost, now)
    }
    return { kind: 'ok', charged: cost, chargedUnder: '' }
  }

  #num(key: string, now = this.clock()): number {
    if (key.startsWith(LICENSE_EPOCH)) return this.#licenseEpochs.get(key)
    return (this.get(key, now) as number | undefined) ?? 0
  }

  #ttl(key: string, now: number): number {
    const entry = this.#data.get(key)
    return entry ? entry.expiresAt - now : Infinity
  }

  #dirty(now = this.clock()): Set<string> {
    let set = this.get(keys.dirtyAccounts(ONE_SHARD), now) as Set<string> | undefined
    if (!set) {
      set = new Set()
      this.set(keys.dirtyAccounts(ONE_SHARD), set, Infinity, now)
    }
    return set
  }

  #addPending(accountId: string, n: number, now = this.clock()): void {
    this.set(keys.pendingCharges(ONE_SHARD, accountId), this.#num(keys.pendingCharges(ONE_SHARD, accountId), now) + n, Infinity, now)
    this.#dirty(now).add(accountId)
  }

  async loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean, reconciledSeq = 0): Promise<'ok' | 'stale'> {
    if (this.#num(keys.accountEpoch(ONE_SHARD, accountId)) !== seen.epoch) return 'stale'
    const seq = this.#num(keys.creditSeq(ONE_SHARD, accountId))
    if (seq !== seen.seq) return 'stale'
    if (this.get(keys.balance(ONE_SHARD, accountId)) !== undefined) return 'ok'
    if (seq < reconciledSeq) {
      this.#dropCredits(accountId, reconciledSeq)
      this.set(keys.balance(ONE_SHARD, accountId), Math.max(0, reconciled))
      return 'ok'
    }
    const flushing = this.get(keys.flushing(ONE_SHARD, accountId)) as { id: string; amount: number } | undefined
    if ((flushing?.id ?? null) !== seen.flushId) return 'stale'
    const inflight = flushCommitted ? 0 : (flushing?.amount ?? 0)
    const live = reconciled - this.#num(keys.pendingCharges(ONE_SHARD, accountId)) - inflight
    // Refunds not flushed yet may carry it past the ceiling a top-up reaches (accounts/service.ts): held there.
    this.set(keys.balance(ONE_SHARD, accountId), Math.min(Number.MAX_SAFE_INTEGER, Math.max(0, live)))
    return 'ok'
  }

  async creditState(accountId: string): Promise<CreditCharges> {
    const flushing = this.get(keys.flushing(ONE_SHARD, accountId)) as { id: string; amount: number } | undefined
    return {
      epoch: this.#num(keys.accountEpoch(ONE_SHARD, accountId)),
      flushId: flushing?.id ?? null,
      seq: this.#num(keys.creditSeq(ONE_SHARD, accountId)),
      pending: this.#num(keys.pendingCharges(ONE_SHARD, accountId)),
      flushing: flushing?.amount ?? 0,
    }
  }

  async balance(accountId: string, reconciledSeq = 0): Promise<number | null> {
    if (this.#num(keys.creditSeq(ONE_SHARD, accountId)) < reconciledSeq) return null
    return (this.get(keys.balance(ONE_SHARD, accountId)) as number | undefined) ?? null
  }

  async creditsChanging(accountId: string, reconciledSeq = 0): Promise<number> {
    if (this.#num(keys.creditSeq(ONE_SHARD, accountId)) < reconciledSeq) this.#dropCredits(accountId, reconciledSeq)
    this.set(keys.accountEpoch(ONE_SHARD, accountId), this.#num(keys.accountEpoch(ONE_SHARD, accountId)) + 1)
    this.delete(keys.balance(ONE_SHARD, accountId))
    const seq = this.#num(keys.creditSeq(ONE_SHARD, accountId)) + 1
    this.set(keys.creditSeq(ONE_SHARD, accountId), seq)
    return seq
  }

  async refund(accountId: string, n: number): Promise<void> {
    const live = this.get(keys.balance(ONE_SHARD, accountId)) as number | undefined
    // Held at the ceiling a top-up may reach (accounts/service.ts).
    if (live !== undefined) this.set(keys.balance(ONE_SHARD, accountId), Math.min(Number.MAX_SAFE_INTEGER, live + n))
    this.#addPending(accountId, -n)
  }

  // This store's data goes only with the process, and the count with it: no mark to check.
  async uncount(counterKey: string, _countedUnder: string): Promise<void> {
    const now = this.clock()
    // A counter gone meanwhile stays gone, as in the Redis store.
    if (this.get(counterKey, now) !== undefined) this.set(counterKey, this.#num(counterKey, now) - 1, this.#ttl(counterKey, now), now)
  }

  async dirtyAccounts(shard: Shard): Promise<string[]> {
    return shard === ONE_SHARD ? [...this.#dirty()] : []
  }

  async beginFlush(accountId: string, newId: string, reconciledSeq = 0): Promise<BegunFlush> {
    let seq = this.#num(keys.creditSeq(ONE_SHARD, accountId))
    if (seq < reconciledSeq) {
      this.#dropCredits(accountId, reconciledSeq)
      this.set(keys.accountEpoch(ONE_SHARD, accountId), this.#num(keys.accountEpoch(ONE_SHARD, accountId)) + 1)
      return 'behind'
    }
    const unfinished = this.get(keys.flushing(ONE_SHARD, accountId)) as { id: string; amount: number } | undefined
    if (unfinished) return { ...unfinished, seq }
    const pending = this.#num(keys.pendingCharges(ONE_SHARD, accountId))
    if (pending === 0) return null
    seq++
    this.set(keys.creditSeq(ONE_SHARD, accountId), seq)
    this.set(keys.pendingCharges(ONE_SHARD, accountId), 0)
    const record = { id: newId, amount: pending }
    this.set(keys.flushing(ONE_SHARD, accountId), record)
    return { ...record, seq }
  }

  /** A store behind PostgreSQL's credit sequence `seq`: the account's balance, pending charges and flush record go. */
  #dropCredits(accountId: string, seq: number): void {
    for (const key of [keys.pendingCharges, keys.flushing, keys.balance]) this.delete(key(ONE_SHARD, accountId))
    this.set(keys.creditSeq(ONE_SHARD, accountId), seq)
  }

  async endFlush(accountId: string, id: string): Promise<void> {
    const unfinished = this.get(keys.flushing(ONE_SHARD, accountId)) as { id: string; amount: number } | undefined
    const ended = unfinished?.id === id
    if (ended) this.delete(keys.flushing(ONE_SHARD, accountId))
    if ((ended || !unfinished) && this.#num(keys.pendingCharges(ONE_SHARD, accountId)) === 0) this.#dirty().delete(accountId)
  }

  async ping(): Promise<boolean> {
    return true
  }

  async close(): Promise<void> {
    this.#data.clear()
    this.#nonces.clear()
    this.#licenseEpochs.clear()
    this.#generation++
  }
}

/** The token-bucket rule, written once for the twin; the Lua of redis/limiter.ts (and the bucket step of redis/authorize-script.ts) mirrors it line by line. */
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
  let ts = state ? state.ts : now
  // More than a minute past a whole refill ahead: written before this clock stepped back (or by one far
  // ahead). Kept, it refilled nothing for as long as the difference; read as now, with a token. A lead
  // short of that is another instance's clock a little ahead: kept, or the bucket would move back and
  // that instance's next take refill the lead's worth, every round.
  if (ts > now + capacity / ratePerMs + CLOCK_STEP_MS) {
    ts = now
    tokens = Math.max(tokens, 1)
  }
  tokens = Math.min(capacity, tokens + Math.max(0, now - ts) * ratePerMs)
  let ok = false
  let retryAfterMs = 0
  if (tokens >= cost) {
    tokens -= cost
    ok = true
  } else {
    // Refilling starts once the clock reaches the time kept (another instance's, a little ahead).
    retryAfterMs = Math.ceil((cost - tokens) / ratePerMs + Math.max(0, ts - now))
  }
  // The latest time seen, as the Redis script keeps it (instances' clocks differ there), kept until a
  // whole refill past it: counted from a caller's clock behind it, the bucket went early, and full.
  const kept = Math.max(ts, now)
  store.setBucketState(key, { tokens, ts: kept }, Math.ceil(capacity / ratePerMs) + 1000 + (kept - now), now)
  return { ok, remaining: Math.floor(tokens), retryAfterMs }
}
