import calculateSlot from 'cluster-key-slot'
import { Cluster, Redis, type RedisOptions, ReplyError } from 'ioredis'
import { errorFields, log, logEvery } from '../../lib/log'
import { DeadlineExceeded, withDeadline, withTimeout } from '../../lib/with-timeout'
import { storeErrors } from '../../lib/metrics'
import { allShards, keys, type Shard, STORE_CALL_TIMEOUT_MS, shardOf } from '../store'

/** A Lua script sent as a named command (EVALSHA, with one EVAL fallback after a Redis restart). */
export interface Script {
  lua: string
  /** Leading arguments that are keys; omitted when the caller passes the count first. */
  numberOfKeys?: number
  /** False for a command that is already one call per round trip: auto-pipelining would only hold it for a setImmediate. */
  pipelined?: boolean
}

export interface RedisStoreOptions {
  /** Tests: a short connect timeout and no retry storm against a stopped Redis. */
  connectTimeoutMs?: number
  /** Tests: a shorter deadline than STORE_CALL_TIMEOUT_MS. */
  callTimeoutMs?: number
  /** A Redis Cluster reached through the seed nodes of the URL(s), its accounts spread over this many shards. */
  cluster?: { shards: number } | null
}

/**
 * The seed nodes of a cluster's REDIS_URL (one or more comma-separated URLs) as ioredis takes them: a
 * URL's hostname keeps an IPv6 address's brackets, which ioredis looked up as a host name (ENOTFOUND)
 * for ever.
 */
export const clusterSeeds = (urls: string) =>
  urls.split(',').map((u) => {
    const { hostname, port } = new URL(u.trim())
    return { host: hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(port || 6379) }
  })

/** What every node of a cluster is reached with: the first seed URL's credentials and TLS. */
export function clusterNodeOptions(urls: string): Pick<RedisOptions, 'username' | 'password' | 'tls'> {
  const first = new URL(urls.split(',')[0]!.trim())
  return {
    username: decodeURIComponent(first.username) || undefined,
    password: decodeURIComponent(first.password) || undefined,
    tls: first.protocol === 'rediss:' ? {} : undefined,
  }
}

function clusterClient(urls: string, options: RedisOptions & { enableAutoPipelining: boolean; autoPipeliningIgnoredCommands: string[] }) {
  const { enableAutoPipelining, autoPipeliningIgnoredCommands, ...redisOptions } = options
  return new Cluster(
    clusterSeeds(urls),
    {
      enableAutoPipelining,
      autoPipeliningIgnoredCommands,
      // Every read from the masters: a replica may lag behind an epoch bump or a charge.
      scaleReads: 'master',
      redisOptions: { ...redisOptions, ...clusterNodeOptions(urls) },
      clusterRetryStrategy: (times) => Math.min(times * 200, 2000),
      // A node's connection that drops fails the calls on it; by default they were sent again once the
      // slots were read anew, as a lone connection would resend them (see autoResendUnfulfilledCommands).
      retryDelayOnFailover: 0,
    },
  )
}

/** How often a connection with an overdue call asks Redis, on one of its own, whether it answers at all. */
const OVERDUE_CHECK_EVERY_MS = 2_000
/** How long the check's answer is given to be followed by the overdue call's, sent earlier on the other connection. */
const OVERDUE_GRACE_MS = 200

/**
 * The one ioredis client of a RedisStore (a connection, or a Redis Cluster client with one per node),
 * with its scripts as commands, and what every concern of the store shares about it: the shards, the
 * store generation and failing fast while the connection is lost.
 */
