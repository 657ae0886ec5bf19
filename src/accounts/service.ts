import { and, desc, eq, isNull, max, sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { accounts, apiKeys, apps, signingKeys } from '../db/schema'
import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { keys } from '../store/store'
import { currentBalance } from '../credits/ledger'
import {
  generateApiKey,
  generateAppSecret,
  generateKeyId,
  generateSigningKey,
  sha256Hex,
} from '../lib/crypto'
import { invalidate } from '../actors/invalidate'

/** Account, API key, app and signing-key provisioning: shared by the operator CLI and the Developer API. */

export async function createAccount(ctx: Context, name: string, credits = 0) {
  return ctx.database.db.transaction(async (tx) => {
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

export async function createApiKey(ctx: Context, accountId: string): Promise<string> {
  await requireAccount(ctx.database.db, accountId)
  return insertApiKey(ctx.database.db, accountId)
}

/** Revokes by the key itself; true when a live key was revoked. */
export async function revokeApiKey(ctx: Context, apiKey: string): Promise<boolean> {
  const rows = await ctx.database.db
    .update(apiKeys)
    .set({ revokedAt: new Date(ctx.clock()) })
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
export async function addCredits(ctx: Context, accountId: string, n: number) {
  const row = await ctx.database.db.transaction(async (tx) => {
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
    await ctx.store.creditsAdded(accountId, n)
    return updated
  })
  return { accountId: row.accountId, credits: await currentBalance(ctx, accountId) }
}

export async function getAccount(ctx: Context, accountId: string) {
  const row = await requireAccount(ctx.database.db, accountId)
  return { accountId: row.id, name: row.name, credits: await currentBalance(ctx, accountId) }
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
  ctx: Context,
  accountId: string,
  name: string,
  sandbox: boolean,
): Promise<CreatedApp> {
  const appSecret = generateAppSecret()
  return ctx.database.db.transaction(async (tx) => {
    await requireAccount(tx, accountId)
    const [app] = await tx
      .insert(apps)
      .values({ accountId, name, sandbox, secretHash: sha256Hex(appSecret) })
      .returning()
    if (!app) throw new Error('app insert returned nothing')
    const key = await insertSigningKey(ctx, tx, app.id, 1)
    return { appId: app.id, name: app.name, sandbox: app.sandbox, appSecret, ...key, createdAt: app.createdAt }
  })
}

async function insertSigningKey(ctx: Context, tx: DbOrTx, appId: string, version: number) {
  const generated = generateSigningKey()
  const keyId = generateKeyId()
  await tx.insert(signingKeys).values({
    id: keyId,
    appId,
    version,
    publicKey: generated.publicKey,
    privateKeyEnc: ctx.sealer.seal(generated.privatePkcs8),
    active: true,
  })
  return { keyId, publicKey: generated.publicKey }
}

/** Rotation: a new active key; earlier keys stay listed, inactive, so clients can trust several. */
export async function rotateSigningKey(ctx: Context, appId: string) {
  const key = await ctx.database.db.transaction(async (tx) => {
    // The app row lock orders concurrent rotations of one app across instances.
    await tx.select({ id: apps.id }).from(apps).where(eq(apps.id, appId)).for('update')
    const [current] = await tx
      .select({ version: max(signingKeys.version) })
      .from(signingKeys)
      .where(eq(signingKeys.appId, appId))
    await tx.update(signingKeys).set({ active: false }).where(eq(signingKeys.appId, appId))
    return insertSigningKey(ctx, tx, appId, (current?.version ?? 0) + 1)
  })
  await invalidate(ctx, [keys.appEpoch(appId)])
  return key
}

export async function listSigningKeys(ctx: Context, appId: string) {
  const rows = await ctx.database.db
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
export async function requireOwnedApp(ctx: Context, accountId: string, appId: string) {
  if (!UUID.test(appId)) throw new ApiError('forbidden', 403, 'App not found in this account')
  const [row] = await ctx.database.db
    .select()
    .from(apps)
    .where(and(eq(apps.id, appId), eq(apps.accountId, accountId)))
    .limit(1)
  if (!row) throw new ApiError('forbidden', 403, 'App not found in this account')
  return row
}

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
