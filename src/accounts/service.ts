import { and, eq, isNull, sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { transactionKnown } from '../db/commit-outcome'
import { accounts, apiKeys } from '../db/schema'
import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { generateApiKey, sha256Hex } from '../lib/crypto'
import type { AccountResponse } from './model'

/** Accounts, their API keys and the credits the operator adds: shared by the operator CLI and the Developer API. */

export async function createAccount(ctx: Context, name: string, credits = 0) {
  return transactionKnown(ctx.database, async (tx) => {
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
  return transactionKnown(ctx.database, async (tx) => {
    await requireAccount(tx, accountId)
    return insertApiKey(tx, accountId)
  })
}

/** Revokes by the key itself; true when a live key was revoked. */
export async function revokeApiKey(ctx: Context, apiKey: string): Promise<boolean> {
  const rows = await transactionKnown(ctx.database, (tx) =>
    tx
      .update(apiKeys)
      .set({ revokedAt: new Date(ctx.clock()) })
      .where(and(eq(apiKeys.keyHash, sha256Hex(apiKey)), isNull(apiKeys.revokedAt)))
      .returning({ id: apiKeys.id }),
  )
  return rows.length > 0
}

const accountNotFound = (accountId: string) => new ApiError('not_found', 404, `No account ${accountId}`)

/** The account's row, or 404. */
export async function requireAccount(db: DbOrTx, accountId: string) {
  const [row] = await db.select().from(accounts).where(eq(accounts.id, accountId)).limit(1)
  if (!row) throw accountNotFound(accountId)
  return row
}

/**
 * Adds credits, or with a negative n removes them: never more than the account can spend now (its
 * charges not yet reconciled counted) nor than PostgreSQL holds, so no balance goes below zero. The
 * store learns of it at once.
 */
export async function addCredits(ctx: Context, accountId: string, n: number) {
  const row = await transactionKnown(ctx.database, async (tx) => {
    const [current] = await tx
      .select({ credits: accounts.credits, creditSeq: accounts.creditSeq })
      .from(accounts)
      .where(eq(accounts.id, accountId))
      .for('no key update')
    if (!current) throw accountNotFound(accountId)
    // Past it a balance reads rounded here and in every client's JSON, and charges stop showing.
    if (current.credits + n > Number.MAX_SAFE_INTEGER)
      throw new ApiError('bad_request', 400, `The balance would pass ${Number.MAX_SAFE_INTEGER} credits`)
    // The store drops the live balance while this transaction holds the row: a balance seed (which reads
    // the row FOR SHARE) either finished before, and is dropped here, or waits and finds the epoch moved.
    // The next seed reads whatever PostgreSQL then holds, so a COMMIT that fails after this adds nothing
    // (a delta given to the store here would stay in the live balance). If the store is unreachable
    // nothing is committed, so a retry cannot add twice either.
    const seq = await ctx.store.creditsChanging(accountId, current.creditSeq)
    // A removal is held to what the charges not yet reconciled leave: clamped against PostgreSQL's
    // balance alone, it left a debt that the next credits added, and the next flush, silently paid. And
    // to PostgreSQL's balance: a refund of a charge already flushed is still on its way there.
    const change =
      n >= 0 ? n : -Math.min(-n, current.credits, await ctx.credits.spendable(tx, accountId, current.credits))
    const [updated] = await tx
      .update(accounts)
      .set({ credits: current.credits + change, creditSeq: sql`GREATEST(${accounts.creditSeq}, ${seq})` })
      .where(eq(accounts.id, accountId))
      .returning({ accountId: accounts.id, credits: accounts.credits, creditSeq: accounts.creditSeq })
    return updated!
  })
  // Seeded again now, so the answer counts the charges not reconciled yet; with the store gone since the
  // commit, currentBalance answers from the row committed. Not from a read of it: the credits are added,
  // and a failure told now (PostgreSQL gone since the COMMIT) would have the operator add them twice.
  await ctx.credits.loadLiveBalance(accountId).catch(() => {})
  return { accountId: row.accountId, credits: await ctx.credits.currentBalance(accountId, row) }
}

export async function getAccount(ctx: Context, accountId: string): Promise<typeof AccountResponse.static> {
  const row = await requireAccount(ctx.database.db, accountId)
  return { accountId: row.id, name: row.name, credits: await ctx.credits.currentBalance(accountId) }
}
