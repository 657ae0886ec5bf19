import { and, desc, eq, isNull, max, sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { accounts, apiKeys, apps, signingKeys } from '../db/schema'
import type { Deps } from '../deps'
import { ApiError } from '../errors'
import { keys } from '../store/store'
import { currentBalance } from './credits-ledger'
import {
  generateApiKey,
  generateAppSecret,
  generateKeyId,
  generateSigningKey,
  sha256Hex,
} from './crypto'
import { invalidate } from './invalidate'

/** Account, API key, app and signing-key provisioning: shared by the operator CLI and the Developer API. */

export async function createAccount(deps: Deps, name: string, credits = 0) {
  return deps.database.db.transaction(async (tx) => {
    const [account] = await tx.insert(accounts).values({ name, credits }).returning({ id: accounts.id })
    if (!account) throw new Error('account insert returned nothing')
    const apiKey = await insertApiKey(tx, account.id)
    return { accountId: account.id, apiKey }
  })
}

async function insertApiKey(tx: DbOrTx, accountId: string): Promise<string> {
  const apiKey = generateApiKey()
  await tx.insert(apiKeys).values({ accountId, keyHash: sha256Hex(apiKey) })
  return apiKey
}

export async function createApiKey(deps: Deps, accountId: string): Promise<string> {
  await requireAccount(deps.database.db, accountId)
  return insertApiKey(deps.database.db, accountId)
}

/** Revokes by the key itself; true when a live key was revoked. */
export async function revokeApiKey(deps: Deps, apiKey: string): Promise<boolean> {
  const rows = await deps.database.db
    .update(apiKeys)
    .set({ revokedAt: new Date(deps.clock()) })
    .where(and(eq(apiKeys.keyHash, sha256Hex(apiKey)), isNull(apiKeys.revokedAt)))
    .returning({ id: apiKeys.id })
  return rows.length > 0
}

async function requireAccount(db: DbOrTx, accountId: string) {
  const [row] = await db.select().from(accounts).where(eq(accounts.id, accountId)).limit(1)
  if (!row) throw new ApiError('not_found', 404, `No account ${accountId}`)
  return row
}

/** Adds (or with a negative n removes, never below zero) credits; the store learns of it at once. */
export async function addCredits(deps: Deps, accountId: string, n: number) {
  const row = await deps.database.db.transaction(async (tx) => {
    const [updated] = await tx
      .update(accounts)
      .set({ credits: sql`GREATEST(0, ${accounts.credits} + ${n})` })
      .where(eq(accounts.id, accountId))
      .returning({ accountId: accounts.id, credits: accounts.credits })
    if (!updated) throw new ApiError('not_found', 404, `No account ${accountId}`)
    // The store hears of it while the UPDATE still holds the row: a balance seed (which reads the row
    // FOR SHARE) either finished before, and gets the delta here, or waits and finds the epoch moved.
    // After the commit, a seed could read the new credits and then get the delta a second time. If
    // the store is unreachable nothing is committed, so a retry cannot add twice either.
    await deps.store.creditsAdded(accountId, n)
    return updated
  })
  return { accountId: row.accountId, credits: await currentBalance(deps, accountId) }
}

export async function getAccount(deps: Deps, accountId: string) {
  const row = await requireAccount(deps.database.db, accountId)
  return { accountId: row.id, name: row.name, credits: await currentBalance(deps, accountId) }
}

export interface CreatedApp {
  appId: string
  name: string
  sandbox: boolean
  appSecret: string
  publicKey: string
  keyId: string
  createdAt: Date
}

export async function createApplication(
  deps: Deps,
  accountId: string,
  name: string,
  sandbox: boolean,
): Promise<CreatedApp> {
  const appSecret = generateAppSecret()
  return deps.database.db.transaction(async (tx) => {
    await requireAccount(tx, accountId)
    const [app] = await tx
      .insert(apps)
      .values({ accountId, name, sandbox, secretHash: sha256Hex(appSecret) })
      .returning()
    if (!app) throw new Error('app insert returned nothing')
    const key = await insertSigningKey(deps, tx, app.id, 1)
    return { appId: app.id, name: app.name, sandbox: app.sandbox, appSecret, ...key, createdAt: app.createdAt }
  })
}

async function insertSigningKey(deps: Deps, tx: DbOrTx, appId: string, version: number) {
  const generated = generateSigningKey()
  const keyId = generateKeyId()
  await tx.insert(signingKeys).values({
    id: keyId,
    appId,
    version,
    publicKey: generated.publicKey,
    privateKeyEnc: deps.sealer.seal(generated.privatePkcs8),
    active: true,
  })
  return { keyId, publicKey: generated.publicKey }
}

/** Rotation: a new active key; earlier keys stay listed, inactive, so clients can trust several. */
export async function rotateSigningKey(deps: Deps, appId: string) {
  const key = await deps.database.db.transaction(async (tx) => {
    // The app row lock orders concurrent rotations of one app across instances.
    await tx.select({ id: apps.id }).from(apps).where(eq(apps.id, appId)).for('update')
    const [current] = await tx
      .select({ version: max(signingKeys.version) })
      .from(signingKeys)
      .where(eq(signingKeys.appId, appId))
    await tx.update(signingKeys).set({ active: false }).where(eq(signingKeys.appId, appId))
    return insertSigningKey(deps, tx, appId, (current?.version ?? 0) + 1)
  })
  await invalidate(deps, [keys.appEpoch(appId)])
  return key
}

export async function listSigningKeys(deps: Deps, appId: string) {
  const rows = await deps.database.db
    .select({
      keyId: signingKeys.id,
      publicKey: signingKeys.publicKey,
      active: signingKeys.active,
      createdAt: signingKeys.createdAt,
    })
    .from(signingKeys)
    .where(eq(signingKeys.appId, appId))
    .orderBy(desc(signingKeys.version))
  return rows
}

/** Throws 403 unless the app exists and belongs to the account (an absent app looks the same). */
export async function requireOwnedApp(deps: Deps, accountId: string, appId: string) {
  if (!UUID.test(appId)) throw new ApiError('forbidden', 403, 'App not found in this account')
  const [row] = await deps.database.db
    .select()
    .from(apps)
    .where(and(eq(apps.id, appId), eq(apps.accountId, accountId)))
    .limit(1)
  if (!row) throw new ApiError('forbidden', 403, 'App not found in this account')
  return row
}

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
