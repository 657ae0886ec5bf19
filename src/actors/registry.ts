import type { Database, Tx } from '../db/client'
import type { EventBus } from '../delivery/outbox'
import type { Sealer } from '../lib/crypto'
import type { Store } from '../store/store'
import { SingleFlight } from '../lib/single-flight'
import { type Admission, allShards, keys, type Shard } from '../store/store'
import { errorFields, logEvery } from '../lib/log'
import { LicenseLoads, type LicenseRead } from './license-loads'
import { type ActorHost, AppActor, type Changed } from './app-actor'
import { BoundedMap, type Entry, MissBudget, SharedBound } from './bounded'
import { Invalidator } from './invalidate'
import { LicenseCache } from './license-cache'
import { CacheWarmUp } from './warm-up'
import { type CachedApp, type CachedLicense, StateLoader, StoreUnavailable } from './load'
import type { SelfbanDone, SelfbanWish } from './selfban'

/** What the registry holds at most; absent ids have a bound of their own. */
export interface ActorLimits {
  /** Actors, one per app. */
  apps: number
  /** The app entries (as estimated: load.ts appBytes) and the license records (exactly: LicenseCache) together, in bytes: CACHE_MAX_MB. */
  cacheBytes: number
  /** Absent apps, and absent licenses, each (entries, each a few hundred bytes). */
  absent: number
}

// cacheBytes here serves a registry built without settings (a test's); the server's is CACHE_MAX_MB (boot.ts).
export const ACTOR_LIMITS: ActorLimits = { apps: 10_000, cacheBytes: 256 * 2 ** 20, absent: 20_000 }
const ABSENT_APPS_PER_MINUTE = 60

/** What the actors of a process are built on. */
export interface ActorsWiring {
  database: Database
  store: Store
  /** Opens the sealed signing keys the actors hold. */
  sealer: Sealer
  bus: EventBus
  clock: () => number
}

/**
 * The actors of this process, one per app, and the rules their copies live by. Every client request
 * sends the epochs of the entries it relied on to the store script, which answers 'stale' when a
 * change (here or in another process) bumped one; the caller then reloads and retries. After a store
 * data loss epochs restart, so every entry is tied to the store generation it was read under and all
 * of them are dropped on a new one.
 */
export class AppActors {
  readonly #actors = new Map<string, AppActor>()
  /** Apps that do not exist, kept apart so made-up ids never push a real app's actor out. */
  readonly #absentApps: BoundedMap<Entry<CachedApp>>
  readonly #bound: SharedBound
  readonly #licenses: LicenseCache
  readonly #licenseLoads: LicenseLoads
  readonly #host: ActorHost
  readonly #load: StateLoader
  readonly #appLoads = new SingleFlight<void>()
  /** The shard of each app seen (on a cluster): an app's account never changes. */
  readonly #appShards: BoundedMap<Shard>
  /** Set once startWarmUp is called: the server fills its cache, the CLI and most tests do not. */
  #warmUp: CacheWarmUp | null = null
  readonly invalidator: Invalidator
  /** The store generation every entry was read under; 0 before the first read. */
  generation = 0
  /** PostgreSQL reads of app and license state since start. */
  readonly loads: { readonly apps: number; readonly licenses: number }
  readonly absentAppBudget = new MissBudget(ABSENT_APPS_PER_MINUTE, ACTOR_LIMITS.absent)

