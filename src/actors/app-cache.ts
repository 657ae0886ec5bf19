import type { KeyObject } from 'node:crypto'
import { and, desc, eq, sql } from 'drizzle-orm'
import { apps, licenses, signingKeys, webhooks, type VariableMap } from '../db/schema'
import type { Context } from '../context'
import { canonicalIp } from '../lib/ip'
import { type Admission, keys, type Snapshot } from '../store/store'
import { privateKeyFromPkcs8 } from '../lib/crypto'
import { SingleFlight } from '../lib/single-flight'

/** What the client endpoints need of an app, decoded once per load. */
export interface CachedApp {
  id: string
  accountId: string
  sandbox: boolean
  disabled: boolean
  secretHash: Buffer
  ipBlacklist: ReadonlySet<string>
  ipWhitelist: ReadonlySet<string>
  hwidBlacklist: ReadonlySet<string>
  hwidWhitelist: ReadonlySet<string>
  variables: VariableMap
  /** The active signing key; null only if the app somehow has none (then every success is a system_error). */
  signing: { keyId: string; key: KeyObject } | null
  /** license.validated events are written only when some enabled webhook wants them. */
  wantsValidated: boolean
}

export interface CachedLicense {
  key: string
  appId: string
  status: 'active' | 'revoked'
  expiresAt: Date | null
  maxHwidSlots: number
  unlimitedHwidSlots: boolean
  hwids: readonly string[]
  label: string | null
  variables: VariableMap
}

/**
 * A cache entry is valid while the store's epoch for it still equals `epoch` (read before the load)
 * and the store is still in the generation the whole cache was read under (AuthCache.generation).
 */
interface Entry<T> {
  epoch: number
  value: T | null
}

/** The shared store could not be reached; callers decide between failing closed and failing open. */
export class StoreUnavailable extends Error {
  constructor(override readonly cause: unknown) {
    super('store unavailable')
  }
}

/** How many entries the cache holds; absent ids have a bound of their own. */
export interface CacheLimits {
  apps: number
  licenses: number
  absent: number
}

const LIMITS: CacheLimits = { apps: 10_000, licenses: 200_000, absent: 20_000 }

/** A Map that forgets its oldest entry when full: enough to bound memory, no LRU bookkeeping per hit. */
class BoundedMap<V> extends Map<string, V> {
  constructor(private readonly limit: number) {
    super()
  }
  override set(key: string, value: V): this {
    if (!this.has(key) && this.size >= this.limit) {
      const oldest = this.keys().next().value
      if (oldest !== undefined) this.delete(oldest)
    }
    return super.set(key, value)
  }
}

/**
 * Entries of one kind, with ids that name nothing kept apart from the rest: anyone can send made-up
 * ids, and they must never push real entries out.
 */
class Entries<T> {
  readonly #present: BoundedMap<Entry<T>>
  readonly #absent: BoundedMap<Entry<T>>

  constructor(limit: number, absentLimit: number) {
    this.#present = new BoundedMap(limit)
    this.#absent = new BoundedMap(absentLimit)
  }

  get(id: string): Entry<T> | undefined {
    return this.#present.get(id) ?? this.#absent.get(id)
  }

  set(id: string, entry: Entry<T>): void {
    const [into, other] = entry.value === null ? [this.#absent, this.#present] : [this.#present, this.#absent]
    other.delete(id)
    into.set(id, entry)
  }

  delete(id: string): void {
    this.#present.delete(id)
    this.#absent.delete(id)
  }

  clear(): void {
    this.#present.clear()
    this.#absent.clear()
  }
}

/**
 * A made-up app id costs PostgreSQL reads before anything can refuse it: there is no app yet whose
 * limits apply. So each IP may find absent apps `perMinute` times a minute (a token bucket charged
 * only by a lookup that found no app: real clients, and lookups cut short by a store or database
 * outage, never spend it); past that its uncached app ids are answered invalid_app without a read.
 * Kept per process on purpose: no store round trip on a cold path, and n processes bound the
 * database's load to n times this. Concurrent lookups of one IP may overdraw it by their number.
 */
export class AbsentAppBudget {
  readonly #buckets: BoundedMap<{ tokens: number; at: number }>

