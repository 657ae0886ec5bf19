import { Cluster, Redis, ReplyError } from 'ioredis'
import { ConfigError } from '../../config'
import { storeErrors } from '../../lib/metrics'
import { withDeadline } from '../../lib/with-timeout'
import { log } from '../../lib/log'
import { type AuthorizeInput, type AuthorizeResult, type BegunFlush, type CreditCharges, type CreditState, type EpochRead, type Shard, type Snapshot, type Snapshots, type Store, type TakeResult } from '../store'
import { type AuthorizeCommands, authorizeScripts, RedisAuthorizer } from './authorize'
import { clusterNodeOptions, clusterSeeds, Connection, type RedisStoreOptions } from './connection'
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
  readonly #url: string
  readonly kind = 'redis' as const
  readonly #conn: Connection<Commands>
  readonly #limiter: RedisLimiter
  readonly #epochs: RedisEpochs
  readonly #credits: RedisCredits
  readonly #authorizer: RedisAuthorizer

  constructor(url: string, options: RedisStoreOptions = {}) {
    this.#url = url
    this.#conn = new Connection<Commands>(url, options, {
      ...limiterScripts,
      ...epochScripts,
      ...creditScripts,
      ...authorizeScripts,
    })
    this.#limiter = new RedisLimiter(this.#conn)
    this.#epochs = new RedisEpochs(this.#conn)
    this.#credits = new RedisCredits(this.#conn)
    this.#authorizer = new RedisAuthorizer(this.#conn, this.#credits)
  }

  /**
   * A call with the deadline of the authorize calls (STORE_CALL_TIMEOUT_MS): those that Redis may still
   * run after the caller gave up without harm. A token taken then is charged to a request that went
   * through unlimited anyway; a failed bump is retried; the live balance dropped by adding credits is
   * seeded again from what PostgreSQL holds, so one dropped after that transaction rolled back costs a
   * seed. A balance seed run late writes nothing if a flush began since its read (the credit sequence
   * moved: see Credits.loadBalance). A flush's begin run late files the charges pending then under its
   * own id, which is new (ledger.ts) and which PostgreSQL cannot have, as its transaction rolled back:
   * the next pass applies it. It runs once at most: nothing sends a call again (Connection).
   * So no transaction waits on Redis past the deadline: an account's row, or the whole embedded
   * database (PGlite runs one transaction at a time), is never held for as long as Redis stops answering.
   * While an earlier call is overdue on one Redis they fail at once, unsent.
   * A refund is never refused unsent: its caller waits under a deadline of its own, and a refund Redis
   * runs late still gives the credits back. A flush's end runs after its transaction and holds nothing.
   */
  #waited<T>(call: () => Promise<T>): Promise<T> {
    const stalled = this.#conn.stalled()
    if (stalled) return Promise.reject(stalled)
    const reply = call()
    return withDeadline(reply, this.#conn.callTimeoutMs, 'a redis call', () => this.#conn.overdue(reply))
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
    return watched(this.#waited(() => this.#limiter.take(key, capacity, refillPerSecond, nowMs, cost)))
  }

  epochs(keys: readonly string[]): Promise<number[]> {
    return watched(this.#epochs.epochs(keys))
  }

  /**
   * Sent even while a call is overdue: a bump refused unsent left every other instance's cache fresh
   * by its epochs once a stalled Redis answered again, until a sweep made it (a second later, and after
   * an instance that had answered from PostgreSQL meanwhile went back to its cache). Sent, Redis runs it
   * as it resumes, before the calls that follow. Its caller still waits no longer than the deadline.
   */
  bump(keys: readonly string[]): Promise<void> {
    const reply = this.#epochs.bump(keys)
    return watched(withDeadline(reply, this.#conn.callTimeoutMs, 'a redis call', () => this.#conn.overdue(reply)))
  }

  snapshot(keys: readonly string[]): Promise<Snapshot> {
    return watched(this.#waited(() => this.#epochs.snapshot(keys)))
  }

  snapshotEach(reads: readonly EpochRead[]): Promise<Snapshots> {
    return watched(this.#waited(() => this.#epochs.snapshotEach(reads)))
  }

  authorize(input: AuthorizeInput): Promise<AuthorizeResult> {
    return watched(this.#authorizer.authorize(input))
  }

  loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean, reconciledSeq?: number): Promise<'ok' | 'stale'> {
    return watched(this.#waited(() => this.#credits.loadBalance(accountId, seen, reconciled, flushCommitted, reconciledSeq)))
  }

  creditState(accountId: string): Promise<CreditCharges> {
    return watched(this.#waited(() => this.#credits.creditState(accountId)))
  }

  balance(accountId: string, reconciledSeq?: number): Promise<number | null> {
    return watched(this.#waited(() => this.#credits.balance(accountId, reconciledSeq)))
  }

  creditsChanging(accountId: string, reconciledSeq?: number): Promise<number> {
    return watched(this.#waited(() => this.#credits.creditsChanging(accountId, reconciledSeq)))
  }

  refund(accountId: string, n: number, chargedUnder: string): Promise<void> {
    return watched(this.#credits.refund(accountId, n, chargedUnder))
  }

  uncount(counterKey: string, countedUnder: string): Promise<void> {
    return watched(this.#credits.uncount(counterKey, countedUnder))
  }

  dirtyAccounts(shard: Shard): Promise<string[]> {
    return watched(this.#waited(() => this.#credits.dirtyAccounts(shard)))
  }

  beginFlush(accountId: string, newId: string, reconciledSeq?: number): Promise<BegunFlush> {
    return watched(this.#waited(() => this.#credits.beginFlush(accountId, newId, reconciledSeq)))
  }

  endFlush(accountId: string, id: string): Promise<void> {
    return watched(this.#credits.endFlush(accountId, id))
  }

  /** Connection.checkShardCount: false when Redis gave no answer in `waitMs` (operations fail until it does); throws on another count. */
  checkShardCount(waitMs: number): Promise<boolean> {
    return this.#conn.checkShardCount(waitMs)
  }

  /**
   * Throws a ConfigError when Redis refuses REDIS_URL's credentials, or the database it names (an index
   * past its `databases` setting), or is a cluster node where REDIS_CLUSTER says one Redis (or the other
   * way round): ioredis goes on after each, refused every command (a server that started and failed
   * every request) or in database 0, where other data lives. A Redis that does not
   * answer within `waitMs` is left to the outage handling, as at start.
   */
  async requireAccess(waitMs: number): Promise<void> {
    try {
      await this.#requireAccess(waitMs)
    } finally {
      this.#conn.accessChecked = true
    }
  }

  async #requireAccess(waitMs: number): Promise<void> {
    const redis = this.#conn.redis
    if (redis instanceof Cluster) return this.#requireClusterAccess(waitMs)
    const db = redis.options.db ?? 0
    let info: string
    try {
      info = await withDeadline(
        (db === 0 ? redis.ping() : redis.select(db)).then(() =>
          Promise.all([redis.info('cluster'), redis.info('memory')]).then((sections) => sections.join('\n'), () => ''),
        ),
        waitMs,
        'reaching the database of REDIS_URL',
      )
    } catch (err) {
      if (!(err instanceof ReplyError)) return
      const { message } = err as Error
      if (REFUSED_CREDENTIALS.test(message)) throw new ConfigError(`this Redis refuses REDIS_URL's credentials (${message})`)
      throw new ConfigError(`REDIS_URL names database ${db}, which this Redis refuses (${message})`)
    }
    // Its keys would be refused (MOVED) but for the slots this node serves.
    if (CLUSTER_ENABLED.test(info)) throw new ConfigError('REDIS_URL names a node of a Redis Cluster: set REDIS_CLUSTER=true')
    warnIfEvicting(info)
  }

  /**
   * Asks the seed nodes on connections of their own, the first to answer deciding: a cluster client
   * refused its credentials reports only that no seed node is available, and one given a Redis without
   * cluster mode that it cannot read the slots; either started a server that failed every call.
   */
  async #requireClusterAccess(waitMs: number): Promise<void> {
    const node = clusterNodeOptions(this.#url)
    const seeds = clusterSeeds(this.#url).map(({ host, port }) => {
      const seed = new Redis(port, host, { ...node, lazyConnect: true, connectTimeout: waitMs, maxRetriesPerRequest: 0, retryStrategy: () => null })
      seed.on('error', () => {})
      return seed
    })
    // The seed that answered, or its refusal.
    const answer = (seed: Redis) =>
      seed.cluster('INFO').then(
        () => seed,
        (err: unknown) => (err instanceof ReplyError ? (err as Error).message : Promise.reject(err)),
      )
    let refusal: string | null = null
    try {
      const first = await withDeadline(Promise.any(seeds.map(answer)), waitMs, 'reaching a node of REDIS_URL')
      if (typeof first === 'string') refusal = first
      else warnIfEvicting(await withDeadline(first.info('memory'), waitMs, 'reading INFO memory').catch(() => ''))
    } catch {
      // None answered: left to the outage handling, as at start.
      return
    } finally {
      for (const seed of seeds) seed.disconnect()
    }
    if (refusal === null) return
    if (REFUSED_CREDENTIALS.test(refusal)) throw new ConfigError(`this Redis Cluster refuses REDIS_URL's credentials (${refusal})`)
    if (CLUSTER_DISABLED.test(refusal)) throw new ConfigError('REDIS_CLUSTER=true, but REDIS_URL names a Redis that is not in cluster mode: name a cluster\'s nodes, or unset REDIS_CLUSTER')
  }

  async ping(): Promise<boolean> {
    if (!this.#conn.shardCountAllows) return false
    const redis = this.#conn.redis
    try {
      return redis instanceof Cluster ? await clusterServes(redis) : (await redis.ping()) === 'PONG'
    } catch {
      return false
    }
  }

  async close(): Promise<void> {
    this.#conn.redis.disconnect()
  }
}

/**
 * Whether a cluster serves: some master answers that its state is ok. A PING went to one node picked at
 * random: with a master down it failed readiness now and then on every instance alike (taking them out of
 * a load balancer fails the other masters' tenants too), and it passed while the cluster refused all
 * keys (cluster_state:fail, once a down master's slots count as uncovered).
 */
async function clusterServes(cluster: Cluster): Promise<boolean> {
  const masters = cluster.nodes('master')
  if (masters.length === 0) return false
  return Promise.any(
    masters.map(async (node) => {
      if (!/^cluster_state:ok\r?$/m.test(String(await node.cluster('INFO')))) throw new Error('cluster_state is not ok')
      return true
    }),
  ).catch(() => false)
}

/**
 * How long the start waits for the shard count before the server starts without it: a cluster client
 * answers nothing until it has reached the cluster and read its slots.
 */
const SHARD_COUNT_WAIT_MS = 5000

/** Redis's answers to a connection without a password it requires, or with a wrong one. */
const REFUSED_CREDENTIALS = /^(NOAUTH|WRONGPASS)\b/
/** INFO cluster of a node of a Redis Cluster; CLUSTER INFO's refusal by a Redis without cluster mode. */
const CLUSTER_ENABLED = /^cluster_enabled:1\r?$/m
const CLUSTER_DISABLED = /cluster support disabled/i
/** INFO memory's eviction policy (README, "Running Redis in production", asks for noeviction). */
const MAXMEMORY_POLICY = /^maxmemory_policy:(\S+)\r?$/m

/** Logs a Redis that would evict the service's keys when full, as INFO memory (one node's, on a cluster) tells it. */
function warnIfEvicting(info: string): void {
  const policy = MAXMEMORY_POLICY.exec(info)?.[1]
  if (policy === undefined || policy === 'noeviction') return
  log.warn(
    `redis evicts keys when it is full (maxmemory-policy ${policy}): evicted nonces let validates be replayed and evicted charges go unbilled; set maxmemory-policy noeviction`,
  )
}

/**
 * The store the settings name: Redis, a Redis Cluster (`clusterShards`), or the in-process twin without
 * REDIS_URL. `shardCountWaitMs`: tests.
 */
export async function openStore(redisUrl: string | null, clusterShards: number | null = null, shardCountWaitMs = SHARD_COUNT_WAIT_MS): Promise<Store> {
  if (!redisUrl) {
    const { MemoryStore } = await import('../memory')
    log.info('REDIS_URL is not set: rate-limit, nonce and session state is kept in this process (one instance only)')
    return new MemoryStore()
  }
  const store = new RedisStore(redisUrl, { cluster: clusterShards === null ? null : { shards: clusterShards } })
  try {
    await store.requireAccess(shardCountWaitMs)
    if (!(await store.checkShardCount(shardCountWaitMs))) {
      log.warn('redis did not confirm its shard count at start: store operations fail as in an outage until it does')
    }
  } catch (err) {
    await store.close()
    throw err
  }
  return store
}
