/**
 * Shared, fast state: token buckets, nonces, cache-invalidation epochs, live credit balances and the
 * per-request checks. Two implementations with one meaning: Redis (every instance shares it; each
 * operation is one atomic Lua script) and an in-process twin for a single embedded instance. Time is
 * always passed in so tests control the clock. Each concern is its own interface; Store is all of them.
 */
export interface Store extends Limiter, Epochs, Credits, Authorizer {
  readonly kind: 'redis' | 'memory'
  /** How many shards the accounts are spread over: 1 but on a Redis Cluster. */
  readonly shards: number
  /** The shard of an account: the tag every key of its requests carries (see `keys`). */
  shardOf(accountId: string): Shard
  ping(): Promise<boolean>
  close(): Promise<void>
}

/** Token buckets. */
export interface Limiter {
  /**
   * Token bucket of `capacity` tokens refilling continuously at `refillPerSecond`. Takes `cost`
   * tokens when available. `retryAfterMs` is how long until `cost` tokens are there again.
   */
  take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost?: number): Promise<TakeResult>
}

/** Cache-invalidation epochs and the store generation they are read under. */
export interface Epochs {
  /** Current epoch of each key (0 when missing: never written, or expired on Redis). */
  epochs(keys: readonly string[]): Promise<number[]>
  /** What a cache load reads first: each key's epoch and the generation of its shard, one atomic call per shard. */
  snapshot(keys: readonly string[]): Promise<Snapshot>
  /**
   * Many loads' first reads in one atomic step per shard: the shard's generation and, per read, first
   * one token from its `admission` bucket when it has one (the authorize script's rule), then its
   * epoch; a read whose bucket is empty reads nothing ('limited'), so each caller can limit its own
   * work (a PostgreSQL lookup) before doing it without holding up the others. A read's key and bucket
   * are of one shard; reads of several shards make one call per shard.
   */
  snapshotEach(reads: readonly EpochRead[]): Promise<Snapshots>
  /** Increments each key's epoch (of any shards), so every instance's cache entry read under the old value is stale. */
  bump(keys: readonly string[]): Promise<void>
}

/** Every store-side check of a public request. */
export interface Authorizer {
  /**
   * Every store-side check of one public request in one atomic step (see AuthorizeInput for the order).
   * Throws only when the store is unreachable.
   */
  authorize(input: AuthorizeInput): Promise<AuthorizeResult>
}

/** Live credit balances, charged by authorize and reconciled to PostgreSQL in flushes. */
export interface Credits {
  /**
   * Seeds the live credit balance, when missing, from the reconciled one: minus the pending charges and
   * minus the unfinished flush unless `flushCommitted` (PostgreSQL, read with `reconciled`, has it).
   * 'stale' (nothing written; the caller reads again) when the account's epoch (a concurrent
   * addCredits), its unfinished flush or its credit sequence (a flush begun, even if ended since)
   * changed since `seen` was read: so a load that runs late, after its caller released the account row
   * and a flush moved charges, writes nothing. When the store's credit
   * sequence is behind `reconciledSeq` (accounts.credit_seq, read with `reconciled`), what it holds of
   * the account's credits is older than PostgreSQL: it is dropped, and the balance is `reconciled`.
   */
  loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean, reconciledSeq?: number): Promise<'ok' | 'stale'>
  /** The account's epoch, unfinished flush, credit sequence and charges, read before a balance load (see loadBalance). */
  creditState(accountId: string): Promise<CreditCharges>
  /** The live balance, or null while it is not loaded or the store's credit sequence is behind `reconciledSeq` (see loadBalance). */
  balance(accountId: string, reconciledSeq?: number): Promise<number | null>
  /**
   * The account's credits are changing in PostgreSQL: bumps the account epoch (a seed under way is
   * refused) and drops the live balance, so the next charge seeds it from what PostgreSQL then holds,
   * whether the change committed or not. Returns the account's next credit sequence number, for
   * PostgreSQL to record with the change. A store behind `reconciledSeq` (accounts.credit_seq, read under
   * the change's row lock) first drops its charges and flush record, as loadBalance does: counted after
   * its increment, a store one change behind would pass for current.
   */
  creditsChanging(accountId: string, reconciledSeq?: number): Promise<number>
  /**
   * Gives back a charge whose request failed after the charge (a lost seat race). `chargedUnder` names
   * the data the charge was made in (AuthorizeResult): if the store lost its data since, or may have
   * (its connection dropped: the server may have come back from an older copy), the charge went with
   * it and was never flushed, so there is nothing to give back.
   */
  refund(accountId: string, n: number, chargedUnder: string): Promise<void>
  /**
   * Takes back a heartbeat's count (keys.heartbeats) when its request failed after authorize counted
   * it: the client repeats it, and every 10th call is the one charged only if failed calls do not count.
   * `countedUnder` is the call's chargedUnder: a count lost with the data is not taken from the counter
   * that started again (a free heartbeat more than the loss already gave).
   */
  uncount(counterKey: string, countedUnder: string): Promise<void>
  /** The accounts of `shard` with charges not yet reconciled to PostgreSQL. */
  dirtyAccounts(shard: Shard): Promise<string[]>
  /**
   * Moves the account's pending charges into one flush record with id `newId` and returns it; returns
   * the earlier record instead when one is unfinished (a crashed flush is retried, never doubled).
   */
  beginFlush(accountId: string, newId: string, reconciledSeq?: number): Promise<BegunFlush>
  /** Drops the flush record once PostgreSQL has it; the account leaves the dirty set when nothing is pending and no flush record is left. */
  endFlush(accountId: string, id: string): Promise<void>
}