export class Connection<Commands extends object = object> {
  readonly redis: (Redis | Cluster) & Commands
  /** How many shards the accounts are spread over: 1 on a single Redis. */
  readonly shards: number
  /** STORE_CALL_TIMEOUT_MS, or the test's: the deadline of the calls that have one (authorize.ts, RedisStore). */
  readonly callTimeoutMs: number
  /** Snapshot.generation: this process's name for the store contents its callers' epochs were read from. */
  #generation = 1
  /**
   * Whether the start's access check (RedisStore.requireAccess) has run: until then a reply refusing the
   * connection's handshake (a database number, credentials) is the check's to report, as one setting line.
   */
  accessChecked = false
  /** Each shard's generation value (keys.generation) read under #generation; a shard is missing until read on the current connections. */
  readonly #seen = new Map<Shard, string>()
  /**
   * Whether the shard count the store's keys were written with is this instance's (checkShardCount):
   * 'pending' while no record could be read, 'refused' once one held another. Either way every
   * operation fails as in an outage. 'unknown' until a check is asked for (tests, tools).
   */
  #shardCount: 'unknown' | 'pending' | 'matches' | 'refused' = 'unknown'
  #recordedShardCount = ''
  /** Set when the check at start got no answer: the one that comes later is logged. */
  #announceShardCount = false
  /** A connection dropped since the last generation read: the next one checks the shard count again. */
  #connectionLost = false
  /**
   * On a cluster, the nodes that served each shard's slot at its last read (#checkMaster), its master
   * first, then its replicas. Kept across another shard's loss: which node serves a shard is not what was
   * read from it, and a shard whose record went would have its next failover go uncounted (#shardDrops).
   */
  readonly #servedBy = new Map<Shard, readonly string[]>()
  /** Each cluster node's role at the last read of a shard it served, forgotten when it drops or is taken over: for #checkMaster to tell a move. */
  readonly #roles = new Map<string, 'master' | 'replica'>()
  /**
   * How many times the connection dropped (#lost), and on a cluster, how many times each shard's data
   * may have been lost since (#shardLost: the node serving it dropped, or a replica took its slot over).
   * A call's reply came on the connection of its time: across a drop, the server may be another
   * (restarted from an older copy of its data, a replica promoted) whose data never had what the call
   * wrote, though it kept `ls:gen`. Counted per shard, a failover drops only its own shards' refunds.
   */
  #drops = 0
  readonly #shardDrops = new Map<Shard, number>()
  /** Calls on one Redis that went past their deadline and are still unanswered (overdue). */
  #overdueCalls = 0
  /** Set while #checkOverdue asks aside. */
  #checking = false
  /** One Redis's URL, for the check's connection of its own. */
  readonly #url: string
  readonly #connectTimeoutMs: number

