import { and, asc, gt, inArray, lt, sql } from 'drizzle-orm'
import type { Database, DbOrTx } from '../db/client'
import { cacheInvalidations } from '../db/schema'
import { errorFields, log, logEvery } from '../lib/log'
import { keys, type Shard, type Store } from '../store/store'
import { withTimeout } from '../lib/with-timeout'

/** What a change of one app touched of what the processes cache. */
export interface Invalidation {
  appId: string
  /** The app's own entry: its row (settings, lists, variables), its active signing key, its webhooks. */
  app: boolean
  licenseKeys: readonly string[]
}

/** An invalidation as its change's transaction recorded it (a row of cache_invalidations). */
export interface NotedInvalidation extends Invalidation {
  id: number
}

/**
 * Records, in the transaction of the change, which cached entries it touched: the row outlives the
 * process that made the change, so its bump cannot be lost with it. Null when it touched none.
 */
export async function noteInvalidation(tx: DbOrTx, change: Invalidation): Promise<NotedInvalidation | null> {
  if (!change.app && change.licenseKeys.length === 0) return null
  const [row] = await tx
    .insert(cacheInvalidations)
    .values({ appId: change.appId, app: change.app, licenseKeys: [...change.licenseKeys] })
    .returning({ id: cacheInvalidations.id })
  if (!row) throw new Error('cache invalidation insert returned nothing')
  return { ...change, id: row.id }
}

/** How long the instance that made a change has to bump it before any instance's sweep does. */
export const SWEEP_AFTER_SECONDS = 1
const SWEEP_EVERY_MS = 1000
/** How long a stopping server waits for the sweep under way (see startSweeper). */
const SWEEP_STOP_WAIT_MS = 5000
const SWEEP_BATCH = 500

/**
 * Bumps the store's epochs of entries whose data changed: every process's actors then find their copy
 * stale at its next use (the store script compares epochs on every client request), which is what keeps
 * the caches of several processes honest. The change's transaction recorded what it touched
 * (noteInvalidation); `bump` runs after the commit and has that record deleted once the store has the
 * bump. A store outage must not turn a committed change into an error (a client would retry and
 * duplicate it), so a failed bump is logged and left recorded: every instance's sweep bumps what was
 * recorded more than SWEEP_AFTER_SECONDS ago, so the change reaches the other instances' caches even
 * when the one that made it cannot reach the store, or stopped before it could. Meanwhile that
 * instance's client endpoints read PostgreSQL directly or fail closed. A bump made twice (a sweep
 * beside a slow writer) costs a second reload, never a stale read.
 */
export class Invalidator {
  constructor(
    private readonly database: Database,
    private readonly store: Store,
    /** The shards whose epochs a change of the app bumps (AppActors.shardsToBump). */
    private readonly shardsToBump: (appId: string) => Promise<Shard[]>,
  ) {}

  /** Records whose bump landed, waiting for #forgetSettled to delete them. */
  #settled: number[] = []
  #forgetting: Promise<void> | null = null

  /**
   * After the commit of the changes `noted` records: bumps their epochs, then has their records deleted
   * in the background. Never throws. The delete is a commit of its own (a WAL flush on a server) that
   * the change need not wait for: deletes pending together share one, and one that never happens
   * (the process stopped) costs a second bump by the sweep.
   */
  async bump(noted: readonly NotedInvalidation[]): Promise<void> {
    if (noted.length === 0) return
    try {
      await this.#bumpEpochs(noted)
    } catch (err) {
      log.warn('store unreachable: cache invalidation left to the sweep', { changes: noted.length, ...errorFields(err) })
      return
    }
    for (const { id } of noted) this.#settled.push(id)
    this.#forgetting ??= this.#forgetSettled()
  }