/**
 * One public request's store work. The script runs, in order: (1) read-only checks: every epoch still
 * equals `expected` (else 'stale' with the current values, nothing changed) and, with a charge, the
 * live balance is loaded (else 'no_balance'); (2) the sandbox daily ceiling; (3) the token buckets, all
 * or none; (4) the nonce claim; (5) `deny`: the request already failed in-process, stop here; (6) the
 * credit charge.
 */
export interface AuthorizeInput {
  nowMs: number
  /** The shard of the charged account's app: every key below carries its tag. */
  shard: Shard
  /** The generation the caller's epochs were read under (Snapshot); any other answers 'new_generation'. */
  generation: number
  epochs: { key: string; expected: number }[]
  ceiling: { key: string; limit: number; ttlSeconds: number } | null
  /** Each key once (the Redis store refuses a request that names one twice). */
  buckets: { key: string; capacity: number; refillPerSecond: number }[]
  nonce: { key: string; ttlSeconds: number } | null
  deny: boolean
  charge: {
    accountId: string
    cost: number
    /** Heartbeats: charge `cost` only on every `every`-th call counted under `key`. */
    counter: { key: string; every: number } | null
  } | null
}

export type AuthorizeResult =
  /** chargedUnder: the data the charge was made in (the shard's generation key, the connection), for its refund. */
  | { kind: 'ok'; charged: number; chargedUnder: string }
  | { kind: 'stale'; epochs: number[] }
  /** The store may have lost data since the caller's generation: every cached entry must go. Nothing changed. */
  | { kind: 'new_generation'; generation: number }
  | { kind: 'no_balance' }
  | { kind: 'quota' }
  | { kind: 'limited'; retryAfterMs: number }
  | { kind: 'replay' }
  | { kind: 'denied' }
  | { kind: 'no_credits' }

/** A token bucket as AuthorizeInput.buckets has them, with the time of the take. */
export interface Admission {
  key: string
  capacity: number
  refillPerSecond: number
  nowMs: number
}

/**
 * `generation` names the store's contents as this process sees them: it changes whenever the store (any
 * shard of it) may have lost data (restarted empty, flushed, failed over to a replica that lost writes, or
 * only a new connection that may lead to one of those). Epochs read under one generation mean nothing
 * under another.
 */
export interface Snapshot {
  generation: number
  epochs: number[]
}

/** One key of Epochs.snapshotEach, with the bucket that admits its read, if any. */
export interface EpochRead {
  key: string
  admission?: Admission
}

/** What Epochs.snapshotEach read: the generation, and per read its epoch or its bucket's wait. */
export interface Snapshots {
  generation: number
  reads: ({ kind: 'ok'; epoch: number } | { kind: 'limited'; retryAfterMs: number })[]
}