  constructor(url: string, options: RedisStoreOptions, scripts: { [name in keyof Commands]: Script }) {
    this.#url = url
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 2000
    const named = Object.entries(scripts) as [string, Script][]
    // A cluster client places an auto-pipelined command by its first argument, which is the key count
    // for a script that takes its count first: those go on their own, placed by their first key.
    const alone = ([, s]: [string, Script]) => s.pipelined === false || (!!options.cluster && s.numberOfKeys === undefined)
    const common = {
      lazyConnect: false,
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: named.filter(alone).map(([name]) => name),
      connectTimeout: this.#connectTimeoutMs,
      // Fail a command fast while Redis is down instead of queueing it for ever; reconnect in the background.
      maxRetriesPerRequest: 1,
      // A call whose connection dropped before its reply may have run: sent again it would run twice (a
      // refund give the credits back twice, an authorize call charge and count twice). It fails, as in
      // an outage (the patch in patches/ fails it at once instead of leaving it unsettled).
      autoResendUnfulfilledCommands: false,
    }
    this.shards = options.cluster?.shards ?? 1
    this.callTimeoutMs = options.callTimeoutMs ?? STORE_CALL_TIMEOUT_MS
    const redis = options.cluster
      ? clusterClient(url, common)
      : new Redis(url, { ...common, retryStrategy: (times) => Math.min(times * 200, 2000) })
    redis.on('error', (err: Error) => {
      storeErrors.add('connection')
      if (!this.accessChecked && err instanceof ReplyError) return
      // What is wrong (refused, unknown host, credentials), once every 10 s: the failures it causes say only that Redis is unreachable.
      logEvery('warn', 'redis connection error', () => errorFields(err))
    })
    // A new connection may reach a server that restarted with older data or a replica that lost writes
    // while keeping its generation key: whatever was read before it is suspect. A cluster client drops a
    // node's connection ('-node') when it fails or leaves; it closes when it has none left.
    redis.on('close', () => this.#lost())
    if (redis instanceof Cluster) redis.on('-node', (node: Redis) => this.#nodeLost(`${node.options.host}:${node.options.port}`))
    for (const [name, { lua, numberOfKeys }] of named) redis.defineCommand(name, { lua, numberOfKeys })
    this.redis = redis as (Redis | Cluster) & Commands
  }

  shardOf(accountId: string): Shard {
    return shardOf(accountId, this.shards)
  }

  get generation(): number {
    return this.#generation
  }

  /** What a call checked against the shard's generation key sends as the value it expects ('' before the first read). */
  storeGeneration(shard: Shard): string {
    return this.#seen.get(shard) ?? ''
  }

  /**
   * The generation a read of a shard's generation key belongs to. A reply to a call sent before a
   * connection dropped keeps its old generation, which callers no longer accept. A shard read for the
   * first time changes nothing (nothing was read from it before); a changed value starts a new
   * generation for the whole process, since the registry's entries are not kept per shard.
   */
  observe(shard: Shard, seen: string, sentAt: number): number {
    this.#checkMaster(shard)
    if (sentAt !== this.#generation) return sentAt
    const known = this.#seen.get(shard)
    if (known !== seen) {
      if (known !== undefined) this.#generation++
      // A new generation, or the first read since a connection dropped (a restart, a failover): the
      // data lost may have held the recorded shard count. It is recorded again, unless an instance with
      // another count did so first, which refuses this one's operations from then on.
      if ((known !== undefined || this.#connectionLost) && this.#shardCount === 'matches') void this.#askShardCount()
      this.#connectionLost = false
      this.#seen.set(shard, seen)
    }
    return this.#generation
  }

  /**
   * A cluster node's connection dropped. Only one that served a shard read since it last dropped held
   * anything this process relies on: a master that stays down is connected to again by each call for
   * its slots, and each failure drops it again, which must not start generation after generation and
   * fail every other shard's calls in flight each time.
   */
  #nodeLost(node: string): void {
    // Whatever it was, it is read afresh: it may come back as a replica (#checkMaster).
    this.#roles.delete(node)
    const served = [...this.#servedBy].filter(([, nodes]) => nodes[0] === node)
    if (served.length === 0) return
    for (const [shard, known] of served) {
      // ioredis drops a node left without slots after writing the table that moved them (a reshard
      // that emptied a master): a shard whose slot went to another master went whole.
      const now = (this.redis as Cluster).slots[calculateSlot(shard)]
      if (now?.[0] !== undefined && now[0] !== node && this.#movedTo(known, now)) {
        this.#servedBy.set(shard, [...now])
        continue
      }
      this.#shardLost(shard)
      // Read again before the node counts for it: its failures while it stays down are not new losses.
      this.#servedBy.delete(shard)
    }
    this.#forgetReads()
  }

  /** Whether a shard served by `known` (master first) and now by `now` was moved whole, not taken over (#checkMaster). */
  #movedTo(known: readonly string[], now: readonly string[]): boolean {
    return this.#roles.get(now[0] as string) === 'master' && !known.includes(now[0] as string) && !now.includes(known[0] as string)
  }

  /** The mark of a charge made now on the shard (chargedUnder): it no longer matches once the data may have lost it. */
  dropsOf(shard: Shard): number {
    return this.#drops + (this.#shardDrops.get(shard) ?? 0)
  }

  #lost(): void {
    this.#drops++
    this.#forgetReads()
  }

  #shardLost(shard: Shard): void {
    this.#shardDrops.set(shard, (this.#shardDrops.get(shard) ?? 0) + 1)
  }

  #forgetReads(): void {
    this.#connectionLost = true
    this.#generation++
    this.#seen.clear()
  }

  /**
   * On a cluster, a shard served by another node than when it was last read: a failover (to a replica
   * that may have missed writes, while the old master turned replica keeps its connections, so no node
   * was dropped) or its slot moved. Whatever was read from the old node is suspect, as after a dropped
   * connection. The client learns of a new master before a reply from it (a MOVED redirect, a refresh of
   * the slots), so the reply that first shows it is not trusted either.
   *
   * A slot moved (a reshard) takes its keys along whole, so its charges are still there to refund: only
   * a takeover by a replica counts as a loss of the shard's data. A move is told apart by its new master
   * having been a master at the last read of a shard it served (and not dropped or taken over since), being
   * no replica of this one, and the old master not turning replica of the new: anything else (a master never
   * read from, as a new empty master is at the first slot a reshard gives it) is taken for a failover.
   */
  #checkMaster(shard: Shard): void {
    if (!(this.redis instanceof Cluster)) return
    const nodes = this.redis.slots[calculateSlot(shard)]
    const node = nodes?.[0]
    if (nodes === undefined || node === undefined) return
    const known = this.#servedBy.get(shard)
    if (known !== undefined && known[0] !== node) {
      if (!this.#movedTo(known, nodes)) {
        this.#shardLost(shard)
        // Taken over: it may come back as another master's replica, which a later takeover must not read as a move.
        this.#roles.delete(known[0] as string)
      }
      this.#forgetReads()
    }
    this.#servedBy.set(shard, [...nodes])
    for (const [i, served] of nodes.entries()) this.#roles.set(served, i === 0 ? 'master' : 'replica')
  }

