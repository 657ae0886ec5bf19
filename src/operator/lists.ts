import { and, count, desc, eq, isNull, sql } from 'drizzle-orm'
import type { Context } from '../context'
import { accounts, apiKeys, apps, signingKeys } from '../db/schema'
import { requireAccount } from '../accounts/service'

/**
 * What the operator sees of accounts and apps: names, counts, public keys, never a secret or a hash.
 * Newest first, like the Developer API's lists; one row more than asked tells whether there is more.
 */

const page = <T>(rows: T[], limit: number) => ({ rows: rows.slice(0, limit), more: rows.length > limit })

export async function listAccounts(ctx: Context, limit: number) {
  const { db } = ctx.database
  // Distinct count names: drizzle writes a subquery's field unqualified inside sql``.
  const appCounts = db
    .select({ accountId: apps.accountId, n: count().as('app_count') })
    .from(apps)
    .groupBy(apps.accountId)
    .as('app_counts')
  const keyCounts = db
    .select({ accountId: apiKeys.accountId, n: count().as('key_count') })
    .from(apiKeys)
    .where(isNull(apiKeys.revokedAt))
    .groupBy(apiKeys.accountId)
    .as('key_counts')
  const found = await db
    .select({
      accountId: accounts.id,
      name: accounts.name,
      createdAt: accounts.createdAt,
      reconciled: { credits: accounts.credits, creditSeq: accounts.creditSeq },
      apps: sql<number>`coalesce(${appCounts.n}, 0)`.mapWith(Number),
      activeApiKeys: sql<number>`coalesce(${keyCounts.n}, 0)`.mapWith(Number),
    })
    .from(accounts)
    .leftJoin(appCounts, eq(appCounts.accountId, accounts.id))
    .leftJoin(keyCounts, eq(keyCounts.accountId, accounts.id))
    .orderBy(desc(accounts.createdAt), desc(accounts.id))
    .limit(limit + 1)
  const { rows, more } = page(found, limit)
  // The live balance, as `account credits` prints it: the row lags behind charges not flushed yet.
  const credits = await Promise.all(rows.map((r) => ctx.credits.currentBalance(r.accountId, r.reconciled)))
  return {
    accounts: rows.map((r, i) => ({
      accountId: r.accountId,
      name: r.name,
      credits: credits[i],
      createdAt: r.createdAt.toISOString(),
      apps: r.apps,
      activeApiKeys: r.activeApiKeys,
    })),
    more,
  }
}

export async function listApps(ctx: Context, accountId: string | null, limit: number) {
  // An unknown account is bad input, as in `apikey create`, rather than an empty list that hides a typo.
  if (accountId !== null) await requireAccount(ctx.database.db, accountId)
  const found = await ctx.database.db
    .select({
      appId: apps.id,
      accountId: apps.accountId,
      name: apps.name,
      sandbox: apps.sandbox,
      disabled: apps.disabled,
      createdAt: apps.createdAt,
      keyId: signingKeys.id,
      publicKey: signingKeys.publicKey,
    })
    .from(apps)
    .leftJoin(signingKeys, and(eq(signingKeys.appId, apps.id), eq(signingKeys.active, true)))
    .where(accountId === null ? undefined : eq(apps.accountId, accountId))
    .orderBy(desc(apps.createdAt), desc(apps.id))
    .limit(limit + 1)
  const { rows, more } = page(found, limit)
  return { apps: rows.map((r) => ({ ...r, createdAt: r.createdAt.toISOString() })), more }
}