  constructor(
    private readonly perMinute: number,
    ips: number,
  ) {
    this.#buckets = new BoundedMap(ips)
  }

  #tokens(ip: string, nowMs: number): number {
    const bucket = this.#buckets.get(ip)
    if (!bucket) return this.perMinute
    return Math.min(this.perMinute, bucket.tokens + (Math.max(0, nowMs - bucket.at) * this.perMinute) / 60_000)
  }

  allows(ip: string, nowMs: number): boolean {
    return this.#tokens(ip, nowMs) >= 1
  }

  /** A lookup by `ip` found no app. */
  charge(ip: string, nowMs: number): void {
    this.#buckets.set(ip, { tokens: Math.max(0, this.#tokens(ip, nowMs) - 1), at: nowMs })
  }
}

const ABSENT_APPS_PER_MINUTE = 60

function prepare(ctx: Context) {
  const db = ctx.database.db
  const id = sql.placeholder('id')
  return {
    app: db.select().from(apps).where(eq(apps.id, id)).limit(1).prepare('auth_app'),
    signingKey: db
      .select({ id: signingKeys.id, privateKeyEnc: signingKeys.privateKeyEnc })
      .from(signingKeys)
      .where(and(eq(signingKeys.appId, id), eq(signingKeys.active, true)))
      .orderBy(desc(signingKeys.version))
      .limit(1)
      .prepare('auth_app_signing_key'),
    validatedHook: db
      .select({ id: webhooks.id })
      .from(webhooks)
      .where(and(eq(webhooks.appId, id), eq(webhooks.enabled, true), sql`'license.validated' = ANY(${webhooks.events})`))
      .limit(1)
      .prepare('auth_app_validated_hook'),
    license: db.select().from(licenses).where(eq(licenses.key, sql.placeholder('key'))).limit(1).prepare('auth_license'),
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

const canonicalSet = (list: readonly string[]) => new Set(list.map((ip) => canonicalIp(ip) ?? ip))

/**
 * In-process copies of apps and licenses for the client endpoints, so an already-bound validate and
 * every heartbeat read no PostgreSQL. Every request sends the epochs it relied on to the store script,
 * which answers 'stale' when a Developer API change bumped one; the caller then reloads and retries.
 * After a store data loss epochs restart, so the whole cache is tied to the store generation it was
 * read under and starts over on a new one.
 */
export class AuthCache {
  readonly #apps: Entries<CachedApp>
  readonly #licenses: Entries<CachedLicense>
  readonly #q: ReturnType<typeof prepare>
  readonly #appLoads = new SingleFlight<void>()
  /** The store generation every entry was read under; 0 before the first read. */
  generation = 0
  /** PostgreSQL reads of app and license state since start. */
  readonly loads = { apps: 0, licenses: 0 }
  readonly absentApps = new AbsentAppBudget(ABSENT_APPS_PER_MINUTE, LIMITS.absent)

  constructor(
    private readonly ctx: Context,
    limits: CacheLimits = LIMITS,
  ) {
    this.#q = prepare(ctx)
    this.#apps = new Entries(limits.apps, limits.absent)
    this.#licenses = new Entries(limits.licenses, limits.absent)
  }

  cachedApp(appId: string): Entry<CachedApp> | undefined {
    return this.#apps.get(appId)
  }

  cachedLicense(licenseKey: string): Entry<CachedLicense> | undefined {
    return this.#licenses.get(licenseKey)
  }

  /** Drops every entry: the store answered with a newer generation than the one they were read under. */
  startOver(generation: number): void {
    if (generation < this.generation) return
    this.#apps.clear()
    this.#licenses.clear()
    this.generation = generation
  }

  /**
   * Whether an entry read under `generation` may be cached: a newer generation empties the cache first;
   * an older one is refused (the store may have lost data since, so its epoch proves nothing).
   */
  #accepts(generation: number): boolean {
    if (generation > this.generation) this.startOver(generation)
    return generation === this.generation
  }

  async #snapshot(epochKey: string, admission?: Admission): Promise<Snapshot> {
    return this.ctx.store.snapshot([epochKey], admission).catch((err: unknown) => {
      throw new StoreUnavailable(err)
    })
  }

  /** Makes sure the app is cached, reading its epoch before the load; concurrent misses share one load. */
  ensureApp(appId: string): Promise<void> {
    return this.#appLoads.run(appId, async () => {
      const read = await this.#snapshot(keys.appEpoch(appId))
      if (read.kind === 'ok') await this.reloadApp(appId, read.epochs[0] ?? 0, read.generation)
    })
  }

  /**
   * Makes sure the license is cached, reading its epoch before the load. With `admission`, the bucket's
   * token is taken in the same store call and nothing is loaded when it is empty ('limited').
   */
  async ensureLicense(licenseKey: string, admission?: Admission): Promise<Snapshot> {
    const read = await this.#snapshot(keys.licenseEpoch(licenseKey), admission)
    if (read.kind === 'ok') await this.reloadLicense(licenseKey, read.epochs[0] ?? 0, read.generation)
    return read
  }

  /** Loads from PostgreSQL and caches under `epoch` and `generation`, which the caller read before this call. */
  async reloadApp(appId: string, epoch: number, generation: number): Promise<void> {
    const value = await this.loadApp(appId)
    if (this.#accepts(generation)) this.#apps.set(appId, { epoch, value })
  }

  async reloadLicense(licenseKey: string, epoch: number, generation: number): Promise<void> {
    const value = await this.loadLicense(licenseKey)
    if (this.#accepts(generation)) this.#licenses.set(licenseKey, { epoch, value })
  }

  forgetLicense(licenseKey: string): void {
    this.#licenses.delete(licenseKey)
  }

  /** Straight from PostgreSQL, bypassing the cache (used while the store is unreachable). */
  async loadApp(appId: string): Promise<CachedApp | null> {
    // Unknown ids are cached as absent: app ids are random UUIDs, so an absent one cannot appear later.
    if (!UUID.test(appId)) return null
    this.loads.apps++
    const [[row], [key], [hook]] = await Promise.all([
      this.#q.app.execute({ id: appId }),
      this.#q.signingKey.execute({ id: appId }),
      this.#q.validatedHook.execute({ id: appId }),
    ])
    if (!row) return null
    return {
      id: row.id,
      accountId: row.accountId,
      sandbox: row.sandbox,
      disabled: row.disabled,
      secretHash: Buffer.from(row.secretHash, 'hex'),
      ipBlacklist: canonicalSet(row.ipBlacklist),
      ipWhitelist: canonicalSet(row.ipWhitelist),
      hwidBlacklist: new Set(row.hwidBlacklist),
      hwidWhitelist: new Set(row.hwidWhitelist),
      variables: row.variables ?? {},
      signing: key ? { keyId: key.id, key: privateKeyFromPkcs8(this.ctx.sealer.open(key.privateKeyEnc)) } : null,
      wantsValidated: hook !== undefined,
    }
  }

  async loadLicense(licenseKey: string): Promise<CachedLicense | null> {
    this.loads.licenses++
    const [row] = await this.#q.license.execute({ key: licenseKey })
    if (!row) return null
    return {
      key: row.key,
      appId: row.appId,
      status: row.status,
      expiresAt: row.expiresAt,
      maxHwidSlots: row.maxHwidSlots,
      unlimitedHwidSlots: row.unlimitedHwidSlots,
      hwids: row.hwids,
      label: row.label,
      variables: row.variables ?? {},
    }
  }
}
