import { desc, eq } from 'drizzle-orm'
import { apps } from '../db/schema'
import type { Deps } from '../deps'

/** The account's apps, newest first; secrets and keys stay out of the listing. */
export async function listApps(deps: Deps, accountId: string) {
  const rows = await deps.database.db
    .select({ appId: apps.id, name: apps.name, sandbox: apps.sandbox, createdAt: apps.createdAt })
    .from(apps)
    .where(eq(apps.accountId, accountId))
    .orderBy(desc(apps.createdAt), desc(apps.id))
  return rows.map((r) => ({ ...r, createdAt: r.createdAt.toISOString() }))
}
