import type { KeyObject } from 'node:crypto'
import { and, asc, desc, eq, gt, type InferSelectModel, type Placeholder, sql } from 'drizzle-orm'
import { apps, licenses, signingKeys, webhooks, type VariableMap } from '../db/schema'
import type { Database, DbOrTx, Tx } from '../db/client'
import { canonicalIp } from '../lib/ip'
import { privateKeyFromPkcs8, type Sealer } from '../lib/crypto'

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
  /** Milliseconds since the epoch: a number, not a Date object, in each of up to a million entries. */
  expiresAt: number | null
  maxHwidSlots: number
  unlimitedHwidSlots: boolean
  hwids: readonly string[]
  label: string | null
  variables: VariableMap
}

/**
 * Whether `hwid` holds a seat of the license (or needs none): a session's device stops being the
 * license's when its seat is released or reset, and its session ends there (heartbeat, selfban).
 */
export const holdsSeat = (license: Pick<CachedLicense, 'unlimitedHwidSlots' | 'hwids'>, hwid: string) =>
  license.unlimitedHwidSlots || license.hwids.includes(hwid)

/** The shared store could not be reached; callers decide between failing closed and failing open. */
export class StoreUnavailable extends Error {
  constructor(override readonly cause: unknown) {
    super('store unavailable')
  }
}

/** The columns a cached license holds: not created_at, a Date per row read for nothing. */
const LICENSE_COLUMNS = {
  key: licenses.key,
  appId: licenses.appId,
  status: licenses.status,
  expiresAt: licenses.expiresAt,
  maxHwidSlots: licenses.maxHwidSlots,
  unlimitedHwidSlots: licenses.unlimitedHwidSlots,
  hwids: licenses.hwids,
  label: licenses.label,
  variables: licenses.variables,
}

/** The app's active signing key, sealed. */
const activeSigningKey = (db: DbOrTx, appId: string | Placeholder) =>
  db
    .select({ id: signingKeys.id, privateKeyEnc: signingKeys.privateKeyEnc })
    .from(signingKeys)
    .where(and(eq(signingKeys.appId, appId), eq(signingKeys.active, true)))
    .orderBy(desc(signingKeys.version))
    .limit(1)