  /**
   * While a lost connection is being re-established, every operation fails at once instead of waiting
   * for a reconnect attempt (seconds each): the hot path fails open or closed, a Developer API request
   * goes unlimited, a cache bump is retried in the background, a credit flush waits for the next pass.
   * Before the first connect, commands queue.
   */
  failFastWhenLost(): void {
    if (this.redis.status === 'reconnecting' || this.redis.status === 'close') {
      throw new Error(`redis connection ${this.redis.status}`)
    }
    if (!this.shardCountAllows) throw new Error(`redis shard count ${this.#shardCount === 'pending' ? 'not checked yet' : "is not this instance's"}`)
  }

  /**
   * A call that went past its deadline unanswered. On one Redis, replies come in the order the calls
   * went, so until it is answered (or fails with its connection) none sent after it would be answered
   * sooner: `stalled` refuses them meanwhile instead of letting each wait out its own deadline. A
   * cluster's nodes answer apart, and which one holds the call is not tracked here.
   */
  overdue(reply: Promise<unknown>): void {
    if (this.redis instanceof Cluster) return
    this.#overdueCalls++
    const answered = () => {
      this.#overdueCalls--
    }
    reply.then(answered, answered)
    this.#checkOverdue()
  }

  /**
   * While a call is overdue, asks Redis on a connection of its own whether it answers (a script that
   * does nothing), every OVERDUE_CHECK_EVERY_MS. Redis runs one command at a time: answering one sent
   * after the overdue call while that call still has no answer, it never got the call or its answer was
   * lost on the way.
   * The connection is dead without a reset (a NAT or load balancer that forgot the flow, a network that
   * drops its packets), and TCP would hold every call on it for as long as it retransmits, up to 15
   * minutes: it is closed, and ioredis connects again. A check without an answer either is Redis busy,
   * paused or unreachable, where a new connection would do no better: the check asks again.
   */
  #checkOverdue(): void {
    if (this.#checking) return
    this.#checking = true
    void (async () => {
      try {
        while (this.#overdueCalls > 0 && this.redis.status === 'ready') {
          await Bun.sleep(OVERDUE_CHECK_EVERY_MS)
          if (this.#overdueCalls === 0 || !(await this.#answersAside())) continue
          // The overdue call's answer may have been on its way beside the check's.
          await Bun.sleep(OVERDUE_GRACE_MS)
          if (this.#overdueCalls === 0 || this.redis.status !== 'ready') continue
          log.warn('redis answers on a new connection but not on the one a call is overdue on: that connection is closed and opened again')
          this.redis.disconnect(true)
        }
      } finally {
        this.#checking = false
      }
    })()
  }

  async #answersAside(): Promise<boolean> {
    const aside = new Redis(this.#url, {
      lazyConnect: true,
      connectTimeout: this.#connectTimeoutMs,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    })
    aside.on('error', () => {})
    try {
      // A script, as the overdue call is: a Redis that holds scripts back (CLIENT PAUSE WRITE, a failover
      // under way) holds this one too, where it would answer a PING.
      await withDeadline(aside.eval('return 1', 0), this.callTimeoutMs, 'the check on an overdue redis call')
      return true
    } catch {
      return false
    } finally {
      aside.disconnect()
    }
  }

  /**
   * The error to fail a call with at once while a call on one Redis is overdue (see overdue), else null:
   * the call would pass its own deadline, so it fails as if it had.
   */
  stalled(): Error | null {
    return this.#overdueCalls > 0 ? new DeadlineExceeded(`redis has not answered a call in ${this.callTimeoutMs} ms`) : null
  }

  /** False while a shard count check has no answer yet, or after one found another count (checkShardCount). */
  get shardCountAllows(): boolean {
    return this.#shardCount === 'unknown' || this.#shardCount === 'matches'
  }

  /**
   * Refuses to work beside instances that spread accounts over another number of shards: their keys of
   * one account would not meet (a nonce claimed twice, two balances). The first instance records its
   * count in every shard (keys.shardCountIn); another throws ShardCountMismatch. Without an answer from
   * any record within `waitMs` (Redis unreachable, or a cluster not ready, whose client holds commands
   * until it is) it returns false, and every operation fails as in an outage until one is answered.
   * Records not answered (a cluster master down: its own shards fail meanwhile) are asked again each
   * second; a mismatch found later is logged and refuses every operation until a restart.
   */
  async checkShardCount(waitMs: number): Promise<boolean> {
    this.#shardCount = 'pending'
    await withTimeout(this.#askShardCount(), waitMs)
    if (this.#shardCount === 'pending') {
      this.#announceShardCount = true
      return false
    }
    if (this.#shardCount === 'refused') throw this.#mismatch()
    return true
  }

  /** Where the count is recorded: each shard, and the key instances before the per-shard records wrote alone. */
  #shardCountRecords(): string[] {
    const records = allShards(this.shards).map(keys.shardCountIn)
    return records.includes(keys.shardCount) ? records : [keys.shardCount, ...records]
  }

  /** Reads (writing its own where missing) each record; those that fail are asked again a second later. */
  #askShardCount(records = this.#shardCountRecords()): Promise<void> {
    const mine = String(this.shards)
    const unanswered: string[] = []
    const ask = async (key: string) => {
      try {
        await this.redis.set(key, mine, 'NX')
        this.#shardCountRead((await this.redis.get(key)) ?? mine)
      } catch (err) {
        unanswered.push(key)
        logEvery('warn', 'redis shard count not checked yet: store operations fail as in an outage until it is', () => errorFields(err))
      }
    }
    return Promise.all(records.map(ask)).then(() => {
      // A closed store stops asking.
      if (unanswered.length > 0 && this.redis.status !== 'end') setTimeout(() => void this.#askShardCount(unanswered), 1000).unref()
    })
  }

  /** One record's count: any other than this instance's refuses every operation, until a restart. */
  #shardCountRead(recorded: string): void {
    const was = this.#shardCount
    if (was === 'refused') return
    this.#recordedShardCount = recorded
    this.#shardCount = recorded === String(this.shards) ? 'matches' : 'refused'
    // Reported here when no caller hears of it: a late answer to the check at start, or a check again.
    if (this.#shardCount === 'refused' && (this.#announceShardCount || was === 'matches'))
      log.error('store operations fail until this instance runs with the shard count the store was written with', errorFields(this.#mismatch()))
    else if (this.#shardCount === 'matches' && was === 'pending' && this.#announceShardCount) log.info('redis answered: its shard count is this instance\'s, store operations resume')
  }

  #mismatch(): ShardCountMismatch {
    return new ShardCountMismatch(this.#recordedShardCount, String(this.shards))
  }
}

/** The store's keys were written with another shard count than this instance's. */
class ShardCountMismatch extends Error {
  constructor(recorded: string, mine: string) {
    super(
      `this store's keys were written with ${recorded} shard(s) and this instance uses ${mine} (REDIS_CLUSTER, REDIS_CLUSTER_SHARDS): every instance must use the same`,
    )
  }
}
