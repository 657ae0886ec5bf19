import { and, desc, eq, lt, max, sql } from 'drizzle-orm'
import type { DbOrTx, Tx } from '../db/client'
import { transactionKnown } from '../db/commit-outcome'
import { apps, signingKeys } from '../db/schema'
import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { generateAppSecret, generateKeyId, generateSigningKey, sha256Hex } from '../lib/crypto'
import { requireAccount } from '../accounts/service'
import { requireSealingKey } from '../signing/key-check'
import { olderThan, ROWS_PER_READ, streamedList } from '../http/streamed-list'
import type { AppSecretResponse, AppSummary, CreatedAppResponse, RotatedKeyResponse, SigningKeyListResponse, UpdateAppBody } from './model'

/** Apps and their signing keys: created by the operator CLI and the Developer API, owned by one account. */

export async function createApplication(
  ctx: Context,
  accountId: string,
  name: string,
  sandbox: boolean,
): Promise<typeof CreatedAppResponse.static> {
  const appSecret = generateAppSecret()
  return transactionKnown(ctx.database, async (tx) => {
    // First, before any table a master-key rotation locks: see rotateSigningKey.
    await requireSealingKey(tx, ctx.sealer)
    await requireAccount(tx, accountId)
    const [app] = await tx
      .insert(apps)
      .values({ accountId, name, sandbox, secretHash: sha256Hex(appSecret) })
      .returning()
    if (!app) throw new Error('app insert returned nothing')
    const key = await insertSigningKey(ctx, tx, app.id, 1)
    return { appId: app.id, name: app.name, sandbox: app.sandbox, appSecret, ...key, createdAt: app.createdAt.toISOString() }
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
    // When the key took over, not when its transaction began: a rotation that began first may get the
    // app's row second, and the list, newest first by version, would show times out of order.
    createdAt: sql`clock_timestamp()`,
  })
  return { keyId, publicKey: generated.publicKey }
}

/** Rotation: a new active key; earlier keys stay listed, inactive, so clients can trust several. */
export async function rotateSigningKey(ctx: Context, appId: string): Promise<typeof RotatedKeyResponse.static> {
  // Through the app's actor, which holds the active key; the row lock orders rotations across instances.
  const rotate = async (tx: Tx) => {
    // Before the update below: holding signing_keys while waiting for the check row a master-key
    // rotation holds, waiting for signing_keys, would deadlock the two.
    await requireSealingKey(tx, ctx.sealer)
    await tx.select({ id: apps.id }).from(apps).where(eq(apps.id, appId)).for('update')
    const [current] = await tx
      .select({ version: max(signingKeys.version) })
      .from(signingKeys)
      .where(eq(signingKeys.appId, appId))
    // The active key only: every earlier one is inactive already, and rewriting them all made each
    // rotation cost as much as all before it.
    await tx
      .update(signingKeys)
      .set({ active: false })
      .where(and(eq(signingKeys.appId, appId), eq(signingKeys.active, true)))
    return insertSigningKey(ctx, tx, appId, (current?.version ?? 0) + 1)
  }
  return ctx.actors.write(appId, rotate, () => ({ app: true }))
}

type SigningKeyRow = Pick<typeof signingKeys.$inferSelect, 'id' | 'publicKey' | 'active' | 'createdAt' | 'version'>

/** The app's signing keys, newest first (keyset on version), streamed: rotations have no bound. */
export function listSigningKeys(ctx: Context, appId: string): Response {
  const db = ctx.database.db
  return streamedList(
    'keys',
    (after: SigningKeyRow | null) =>
      db
        .select({ id: signingKeys.id, publicKey: signingKeys.publicKey, active: signingKeys.active, createdAt: signingKeys.createdAt, version: signingKeys.version })
        .from(signingKeys)
        .where(and(eq(signingKeys.appId, appId), after ? lt(signingKeys.version, after.version) : undefined))
        .orderBy(desc(signingKeys.version))
        .limit(ROWS_PER_READ),
    (k): (typeof SigningKeyListResponse.static)['keys'][number] => ({ keyId: k.id, publicKey: k.publicKey, active: k.active, createdAt: k.createdAt.toISOString() }),
  )
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

type AppRow = typeof apps.$inferSelect

const appSummary = (row: AppRow): typeof AppSummary.static => ({
  appId: row.id,
  name: row.name,
  sandbox: row.sandbox,
  disabled: row.disabled,
  createdAt: row.createdAt.toISOString(),
})

/**
 * The account's apps, newest first (keyset on createdAt, id), streamed: an account's apps have no bound.
 * Secrets and keys stay out of the listing.
 */
export function listApps(ctx: Context, accountId: string): Response {
  const db = ctx.database.db
  return streamedList(
    'apps',
    (after: AppRow | null) =>
      db
        .select()
        .from(apps)
        .where(and(eq(apps.accountId, accountId), olderThan(apps.createdAt, apps.id, after && { time: after.createdAt, id: after.id })))
        .orderBy(desc(apps.createdAt), desc(apps.id))
        .limit(ROWS_PER_READ),
    appSummary,
  )
}

/**
 * One UPDATE of the app's row through its actor: the actor's publish bumps the app epoch, which every
 * process's authorize script compares, so the change (disabled, a new secret) holds from the next
 * client request on, on every instance.
 */
async function changeApp(ctx: Context, appId: string, set: Partial<Pick<AppRow, 'name' | 'disabled' | 'secretHash'>>) {
  const [row] = await ctx.actors.write(
    appId,
    (tx) => tx.update(apps).set(set).where(eq(apps.id, appId)).returning(),
    () => ({ app: true }),
  )
  // Apps are never deleted (accounts only, cascading), so an owned app is still there.
  if (!row) throw new Error('owned app vanished during update')
  return row
}

/** Renames, disables or re-enables an app of the account. */
export async function updateApp(
  ctx: Context,
  accountId: string,
  appId: string,
  input: typeof UpdateAppBody.static,
): Promise<typeof AppSummary.static> {
  const app = await requireOwnedApp(ctx, accountId, appId)
  return appSummary(await changeApp(ctx, app.id, { name: input.name, disabled: input.disabled }))
}

/** A new app secret, stored only as its hash and shown once; the old one fails from the next request. */
export async function rotateAppSecret(
  ctx: Context,
  accountId: string,
  appId: string,
): Promise<typeof AppSecretResponse.static> {
  const app = await requireOwnedApp(ctx, accountId, appId)
  const appSecret = generateAppSecret()
  await changeApp(ctx, app.id, { secretHash: sha256Hex(appSecret) })
  return { appSecret }
}