function prepare(database: Database) {
  const { db } = database
  const id = sql.placeholder('id')
  return {
    app: db.select().from(apps).where(eq(apps.id, id)).limit(1).prepare('auth_app'),
    signingKey: activeSigningKey(db, id).prepare('auth_app_signing_key'),
    validatedHook: db
      .select({ id: webhooks.id })
      .from(webhooks)
      .where(and(eq(webhooks.appId, id), eq(webhooks.enabled, true), sql`'license.validated' = ANY(${webhooks.events})`))
      .limit(1)
      .prepare('auth_app_validated_hook'),
    appAccount: db.select({ accountId: apps.accountId }).from(apps).where(eq(apps.id, id)).limit(1).prepare('auth_app_account'),
    license: db.select(LICENSE_COLUMNS).from(licenses).where(eq(licenses.key, sql.placeholder('key'))).limit(1).prepare('auth_license'),
    // One statement for any number of keys (an IN list would be a new statement per count).
    licenses: db
      .select(LICENSE_COLUMNS)
      .from(licenses)
      .where(sql`${licenses.key} = ANY(${sql.placeholder('keys')}::text[])`)
      .prepare('auth_licenses'),
    licenseKeyPage: db
      .select({ key: licenses.key, appId: licenses.appId })
      .from(licenses)
      .where(gt(licenses.key, sql.placeholder('after')))
      .orderBy(asc(licenses.key))
      .limit(sql.placeholder('limit'))
      .prepare('warm_license_keys'),
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

const canonicalSet = (list: readonly string[]) => new Set(list.map((ip) => canonicalIp(ip) ?? ip))

/** Reads an app's or a license's live state straight from PostgreSQL, counting the reads. */
export class StateLoader {
  readonly #q: ReturnType<typeof prepare>
  /** PostgreSQL reads of app and license state since start. */
  readonly loads = { apps: 0, licenses: 0 }

  constructor(
    database: Database,
    private readonly sealer: Sealer,
  ) {
    this.#q = prepare(database)
  }

  async app(appId: string): Promise<CachedApp | null> {
    // Not shaped like an app id: absent without a read (the registry caches it as absent; app ids are
    // random UUIDs, so an absent one cannot appear later).
    if (!UUID.test(appId)) return null
    this.loads.apps++
    const [[row], signing, [hook]] = await Promise.all([
      this.#q.app.execute({ id: appId }),
      this.signingKey(appId),
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
      signing,
      wantsValidated: hook !== undefined,
    }
  }

  /** The account of an app, null when there is no such app (one primary-key read; none for an id not shaped like one). */
  async accountOf(appId: string): Promise<string | null> {
    if (!UUID.test(appId)) return null
    const [row] = await this.#q.appAccount.execute({ id: appId })
    return row?.accountId ?? null
  }

  /** The app's active signing key, opened; null if it has none. In `tx` when given, else by the prepared statement. */
  async signingKey(appId: string, tx?: Tx): Promise<CachedApp['signing']> {
    const [key] = tx ? await activeSigningKey(tx, appId) : await this.#q.signingKey.execute({ id: appId })
    return key ? { keyId: key.id, key: privateKeyFromPkcs8(this.sealer.open(key.privateKeyEnc)) } : null
  }

  async license(licenseKey: string): Promise<CachedLicense | null> {
    this.loads.licenses++
    const [row] = await this.#q.license.execute({ key: licenseKey })
    return row ? cachedLicense(row) : null
  }

  /** Up to `limit` license keys after `after`, in key order, with their apps (the cache warm-up's pages). */
  licenseKeyPage(after: string, limit: number): Promise<{ key: string; appId: string }[]> {
    return this.#q.licenseKeyPage.execute({ after, limit })
  }

  /** Many licenses in one query, by key; a key that names none is missing from the answer. */
  async licenses(licenseKeys: readonly string[]): Promise<Map<string, CachedLicense>> {
    this.loads.licenses += licenseKeys.length
    const rows = await this.#q.licenses.execute({ keys: licenseKeys })
    return new Map(rows.map((row) => [row.key, cachedLicense(row)]))
  }
}

/** A license's variables when it has none: one shared frozen object, not one per license read. */
export const NO_VARIABLES: VariableMap = Object.freeze({})
function cachedLicense(row: Omit<InferSelectModel<typeof licenses>, 'createdAt'>): CachedLicense {
  return {
    key: row.key,
    appId: row.appId,
    status: row.status,
    expiresAt: row.expiresAt ? row.expiresAt.getTime() : null,
    maxHwidSlots: row.maxHwidSlots,
    unlimitedHwidSlots: row.unlimitedHwidSlots,
    hwids: row.hwids,
    label: row.label,
    variables: Object.keys(row.variables ?? {}).length === 0 ? NO_VARIABLES : row.variables,
  }
}

/** Variables as JSON, '' when there are none (what the license cache stores, and what an app entry is sized by). */
export const variablesJson = (variables: VariableMap) => (Object.keys(variables).length === 0 ? '' : JSON.stringify(variables))

/**
 * What an app entry costs in memory, estimated on the high side: a fixed part for the row, its Sets,
 * the secret hash and the opened signing key (measured with Bun 1.4, 2 × 10^4 entries, RSS after a full
 * GC: 1,638 bytes with empty lists; 8 KB is counted, which also covers the actor around it), then each
 * list entry and the variables, twice per character.
 */
export function appBytes(app: CachedApp): number {
  let chars = 2 * variablesJson(app.variables).length
  for (const list of [app.ipBlacklist, app.ipWhitelist, app.hwidBlacklist, app.hwidWhitelist]) {
    for (const item of list) chars += item.length + 40
  }
  return 8_192 + 2 * chars
}