/** A balance load's view of the account: its epoch and its unfinished flush, if any. */
/**
 * A flush begun (its record, and the store's credit sequence number after taking it), none
 * (nothing pending), or 'behind': the store's credit sequence was behind `reconciledSeq`, so the store
 * came back from an older copy of its data and may hold charges PostgreSQL already has; it dropped the
 * account's balance, pending charges and flush record, and the next charge seeds the balance again.
 */
export type BegunFlush = { id: string; amount: number; seq: number } | null | 'behind'

export interface CreditState {
  epoch: number
  flushId: string | null
  /** The store's credit sequence (see Credits.creditsChanging). */
  seq: number
}

/** CreditState and the charges not in PostgreSQL's balance yet: what a seed takes off it. */
export interface CreditCharges extends CreditState {
  /** Charges not yet taken into a flush. */
  pending: number
  /** The unfinished flush's amount, 0 when there is none. */
  flushing: number
}

export interface TakeResult {
  ok: boolean
  /** Tokens left after this call, rounded down. */
  remaining: number
  retryAfterMs: number
}

/**
 * An account's shard, as the hash tag its keys carry ("{s12}"): Redis Cluster places a key by the text
 * between its first braces, so every key of one account (its apps' and licenses' epochs, their limits,
 * nonces and counters, its credits) and its shard's generation and dirty set share one slot, and one
 * script call touches one slot. On a single Redis there is one shard, `''`, whose keys carry no tag: they
 * are the names every earlier version wrote, so an upgrade or a rolling restart finds the live
 * balances, pending charges and epochs where the running instances keep them.
 */
export type Shard = string

/**
 * How long a client request waits for a store call before it is answered as in an outage: hundreds of
 * times such a call's usual few milliseconds, the 2 s /readyz gives a ping. Without it, a Redis that
 * stops answering but keeps the connection (a network partition, a stalled host) would hold those
 * requests until TCP gives up, many minutes on.
 */
export const STORE_CALL_TIMEOUT_MS = 2000

/**
 * How far past its bucket's limit a request may come and still be admitted, in ms. A bucket is an
 * absolute time (about 1.9e12 ms, whose doubles are 2.4e-4 ms apart) to which each request adds its
 * interval, 60,000 ms ÷ the limit: the sum of a burst's intervals is not exact, so a limit such as 9 a
 * minute admitted 8 of a burst arriving within one millisecond. Half a millisecond covers that sum over
 * thousands of requests; the clock it is compared with counts whole milliseconds.
 */
export const BUCKET_SLACK_MS = 0.5
/**
 * How long Redis keeps an app's or a license's cache-invalidation epoch after it was last written: a
 * key per license ever changed or read would grow with every license a store ever served. A missing
 * key is never taken for a value an entry may hold: a script that reads one writes it anew from Redis's
 * clock (luaNewEpoch), so an entry read before it went (older, or 0 from a missing key) is stale at its
 * next call, and each license in use is read from PostgreSQL again once per this long.
 */
export const EPOCH_TTL_MS = 3_600_000
/** How far past a whole refill a Developer API bucket's time may lead a clock before it is taken for a clock step (takeBucket). */
export const CLOCK_STEP_MS = 60_000

/** `ls:` and the shard's tag: what every key of the shard starts with. */
export const shardPrefix = (shard: Shard) => (shard === '' ? 'ls:' : `ls:${shard}:`)

/**
 * The shard of `accountId` among `shards`: FNV-1a of its UTF-16 code units, so every process and
 * every version agrees; changing the shard count moves accounts (see README, Redis Cluster).
 */
export function shardOf(accountId: string, shards: number): Shard {
  if (shards === 1) return ''
  let h = 0x811c9dc5
  for (let i = 0; i < accountId.length; i++) h = Math.imul(h ^ accountId.charCodeAt(i), 0x01000193)
  return `{s${(h >>> 0) % shards}}`
}

/** Every shard among `shards`, for what goes over all of them (the credit reconciler). */
export const allShards = (shards: number): Shard[] => (shards === 1 ? [''] : Array.from({ length: shards }, (_, i) => `{s${i}}`))

