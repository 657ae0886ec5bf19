import { asc, inArray, lt, sql } from 'drizzle-orm'
import type { Database, DbOrTx } from '../db/client'
import { cacheInvalidations } from '../db/schema'
import { errorFields, log, logEvery } from '../lib/log'
import { keys, type Shard, type Store } from '../store/store'

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

  /** Bumps every change recorded more than SWEEP_AFTER_SECONDS ago, oldest first; how many it bumped. */
  async sweep(): Promise<number> {
    let swept = 0
    for (;;) {
      const rows = await this.database.db
        .select()
        .from(cacheInvalidations)
        .where(lt(cacheInvalidations.notedAt, sql`now() - make_interval(secs => ${SWEEP_AFTER_SECONDS})`))
        .orderBy(asc(cacheInvalidations.id))
        .limit(SWEEP_BATCH)
      if (rows.length === 0) return swept
      await this.#bumpEpochs(rows)
      await this.#delete(rows.map((row) => row.id))
      swept += rows.length
      if (rows.length < SWEEP_BATCH) return swept
    }
  }

  /** Runs sweep() every `intervalMs` until stopped; stop() also waits for the deletes under way. */
  startSweeper(intervalMs = SWEEP_EVERY_MS): { stop(): Promise<void> } {
    let running: Promise<void> = Promise.resolve()
    const pass = () => {
      running = running.then(async () => {
        try {
          const swept = await this.sweep()
          if (swept > 0) logEvery('info', 'swept cache invalidations whose own instance did not bump them', () => ({ changes: swept }))
        } catch (err) {
          logEvery('warn', 'cache invalidation sweep failed; will retry', () => errorFields(err))
        }
      })
    }
    const timer = setInterval(pass, intervalMs)
    timer.unref?.()
    return {
      stop: async () => {
        clearInterval(timer)
        await running
        await this.settled()
      },
    }
  }

  async #bumpEpochs(changes: readonly Invalidation[]): Promise<void> {
    const epochKeys: string[] = []
    for (const change of changes) {
      for (const shard of await this.shardsToBump(change.appId)) {
        for (const key of change.licenseKeys) epochKeys.push(keys.licenseEpoch(shard, key))
        if (change.app) epochKeys.push(keys.appEpoch(shard, change.appId))
      }
    }
    // An app that does not exist has no shard: no process reads its keys.
    if (epochKeys.length > 0) await this.store.bump(epochKeys)
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
