import { and, eq, sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { apps } from '../db/schema'

export const MAX_LIST_ENTRIES = 1000

export type ListName = 'hwidBlacklist' | 'hwidWhitelist' | 'ipBlacklist' | 'ipWhitelist'

/**
 * Appends `value` (already normalized) to one list in a single conditional UPDATE. The condition, not
 * the actor, is what keeps processes sharing the database from duplicating an entry or pushing a list
 * past its limit. False when it was present or the list full.
 */
export async function appendEntry(db: DbOrTx, appId: string, name: ListName, value: string): Promise<boolean> {
  const column = apps[name]
  const rows = await db
    .update(apps)
    .set({ [name]: sql`array_append(${column}, ${value}::text)` })
    .where(
      and(
        eq(apps.id, appId),
        sql`NOT (${value}::text = ANY(${column}))`,
        sql`cardinality(${column}) < ${MAX_LIST_ENTRIES}`,
      ),
    )
    .returning({ id: apps.id })
  return rows.length > 0
}

/**
 * The HWID half of an app's lists, as a validate and an offline mint apply it: not blacklisted, and
 * whitelisted when the whitelist has entries.
 */
export function hwidListsAllow(blacklist: ReadonlySet<string>, whitelist: ReadonlySet<string>, hwid: string): boolean {
  return !blacklist.has(hwid) && (whitelist.size === 0 || whitelist.has(hwid))
}