/**
 * How long a license's count of unbilled heartbeats lives from the first heartbeat of each ten (the
 * count's cycle). Without an end, every license ever heartbeated (deleted ones too) kept a key in Redis
 * for good. Ten heartbeats a week apart (a session of the longest lifetime, refreshed as late as it
 * can be) take 70 days, so a cycle always ends within this; past it a license's next heartbeat starts
 * the count afresh, at most HEARTBEATS_PER_CREDIT - 1 heartbeats unbilled.
 */
export const HEARTBEAT_COUNT_TTL_SECONDS = 90 * 86_400

/**
 * Key names, in one place so both implementations and every caller agree. Each one a client request
 * touches starts with its shard's prefix (`ls:{s12}:` on a cluster, `ls:` on one Redis), the tag ahead of anything a caller supplies, so no nonce or key
 * can move it to another slot; the Developer API limiter's keys stand alone (single-key scripts).
 */
export const keys = {
  appEpoch: (shard: Shard, appId: string) => `${shardPrefix(shard)}ep:app:${appId}`,
  licenseEpoch: (shard: Shard, licenseKey: string) => `${shardPrefix(shard)}ep:lic:${licenseKey}`,
  accountEpoch: (shard: Shard, accountId: string) => `${shardPrefix(shard)}ep:acct:${accountId}`,
  bucket: (shard: Shard, scope: string, id: string) => `${shardPrefix(shard)}rl:${scope}:${id}`,
  /** The Developer API limit of one API key (by its hash). */
  apiBucket: (keyHash: string) => `ls:rl:api:${keyHash}`,
  nonce: (shard: Shard, appId: string, nonce: string) => `${shardPrefix(shard)}nonce:${appId}:${nonce}`,
  /** Sandbox daily ceiling counter; `day` is YYYY-MM-DD in UTC. */
  daily: (shard: Shard, appId: string, day: string) => `${shardPrefix(shard)}day:${appId}:${day}`,
  /** A license's heartbeats not billed yet; lives HEARTBEAT_COUNT_TTL_SECONDS from its cycle's first. */
  heartbeats: (shard: Shard, licenseKey: string) => `${shardPrefix(shard)}hb:${licenseKey}`,
  /** Live credit balance of an account while loaded. */
  balance: (shard: Shard, accountId: string) => `${shardPrefix(shard)}cr:${accountId}`,
  /** Charges taken from the live balance and not yet subtracted in PostgreSQL. */
  pendingCharges: (shard: Shard, accountId: string) => `${shardPrefix(shard)}crp:${accountId}`,
  /**
   * The account's credit sequence number: taken by each flush begun and each change of its credits,
   * and recorded in accounts.credit_seq by the transaction that makes the change.
   */
  creditSeq: (shard: Shard, accountId: string) => `${shardPrefix(shard)}crs:${accountId}`,
  /** The flush in progress: "<flush id>:<amount>". */
  flushing: (shard: Shard, accountId: string) => `${shardPrefix(shard)}crf:${accountId}`,
  /** The shard's accounts with pending charges, or refused a charge for want of credits (the next flush pass looks at them). */
  dirtyAccounts: (shard: Shard) => `${shardPrefix(shard)}crdirty`,
  /**
   * The shard count the store's keys were written with (openStore): a record in each shard (on one
   * Redis, this key itself), so that a cluster master that is down holds up the check of its own
   * shards only. Instances before the per-shard records wrote this one alone, and it is still read.
   */
  shardCount: 'ls:shards',
  shardCountIn: (shard: Shard) => `${shardPrefix(shard)}shards`,
  /** A random id written when missing: a shard that lost its data comes back without it (Snapshot). */
  generation: (shard: Shard) => `${shardPrefix(shard)}gen`,
}

/** The shard tag a key starts with after `ls:`; '' (the single Redis's one shard) for a key with none. */
export function shardOfKey(key: string): Shard {
  if (!key.startsWith('ls:{')) return ''
  const end = key.indexOf('}', 4)
  return end < 0 ? '' : key.slice(3, end + 1)
}
