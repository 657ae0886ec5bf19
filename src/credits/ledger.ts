import { randomUUID } from 'node:crypto'
import { eq, sql } from 'drizzle-orm'
import { accounts, creditFlushes } from '../db/schema'
import type { Database, DbOrTx, Tx } from '../db/client'
import { allShards, type AuthorizeInput, keys, type Shard, type Store, STORE_CALL_TIMEOUT_MS } from '../store/store'
import { errorFields, log, logEvery } from '../lib/log'
import { countDatabaseError, isDatabaseError } from '../db/errors'
import { SingleFlight } from '../lib/single-flight'
import { type PurgeJob, Purger } from '../db/purger'
import { DeadlineExceeded, withDeadline, withTimeout } from '../lib/with-timeout'
import { limitLockWait } from '../db/commit-outcome'

/**
 * Credits on the hot path live in the store: charges take from a live balance there atomically (never
 * below zero, shared by every instance) and count as pending; a reconciler moves pending charges into
 * accounts.credits off the request path. Each flush carries an id recorded in credit_flushes in the same
 * transaction as the subtraction, so a flush retried after a crash is applied once.
 *
 * What a store data loss can cost: the charges still pending (taken since the last flush began, at most
 * one RECONCILE_MS and one flush ago), and nothing more. A flush takes its charges from the store only
 * while it holds the account's row lock and a balance is seeded only under that lock, so a balance
 * reloaded after the loss never misses a flush that was under way (its amount is in the transaction,
 * not only in the store).
 *
 * A store that comes back from an older copy of its data (not empty, only behind) would hold charges a
 * flush already moved, or a balance an addition of credits dropped since. Each flush and each addition
 * takes the account's next credit sequence number in the store, and its transaction records it in
 * accounts.credit_seq: a store whose number is lower is behind, which a flush (under the row lock)
 * or a seed finds, and what it holds of the account's credits goes. A request refused for want of
 * credits puts its account in the dirty set, so a balance hiding credits added is found by the next
 * flush pass too, not only one that charges.
 */

/** How often pending charges move to PostgreSQL: the most a store that loses its data can lose of them. */
export const RECONCILE_MS = 500

/** How long stopping the reconciler waits for the last pass of each shard (a server's shutdown waits on it). */
const STOP_WAIT_MS = 5_000

/** An authorize call that only charges: no cached state to check, no limit, no nonce. */
const CHARGE_ONLY: Omit<AuthorizeInput, 'nowMs' | 'shard' | 'generation' | 'charge'> = { epochs: [], ceiling: null, buckets: [], nonce: null, deny: false }

/** An account's row as the ledger reads it: its reconciled balance and the credit sequence recorded with it. */
export interface Reconciled {
  credits: number
  creditSeq: number
}

/**
 * The credit ledger of one server: live balances in the store, reconciled ones in PostgreSQL, and
 * the reconciler that moves charges from the first to the second. Built by boot, held by the context.
 */
export class CreditLedger {
  readonly #database: Database
  readonly #store: Store
  readonly #seeds = new SingleFlight<void>()
  /** The shards, each flushed apart from the others (a Redis Cluster's nodes answer apart). */
  readonly #shards: Shard[]
  /** By shard: when a flush pass last moved every pending charge (or found none); the start until the first. */
  readonly #flushedAt: Map<Shard, number>
  /** The account flush last queued (#oneAtATime). */
  #lastFlush: Promise<unknown> = Promise.resolve()

  constructor(storage: { database: Database; store: Store }) {
    this.#database = storage.database
    this.#store = storage.store
    this.#shards = allShards(storage.store.shards)
    // performance.now(): durations in this process, which a wall clock stepped back would make negative.
    this.#flushedAt = new Map(this.#shards.map((shard) => [shard, performance.now()]))
  }

  /** Seeds the live balance from PostgreSQL; the requests of one account that find it missing share one load. */
  loadLiveBalance(accountId: string): Promise<void> {
    return this.#seeds.run(accountId, () => this.#seedBalance(accountId))
  }