  /** Resolves once the records of the bumps made so far are deleted (or their delete failed). */
  async settled(): Promise<void> {
    while (this.#forgetting) await this.#forgetting
  }

  async #forgetSettled(): Promise<void> {
    try {
      while (this.#settled.length > 0) {
        const ids = this.#settled.splice(0)
        await this.#delete(ids).catch((err) =>
          logEvery('warn', 'cannot delete bumped cache invalidations: the sweep bumps them again', () => errorFields(err)),
        )
      }
    } finally {
      this.#forgetting = null
    }
  }

  /**
   * Bumps every change recorded more than SWEEP_AFTER_SECONDS ago, oldest first; how many it bumped.
   * Shard by shard: on a Redis Cluster a master that does not answer keeps the changes that touch its
   * shards recorded, for the next sweep, and holds up no other shard's, however many of its own are
   * ahead of them. It throws the first such failure once every other change is bumped.
   */
  async sweep(): Promise<number> {
    let swept = 0
    let after = 0
    const failed = new Map<Shard, unknown>()
    for (;;) {
      const rows = await this.database.db
        .select()
        .from(cacheInvalidations)
        .where(and(lt(cacheInvalidations.notedAt, sql`now() - make_interval(secs => ${SWEEP_AFTER_SECONDS})`), gt(cacheInvalidations.id, after)))
        .orderBy(asc(cacheInvalidations.id))
        .limit(SWEEP_BATCH)
      if (rows.length === 0) break
      after = rows[rows.length - 1]!.id
      const bumped = await this.#bumpByShard(rows, failed)
      if (bumped.length > 0) await this.#delete(bumped)
      swept += bumped.length
      if (rows.length < SWEEP_BATCH) break
    }
    const [failure] = failed.values()
    if (failed.size > 0) throw failure
    return swept
  }

  /**
   * One bump per shard the changes touch, but for the shards in `failed` (tried and failed earlier in
   * the sweep, which a failure here joins): the ids of the changes each of whose shards was bumped.
   */
  async #bumpByShard(changes: readonly NotedInvalidation[], failed: Map<Shard, unknown>): Promise<number[]> {
    const shardsOf = new Map<number, Shard[]>()
    const keysOf = new Map<Shard, string[]>()
    for (const change of changes) {
      const shards = await this.shardsToBump(change.appId)
      shardsOf.set(change.id, shards)
      for (const shard of shards) {
        let shardKeys = keysOf.get(shard)
        if (!shardKeys) keysOf.set(shard, (shardKeys = []))
        shardKeys.push(...epochKeys(change, shard))
      }
    }
    await Promise.all(
      [...keysOf].filter(([shard]) => !failed.has(shard)).map(([shard, shardKeys]) =>
        this.store.bump(shardKeys).catch((err: unknown) => {
          failed.set(shard, err)
        }),
      ),
    )
    return changes.filter((change) => shardsOf.get(change.id)!.every((shard) => !failed.has(shard))).map((change) => change.id)
  }

  /**
   * Runs sweep() every `intervalMs` until stopped, skipping a tick while the sweep before is still under
   * way: queued behind a slow PostgreSQL, sweeps piled up one a second, and a stop waited for them all.
   * stop() waits for the sweep under way and the deletes, the sweep for `stopWaitMs` at most: one held
   * by a PostgreSQL that does not answer would hold a server's stop past its supervisor's grace
   * period, and what it leaves is the next sweep's, any instance's.
   */
  startSweeper(intervalMs = SWEEP_EVERY_MS, stopWaitMs = SWEEP_STOP_WAIT_MS): { stop(): Promise<void> } {
    let running: Promise<void> | null = null
    const pass = () => {
      running ??= (async () => {
        try {
          const swept = await this.sweep()
          if (swept > 0) logEvery('info', 'swept cache invalidations whose own instance did not bump them', () => ({ changes: swept }))
        } catch (err) {
          logEvery('warn', 'cache invalidation sweep failed; will retry', () => errorFields(err))
        } finally {
          running = null
        }
      })()
    }
    const timer = setInterval(pass, intervalMs)
    timer.unref?.()
    return {
      stop: async () => {
        clearInterval(timer)
        if (running && (await withTimeout(running, stopWaitMs)) === null)
          log.warn('stopped with a cache invalidation sweep still waiting on the database; the next sweep does its work')
        await this.settled()
      },
    }
  }

  async #bumpEpochs(changes: readonly Invalidation[]): Promise<void> {
    const bumped: string[] = []
    for (const change of changes) for (const shard of await this.shardsToBump(change.appId)) bumped.push(...epochKeys(change, shard))
    // An app that does not exist has no shard: no process reads its keys.
    if (bumped.length > 0) await this.store.bump(bumped)
  }

  /**
   * A delete lost in a crash only costs a second bump, so its commit does not wait for the WAL flush:
   * a write of the Developer API pays one flush (its own commit's), not two.
   */
  async #delete(ids: readonly number[]): Promise<void> {
    await this.database.db.transaction(async (tx) => {
      await tx.execute(sql`SET LOCAL synchronous_commit TO off`)
      await tx.delete(cacheInvalidations).where(inArray(cacheInvalidations.id, [...ids]))
    })
  }
}

/** The epoch keys of what a change touched, in one shard. */
function epochKeys(change: Invalidation, shard: Shard): string[] {
  const touched = change.licenseKeys.map((key) => keys.licenseEpoch(shard, key))
  if (change.app) touched.push(keys.appEpoch(shard, change.appId))
  return touched
}