  constructor(
    private readonly wiring: ActorsWiring,
    private readonly limits: ActorLimits = ACTOR_LIMITS,
  ) {
    this.#absentApps = new BoundedMap(limits.absent)
    this.#appShards = new BoundedMap(limits.apps)
    this.#bound = new SharedBound(limits.cacheBytes, limits.absent)
    this.#licenses = new LicenseCache(limits.cacheBytes, limits.absent, () => this.#bound.bytes)
    this.invalidator = new Invalidator(wiring.database, wiring.store, (appId) => this.shardsToBump(appId))
    this.#load = new StateLoader(wiring.database, wiring.sealer)
    this.loads = this.#load.loads
    this.#host = {
      database: wiring.database,
      bus: wiring.bus,
      clock: wiring.clock,
      invalidator: this.invalidator,
      bound: this.#bound,
      licenses: this.#licenses,
    }
    this.#licenseLoads = new LicenseLoads({
      store: wiring.store,
      load: (licenseKeys) => this.#load.licenses(licenseKeys),
      loadOne: (licenseKey) => this.#load.license(licenseKey),
      keep: (appId, licenseKey, entry, generation) => {
        if (this.#accepts(generation)) this.#licenses.set(appId, licenseKey, entry)
      },
    })
  }

  /** Bytes the cached entries hold, the apps' as estimated (ActorLimits.cacheBytes bounds them). */
  get cachedBytes(): number {
    return this.#bound.bytes + this.#licenses.bytes
  }

  /**
   * The shard of the app's keys (its account's), null when there is no such app. On a cluster an app
   * not seen yet costs one indexed PostgreSQL read, before its epoch can be read; one shard needs none.
   */
  async shardOfApp(appId: string): Promise<Shard | null> {
    const { store } = this.wiring
    // One shard holds every account: no read needed to name it.
    if (store.shards === 1) return allShards(1)[0]!
    const known = this.#appShards.get(appId)
    if (known !== undefined) return known
    const accountId = this.#actors.get(appId)?.app?.value?.accountId ?? (await this.#load.accountOf(appId))
    if (accountId === null) return null
    const shard = store.shardOf(accountId)
    this.#appShards.set(appId, shard)
    return shard
  }

  /**
   * The shards a committed change of the app bumps: its own; none for an app that does not exist (no
   * process reads its keys); every shard when PostgreSQL cannot say which (a cluster's first sight of
   * the app during an outage), since a committed change must neither turn into an error, which a
   * client would retry and duplicate, nor leave another process's copy looking fresh.
   */
  async shardsToBump(appId: string): Promise<Shard[]> {
    try {
      const shard = await this.shardOfApp(appId)
      return shard === null ? [] : [shard]
    } catch (err) {
      logEvery('warn', "cannot read an app's shard: a change is published to every shard", () => errorFields(err))
      return allShards(this.wiring.store.shards)
    }
  }

  /** The app's actor, created on first use. */
  of(appId: string): AppActor {
    return this.#actors.get(appId) ?? this.#admit(appId)
  }

  #admit(appId: string, { evict = true } = {}): AppActor {
    if (evict && this.#actors.size >= this.limits.apps) this.#letOldestIdleGo()
    const actor = new AppActor(appId, this.#host)
    this.#actors.set(appId, actor)
    return actor
  }

  /**
   * Drops the oldest actor that has no work queued. A busy one moves to the back instead: letting it
   * go would let a second actor of the same app write beside it.
   */
  #letOldestIdleGo(): void {
    let tries = this.#actors.size
    for (const [appId, actor] of this.#actors) {
      this.#actors.delete(appId)
      if (actor.idle) {
        actor.setApp(undefined)
        return
      }
      this.#actors.set(appId, actor)
      if (--tries === 0) return
    }
  }

  /**
   * Runs one change of the app's data in its actor (AppActor.write). A change made by the Developer
   * API to an app that no client is using neither pushes out an app in use nor leaves an actor behind:
   * its actor stands beyond the bound while the write runs (so the registry exceeds it by at most the
   * writes under way) and goes after it unless a client request loaded state into it meanwhile.
   */
  async write<T>(appId: string, work: (tx: Tx) => Promise<T>, changed: (result: T) => Changed): Promise<T> {
    const actor = this.#actors.get(appId) ?? this.#admit(appId, { evict: false })
    try {
      return await actor.write(work, changed)
    } finally {
      if (actor.idle && actor.app === undefined && this.#actors.get(appId) === actor) {
        this.#actors.delete(appId)
      }
    }
  }

  /** The app's actor if it has one, without creating one: how the tests see that made-up ids never get an actor. */
  existing(appId: string): AppActor | undefined {
    return this.#actors.get(appId)
  }

  cachedApp(appId: string): Entry<CachedApp> | undefined {
    return this.#actors.get(appId)?.app ?? this.#absentApps.get(appId)
  }

  cachedLicense(appId: string, licenseKey: string): Entry<CachedLicense> | undefined {
    return this.#licenses.get(appId, licenseKey)
  }

  /** Drops every entry: the store answered with a newer generation than the one they were read under. */
  startOver(generation: number): void {
    // Nothing was cached before the first generation: the warm-up's first pass is under way already.
    const hadEntries = this.generation !== 0
    if (this.#adopt(generation) && hadEntries) this.#warmUp?.start()
  }

  /**
   * startOver without asking the warm-up to start again (it read the new generation itself); whether it
   * emptied the registry. Only a newer generation does: entries cached under the current one are valid
   * under it, and requests that read the older one still answer new_generation and read them again.
   */
  #adopt(generation: number): boolean {
    if (generation <= this.generation) return false
    this.#absentApps.clear()
    this.#bound.clear()
    this.#licenses.clear()
    this.generation = generation
    return true
  }

  /** Fills the license cache in the background (CacheWarmUp), now and after every generation change that empties it. */
  startWarmUp(): CacheWarmUp {
    this.#warmUp ??= new CacheWarmUp({
      keyPage: (after, limit) => this.#load.licenseKeyPage(after, limit),
      snapshot: (epochKeys) => this.wiring.store.snapshot(epochKeys),
      rows: (licenseKeys) => this.#load.licenses(licenseKeys),
      shardOfApp: (appId) => this.shardOfApp(appId),
      adopt: (generation) => this.#adopt(generation),
      keepIfMissing: (appId, licenseKey, epoch, value, generation) => {
        if (generation !== this.generation || this.#licenses.has(appId, licenseKey)) return false
        this.#licenses.set(appId, licenseKey, { epoch, value })
        return true
      },
      hasRoom: (fill, bytes) => this.cachedBytes + bytes <= fill * this.limits.cacheBytes,
      generation: () => this.generation,
    })
    this.#warmUp.start()
    return this.#warmUp
  }

  /**
   * Whether an entry read under `generation` may be kept: a newer generation empties the registry
   * first; an older one is refused (the store may have lost data since, so its epoch proves nothing).
   */
  #accepts(generation: number): boolean {
    if (generation > this.generation) this.startOver(generation)
    return generation === this.generation
  }

  /** Makes sure the app is cached, reading its epoch before the load; concurrent misses share one load. */
  ensureApp(appId: string): Promise<void> {
    return this.#appLoads.run(appId, async () => {
      const shard = await this.shardOfApp(appId)
      // No such app (a cluster asks PostgreSQL first): absent, with no epoch to watch, as app ids are
      // random UUIDs that never come into being later.
      if (shard === null) return this.#cacheApp(appId, { epoch: 0, value: null })
      const read = await this.wiring.store.snapshot([keys.appEpoch(shard, appId)]).catch((err: unknown) => {
        throw new StoreUnavailable(err)
      })
      await this.reloadApp(appId, read.epochs[0] ?? 0, read.generation)
    })
  }

  /**
   * Makes sure the license is cached, reading its epoch before the load, batched with the other misses
   * of the turn (LicenseLoads). With `admission`, the bucket's token is taken in the same store call and
   * nothing is loaded when it is empty ('limited').
   */
  async ensureLicense(appId: string, licenseKey: string, admission?: Admission): Promise<LicenseRead> {
    const shard = await this.shardOfApp(appId)
    if (shard === null) throw new Error('a license was looked up under an app that does not exist')
    return this.#licenseLoads.ensure(appId, shard, licenseKey, admission)
  }

  /** Loads from PostgreSQL and caches under `epoch` and `generation`, which the caller read before this call. */
  async reloadApp(appId: string, epoch: number, generation: number): Promise<void> {
    const loaded = await this.loadApp(appId)
    // Only under the app's own spelling of its id (see client-auth's canonicalAppId): one actor per app.
    const value = loaded?.id === appId ? loaded : null
    if (this.#accepts(generation)) this.#cacheApp(appId, { epoch, value })
  }

  #cacheApp(appId: string, entry: Entry<CachedApp>): void {
    const actor = entry.value ? this.of(appId) : this.#actors.get(appId)
    if (!actor) {
      this.#absentApps.set(appId, entry)
      return
    }
    actor.setApp(entry)
    this.#absentApps.delete(appId)
  }

  /** Loads from PostgreSQL and caches under `appId` (the app the caller asked under). */
  async reloadLicense(appId: string, licenseKey: string, epoch: number, generation: number): Promise<void> {
    const value = await this.loadLicense(licenseKey)
    if (this.#accepts(generation)) this.#licenses.set(appId, licenseKey, { epoch, value })
  }

  forgetLicense(appId: string, licenseKey: string): void {
    this.#licenses.delete(appId, licenseKey)
  }

  /** Straight from PostgreSQL, bypassing the actors (used while the store is unreachable). */
  loadApp(appId: string): Promise<CachedApp | null> {
    return this.#load.app(appId)
  }

  /** The app's active signing key read in `tx` (a Developer API signature, not the cached one). */
  loadSigningKey(appId: string, tx: Tx): Promise<CachedApp['signing']> {
    return this.#load.signingKey(appId, tx)
  }

  loadLicense(licenseKey: string): Promise<CachedLicense | null> {
    return this.#load.license(licenseKey)
  }

  /** See AppActor.bindSeat. */
  bindSeat(appId: string, licenseKey: string, hwid: string): Promise<boolean> {
    return this.of(appId).bindSeat(licenseKey, hwid)
  }

  /** See AppActor.selfban. */
  selfban(appId: string, licenseKey: string, want: SelfbanWish): Promise<SelfbanDone> {
    return this.of(appId).selfban(licenseKey, want)
  }
}