  // Retried when addCredits or a flush changed the account between the store read and the seed.
  async #seedBalance(accountId: string): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      const seen = await this.#store.creditState(accountId)
      const done = await this.#database.db.transaction(async (tx) => {
        // A row another session holds fails the seed at the lock wait (its validates answer as in an
        // outage) instead of holding them for as long as that session keeps it.
        await limitLockWait(tx)
        // A share lock waits for a flush under way (it holds the row for update), and none can start
        // until the balance is seeded: the reconciled balance read here and the store agree on it.
        const [row] = await tx
          .select({ credits: accounts.credits, creditSeq: accounts.creditSeq })
          .from(accounts)
          .where(eq(accounts.id, accountId))
          .for('share')
        const committed = await flushCommitted(tx, seen.flushId)
        return this.#store.loadBalance(accountId, seen, row?.credits ?? 0, committed, row?.creditSeq ?? 0)
      })
      if (done === 'ok') return
    }
    throw new Error('account credits kept changing while loading the live balance')
  }

  /**
   * What the account can spend, as the next seed would load it: PostgreSQL's balance, read under the
   * caller's row lock as `reconciled`, minus the charges the store holds and PostgreSQL has not taken yet.
   * For a change of the balance, under that lock and after creditsChanging (which dropped the charges of
   * a store behind PostgreSQL): no charge can then be made, nor a flush taken into PostgreSQL, before it
   * commits.
   */
  async spendable(tx: Tx, accountId: string, reconciled: number): Promise<number> {
    const state = await this.#store.creditState(accountId)
    const inflight = (await flushCommitted(tx, state.flushId)) ? 0 : state.flushing
    return Math.max(0, reconciled - state.pending - inflight)
  }

  /**
   * The balance a caller may spend now: the live one, loaded first when missing (a change of the
   * account's credits drops it, and one that failed left it so: the reconciled balance alone would
   * count the charges not flushed yet as unspent), else, while the store does not answer, the
   * reconciled one.
   */
  async currentBalance(accountId: string, reconciled?: Reconciled): Promise<number> {
    const [row] = reconciled
      ? [reconciled]
      : await this.#database.db
          .select({ credits: accounts.credits, creditSeq: accounts.creditSeq })
          .from(accounts)
          .where(eq(accounts.id, accountId))
          .limit(1)
    // While the store is unreachable the reconciled balance is the best answer there is (charges not
    // yet flushed are missing from it); a read must not fail for that.
    const live = () => this.#store.balance(accountId, row?.creditSeq ?? 0).catch(() => null)
    const loaded = (await live()) ?? (await this.loadLiveBalance(accountId).then(live, () => null))
    return loaded ?? row?.credits ?? 0
  }

  /**
   * Takes `cost` credits from the live balance for a Developer API action (an offline file): the
   * authorize script's charge alone, so it is atomic with every instance's charges and never goes
   * below zero. Null when the balance is short, else the store generation it was made under, which
   * `refund` takes to give it back if the action then fails. `nowMs` is the caller's clock, which the
   * store's expiries run on.
   */
  async charge(accountId: string, cost: number, nowMs: number): Promise<{ chargedUnder: string } | null> {
    const shard = this.#store.shardOf(accountId)
    let { generation } = await this.#generation(shard, accountId)
    for (let attempt = 0; attempt < 5; attempt++) {
      const charge = { accountId, cost, counter: null }
      const result = await this.#store.authorize({ ...CHARGE_ONLY, nowMs, shard, generation, charge })
      if (result.kind === 'ok') return { chargedUnder: result.chargedUnder }
      if (result.kind === 'no_credits') return null
      if (result.kind === 'no_balance') await this.loadLiveBalance(accountId)
      else if (result.kind === 'new_generation') generation = result.generation
      else throw new Error(`unexpected credit charge answer: ${result.kind}`)
    }
    throw new Error('the credit charge kept being retried')
  }

  /**
   * Gives back what `charge` (or a validate's authorize call) took for an action that then failed.
   * Never throws and waits at most a store call's deadline: the client must learn of its action's own
   * failure (a 409 seats_full, say), not of the refund's. A refund that does not reach the store is
   * logged and not retried: the store's refund carries no id, so a retry after a lost reply could
   * give the credits back twice.
   */
  async refund(accountId: string, cost: number, chargedUnder: string): Promise<void> {
    try {
      await withDeadline(this.#store.refund(accountId, cost, chargedUnder), STORE_CALL_TIMEOUT_MS, 'refund')
    } catch (err) {
      // A line each: each names credits an operator may want to give back by hand.
      log.warn('a refund failed or missed its deadline: the failed action may stay charged', { accountId, cost, ...errorFields(err) })
    }
  }

  /** Takes back a failed heartbeat's count (Credits.uncount); like refund, never throws and is not retried. */
  async uncount(counterKey: string, countedUnder: string): Promise<void> {
    try {
      await withDeadline(this.#store.uncount(counterKey, countedUnder), STORE_CALL_TIMEOUT_MS, 'uncount')
    } catch (err) {
      log.warn('the heartbeat count of a failed call was not given back: the next charged heartbeat comes one call early', errorFields(err))
    }
  }

  // The generation the charge is made under; a charge has no cached state, so any current one will do.
  // Read in the account's shard, by its epoch key: a snapshot names its shard by its keys.
  async #generation(shard: Shard, accountId: string): Promise<{ generation: number }> {
    return this.#store.snapshot([keys.accountEpoch(shard, accountId)])
  }

  /**
   * One reconciliation pass over every shard's accounts with pending charges, the shards side by side:
   * a Redis Cluster node that stops answering holds up the flushes of its own shards' accounts, never
   * the others'. One account's failure is logged and retried next pass without holding up the rest of
   * its shard; charges of a deleted account are dropped.
   */
  async flush(): Promise<void> {
    await Promise.all(this.#shards.map((shard) => this.#flushShard(shard)))
  }

  async #flushShard(shard: Shard): Promise<void> {
    const started = performance.now()
    let accountIds: string[]
    try {
      accountIds = await this.#store.dirtyAccounts(shard)
    } catch (err) {
      logEvery('warn', 'credit reconciliation failed; will retry', () => errorFields(err))
      return
    }
    let failed = false
    for (const accountId of accountIds) {
      try {
        await this.#flushAccount(accountId)
      } catch (err) {
        failed = true
        if (isDatabaseError(err)) countDatabaseError(err)
        logEvery('warn', 'credit flush failed for an account; will retry', () => ({ accountId, ...errorFields(err) }))
        // The shard's Redis is not answering: each of its other accounts would wait out a deadline too,
        // and the other shards' flushes wait behind them (#oneAtATime). They go in a later pass.
        if (err instanceof DeadlineExceeded) break
      }
    }
    if (!failed) this.#flushedAt.set(shard, started)
  }

  /**
   * Seconds since the start of the oldest of the shards' last flush passes that left no charge behind:
   * every charge older than this is in PostgreSQL, and a store losing its data now would lose at most
   * this much of them.
   */
  flushLagSeconds(): number {
    return (performance.now() - Math.min(...this.#flushedAt.values())) / 1000
  }

  /**
   * Account flushes' transactions run one at a time, whatever their shards: each holds a database
   * connection, and the shards' passes side by side would take as many from the requests. A Redis node
   * that stops answering holds the next one up for one store call's deadline at most (RedisStore).
   */
  #oneAtATime<T>(work: () => Promise<T>): Promise<T> {
    const run = this.#lastFlush.then(work, work)
    this.#lastFlush = run.then(
      () => undefined,
      () => undefined,
    )
    return run
  }

  /**
   * A flush left by another instance (one that crashed, or is at it now) is applied first, under its id;
   * the charges pending beside it then go in a flush of this pass's own, so a pass that succeeds leaves
   * none of them behind (flushLagSeconds counts on it).
   */
  async #flushAccount(accountId: string): Promise<void> {
    for (let flushes = 0; flushes < 2; flushes++) {
      const newId = randomUUID()
      const flushId = await this.#applyFlush(accountId, newId)
      await this.#store.endFlush(accountId, flushId)
      if (flushId === newId || flushId === '') return
    }
  }

  /** Moves the account's flush (the one left unfinished, or a new one under `newId`) into PostgreSQL; its id, '' when none. */
  #applyFlush(accountId: string, newId: string): Promise<string> {
    return this.#oneAtATime(() => this.#database.db.transaction(async (tx) => {
      // A row another session holds fails this account's flush at the lock wait, for the next pass:
      // every account's flushes run one after another, and would all wait behind it.
      await limitLockWait(tx)
      // The row lock orders this flush against addCredits and against a balance seed (#seedBalance): the
      // charges leave the store only once no seed can read the balance without them.
      const [account] = await tx
        .select({ creditSeq: accounts.creditSeq })
        .from(accounts)
        .where(eq(accounts.id, accountId))
        .for('no key update')
      const flush = await this.#store.beginFlush(accountId, newId, account?.creditSeq ?? 0)
      if (flush === 'behind') {
        logEvery('warn', "the store holds older credit data than PostgreSQL (it came back from an older copy): an account's live balance is seeded again, and its charges not yet moved are dropped", () => ({ accountId }))
        return ''
      }
      if (!flush || !account) return flush?.id ?? ''
      const inserted = await tx
        .insert(creditFlushes)
        // The time of the insert, taken under the row lock, not of the transaction's start: an account's
        // records are then in the order its flushes ran, which settledFlushes relies on.
        .values({ id: flush.id, accountId, amount: flush.amount, createdAt: sql`clock_timestamp()` })
        .onConflictDoNothing()
        .returning({ id: creditFlushes.id })
      if (inserted.length > 0) {
        await tx
          .update(accounts)
          .set({
            // Refunds of charges flushed before a top-up to the ceiling would carry it past (addCredits).
            credits: sql`LEAST(${Number.MAX_SAFE_INTEGER}, GREATEST(0, ${accounts.credits} - ${flush.amount}))`,
            creditSeq: sql`GREATEST(${accounts.creditSeq}, ${flush.seq})`,
          })
          .where(eq(accounts.id, accountId))
      }
      return flush.id
    }))
  }

  /**
   * Flushes every shard each `intervalMs` until stopped, each shard's passes one after another and apart
   * from the other shards'. stop() runs a last pass of each, waiting at most `stopWaitMs` for a shard
   * whose store does not answer: what it leaves is still pending in the store, for the next pass of any
   * instance (a flush begun and not finished is retried under its id, never doubled).
   */
  startReconciler(intervalMs = RECONCILE_MS, stopWaitMs = STOP_WAIT_MS): { stop(): Promise<void> } {
    const purger = new Purger(this.#database.db, settledFlushes)
    purger.start()
    const running = new Map<Shard, Promise<void>>()
    const pass = (shard: Shard) => {
      const previous = running.get(shard)
      if (previous) return previous
      const current = this.#flushShard(shard).finally(() => running.delete(shard))
      running.set(shard, current)
      return current
    }
    const timer = setInterval(() => {
      for (const shard of this.#shards) void pass(shard)
    }, intervalMs)
    timer.unref?.()
    return {
      stop: async () => {
        clearInterval(timer)
        await purger.stop()
        const last = Promise.all(this.#shards.map(async (shard) => {
          await running.get(shard)
          await pass(shard)
        }))
        if ((await withTimeout(last, stopWaitMs)) === null)
          log.warn('stopped with credit flushes still waiting on the store; their charges stay pending there for the next pass', {
            shards: running.size,
          })
      },
    }
  }
}

