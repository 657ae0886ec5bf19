import { createHash } from 'node:crypto'
import { asc, eq, inArray } from 'drizzle-orm'
import { accounts, apiKeys, apps, events, licenses, signingKeys, webhooks } from '../../src/db/schema'
import type { Context } from '../../src/context'

/**
 * A digest of every row an account owns, read from the database itself: the account, its API keys, apps
 * (settings, variables, lists), signing keys, licenses, webhooks and recorded events. Equal digests
 * before and after a request mean it changed nothing. Left out: what moves without a request (the
 * dispatcher's progress on events, webhook delivery results).
 */
export async function accountDigest(ctx: Context, accountId: string): Promise<string> {
  const db = ctx.database.db
  const appRows = await db.select().from(apps).where(eq(apps.accountId, accountId)).orderBy(asc(apps.id))
  const appIds = appRows.map((a) => a.id)
  const ofApps = appIds.length > 0
  const state = {
    account: await db.select().from(accounts).where(eq(accounts.id, accountId)),
    apiKeys: await db.select().from(apiKeys).where(eq(apiKeys.accountId, accountId)).orderBy(asc(apiKeys.id)),
    apps: appRows,
    signingKeys: ofApps
      ? await db.select().from(signingKeys).where(inArray(signingKeys.appId, appIds)).orderBy(asc(signingKeys.id))
      : [],
    licenses: ofApps
      ? await db.select().from(licenses).where(inArray(licenses.appId, appIds)).orderBy(asc(licenses.key))
      : [],
    webhooks: ofApps
      ? (await db.select().from(webhooks).where(inArray(webhooks.appId, appIds)).orderBy(asc(webhooks.id))).map(
          ({ lastDeliveryAt: _at, lastDeliveryStatus: _status, ...rest }) => rest,
        )
      : [],
    events: ofApps
      ? await db
          .select({ id: events.id, event: events.event, data: events.data, occurredAt: events.occurredAt })
          .from(events)
          .where(inArray(events.appId, appIds))
          .orderBy(asc(events.id))
      : [],
  }
  return createHash('sha256').update(JSON.stringify(state)).digest('hex')
}
