import { desc, eq } from 'drizzle-orm'
import { apps } from '../db/schema'
import type { Context } from '../context'

/** The account's apps, newest first; secrets and keys stay out of the listing. */
export async function listApps(ctx: Context, accountId: string) {
  const rows = await ctx.database.db
    .select({ appId: apps.id, name: apps.name, sandbox: apps.sandbox, createdAt: apps.createdAt })
    .from(apps)
    .where(eq(apps.accountId, accountId))
    .orderBy(desc(apps.createdAt), desc(apps.id))
  return rows.map((r) => ({ ...r, createdAt: r.createdAt.toISOString() }))
}