/** How long a flush's idempotency record is kept once a newer flush of its account is recorded. */
const FLUSH_RECORD_HOURS = 1

/**
 * Flush records no store can still name: a flush begins in the store only once the one before it
 * ended, so each account's newest record (by the time of its insert, under the account's row lock) is
 * the only one an unfinished flush may be, and stays. The older ones go after FLUSH_RECORD_HOURS; a busy
 * account writes two a second. (A database clock stepped back between two flushes of an account could
 * misorder them; servers slew their clocks.)
 */
export const settledFlushes: PurgeJob = {
  what: 'settled credit flush records',
  batch: (limit) => sql`
    WITH settled AS (
      SELECT f.id FROM credit_flushes f
      WHERE f.created_at < now() - make_interval(hours => ${FLUSH_RECORD_HOURS})
        AND EXISTS (SELECT 1 FROM credit_flushes g WHERE g.account_id = f.account_id AND g.created_at > f.created_at)
      ORDER BY f.created_at
      LIMIT ${limit}
    ), gone AS (
      DELETE FROM credit_flushes f USING settled WHERE f.id = settled.id RETURNING 1
    )
    SELECT count(*)::int AS n, CASE WHEN count(*) = ${limit} THEN 'more' END AS next FROM gone`,
}

/** Whether PostgreSQL holds the flush the store still has unfinished (none: false). */
async function flushCommitted(tx: DbOrTx, flushId: string | null): Promise<boolean> {
  if (!flushId) return false
  return (await tx.select({ id: creditFlushes.id }).from(creditFlushes).where(eq(creditFlushes.id, flushId))).length > 0
}
