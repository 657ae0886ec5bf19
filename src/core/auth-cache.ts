import type { KeyObject } from 'node:crypto'
import { and, desc, eq, sql } from 'drizzle-orm'
import { apps, licenses, signingKeys, webhooks, type VariableMap } from '../db/schema'
import type { Deps } from '../deps'
import { canonicalIp } from '../http/client-ip'
import { keys } from '../store/store'
import { privateKeyFromPkcs8 } from './crypto'

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

/** A cache entry is valid while the store's epoch for it still equals `epoch` (read before the load). */
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

const MAX_APPS = 10_000
const MAX_LICENSES = 200_000

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

function prepare(deps: Deps) {
  const db = deps.database.db
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
 */
export class AuthCache {
  readonly #apps = new BoundedMap<Entry<CachedApp>>(MAX_APPS)
  readonly #licenses = new BoundedMap<Entry<CachedLicense>>(MAX_LICENSES)
  readonly #q: ReturnType<typeof prepare>
  /** PostgreSQL reads of app and license state since start. */
  readonly loads = { apps: 0, licenses: 0 }

  constructor(private readonly deps: Deps) {
    this.#q = prepare(deps)
  }

  cachedApp(appId: string): Entry<CachedApp> | undefined {
    return this.#apps.get(appId)
  }

  cachedLicense(licenseKey: string): Entry<CachedLicense> | undefined {
    return this.#licenses.get(licenseKey)
  }

  /** Makes sure both entries are present, reading their epochs in one round trip before the loads. */
  async ensure(appId: string, licenseKey: string | null): Promise<void> {
    if (this.#apps.has(appId) && (licenseKey === null || this.#licenses.has(licenseKey))) return
    const needApp = !this.#apps.has(appId)
    const needLicense = licenseKey !== null && !this.#licenses.has(licenseKey)
    if (!needApp && !needLicense) return
    const epochKeys: string[] = []
    if (needApp) epochKeys.push(keys.appEpoch(appId))
    if (needLicense) epochKeys.push(keys.licenseEpoch(licenseKey))
    const epochs = await this.deps.store.epochs(epochKeys).catch((err: unknown) => {
      throw new StoreUnavailable(err)
    })
    await Promise.all([
      needApp ? this.reloadApp(appId, epochs[0] ?? 0) : undefined,
      needLicense ? this.reloadLicense(licenseKey, epochs[needApp ? 1 : 0] ?? 0) : undefined,
    ])
  }

  /** Loads from PostgreSQL and caches under `epoch`, which the caller read before this call. */
  async reloadApp(appId: string, epoch: number): Promise<CachedApp | null> {
    const value = await this.loadApp(appId)
    this.#apps.set(appId, { epoch, value })
    return value
  }

  async reloadLicense(licenseKey: string, epoch: number): Promise<CachedLicense | null> {
    const value = await this.loadLicense(licenseKey)
    this.#licenses.set(licenseKey, { epoch, value })
    return value
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
      signing: key ? { keyId: key.id, key: privateKeyFromPkcs8(this.deps.sealer.open(key.privateKeyEnc)) } : null,
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
