import { storeErrors } from '../../lib/metrics'
import { errorFields, log } from '../../lib/log'
import { type AuthorizeInput, type AuthorizeResult, type CreditState, type EpochRead, keys, type Shard, type Snapshot, type Snapshots, type Store, type TakeResult } from '../store'
import { type AuthorizeCommands, authorizeScripts, RedisAuthorizer } from './authorize'
import { Connection, type RedisStoreOptions } from './connection'
import { type CreditCommands, creditScripts, RedisCredits } from './credits'
import { type EpochCommands, epochScripts, RedisEpochs } from './epochs'
import { type LimiterCommands, limiterScripts, RedisLimiter } from './limiter'

export type { RedisStoreOptions } from './connection'

/** Counts a failed store command; the caller still gets (and handles) the rejection. */
const countFailure = () => storeErrors.add('command')
function watched<T>(reply: Promise<T>): Promise<T> {
  reply.catch(countFailure)
  return reply
}

type Commands = LimiterCommands & EpochCommands & CreditCommands & AuthorizeCommands

/**
 * The Store every instance shares: one connection, and a part per concern (limiter, epochs, credits,
 * authorize), each with its Lua scripts. Every operation is one command or one atomic script.
 */
export class RedisStore implements Store {
  readonly kind = 'redis' as const
  readonly #conn: Connection<Commands>
  readonly #limiter: RedisLimiter
  readonly #epochs: RedisEpochs
  readonly #credits: RedisCredits
  readonly #authorizer: RedisAuthorizer

  constructor(url: string, options: RedisStoreOptions = {}) {
    this.#conn = new Connection<Commands>(url, options, {
      ...limiterScripts,
      ...epochScripts,
      ...creditScripts,
      ...authorizeScripts,
    })
    this.#limiter = new RedisLimiter(this.#conn)
    this.#epochs = new RedisEpochs(this.#conn)
    this.#credits = new RedisCredits(this.#conn)
    this.#authorizer = new RedisAuthorizer(this.#conn, this.#credits, options.authorizeTimeoutMs)
  }

  get shards(): number {
    return this.#conn.shards
  }

  shardOf(accountId: string): Shard {
    return this.#conn.shardOf(accountId)
  }

  /** The client, with the scripts as commands (tests reach past the Store with it). */
  get redis() {
    return this.#conn.redis
  }

  take(key: string, capacity: number, refillPerSecond: number, nowMs: number, cost?: number): Promise<TakeResult> {
    return watched(this.#limiter.take(key, capacity, refillPerSecond, nowMs, cost))
  }

  claimOnce(key: string, ttlSeconds: number): Promise<boolean> {
    return watched(this.#limiter.claimOnce(key, ttlSeconds))
  }

  epochs(keys: readonly string[]): Promise<number[]> {
    return watched(this.#epochs.epochs(keys))
  }

  bump(keys: readonly string[]): Promise<void> {
    return watched(this.#epochs.bump(keys))
  }

  snapshot(keys: readonly string[]): Promise<Snapshot> {
    return watched(this.#epochs.snapshot(keys))
  }

  snapshotEach(reads: readonly EpochRead[]): Promise<Snapshots> {
    return watched(this.#epochs.snapshotEach(reads))
  }

  authorize(input: AuthorizeInput): Promise<AuthorizeResult> {
    return watched(this.#authorizer.authorize(input))
  }

  loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean): Promise<'ok' | 'stale'> {
    return watched(this.#credits.loadBalance(accountId, seen, reconciled, flushCommitted))
  }

  creditState(accountId: string): Promise<CreditState> {
    return watched(this.#credits.creditState(accountId))
  }

  balance(accountId: string): Promise<number | null> {
    return watched(this.#credits.balance(accountId))
  }

  creditsAdded(accountId: string, n: number): Promise<void> {
    return watched(this.#credits.creditsAdded(accountId, n))
  }

  refund(accountId: string, n: number): Promise<void> {
    return watched(this.#credits.refund(accountId, n))
  }

  dirtyAccounts(): Promise<string[]> {
    return watched(this.#credits.dirtyAccounts())
  }

  beginFlush(accountId: string, newId: string): Promise<{ id: string; amount: number } | null> {
    return watched(this.#credits.beginFlush(accountId, newId))
  }

  endFlush(accountId: string, id: string): Promise<void> {
    return watched(this.#credits.endFlush(accountId, id))
  }

  async ping(): Promise<boolean> {
    try {
      return (await this.#conn.redis.ping()) === 'PONG'
    } catch {
      return false
    }
  }

  async close(): Promise<void> {
    this.#conn.redis.disconnect()
  }
}

/** The store the settings name: Redis, a Redis Cluster (`clusterShards`), or the in-process twin without REDIS_URL. */
export async function openStore(redisUrl: string | null, clusterShards: number | null = null): Promise<Store> {
  if (!redisUrl) {
    const { MemoryStore } = await import('../memory')
    log.info('REDIS_URL is not set: rate-limit, nonce and session state is kept in this process (one instance only)')
    return new MemoryStore()
  }
  const store = new RedisStore(redisUrl, { cluster: clusterShards === null ? null : { shards: clusterShards } })
  await checkShardCount(store)
  return store
}

/**
 * Refuses to start beside instances that spread accounts over another number of shards: their keys of
 * one account would not meet (a nonce claimed twice, two balances). The first instance records its
 * count; an unreachable store is not a reason to refuse (the server starts and fails over as usual).
 */
async function checkShardCount(store: RedisStore): Promise<void> {
  const mine = String(store.shards)
  let recorded: string | null
  try {
    await store.redis.set(keys.shardCount, mine, 'NX')
    recorded = await store.redis.get(keys.shardCount)
  } catch (err) {
    log.warn('redis unreachable at start: the shard count is not checked', errorFields(err))
    return
  }
  if (recorded !== null && recorded !== mine) {
    await store.close()
    throw new Error(
      `this store's keys were written with ${recorded} shard(s) and this instance uses ${mine} (REDIS_CLUSTER, REDIS_CLUSTER_SHARDS): every instance must use the same`,
    )
  }
}
