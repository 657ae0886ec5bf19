import { and, asc, count, eq } from 'drizzle-orm'
import { apps, webhooks } from '../db/schema'
import type { Deps } from '../deps'
import { badRequest, notFound } from '../errors'
import { keys } from '../store/store'
import { signedDelivery } from '../webhooks/payload'
import { recordAttempts } from '../webhooks/record'
import { checkTarget, TargetError } from '../webhooks/target'
import { requireOwnedApp } from './accounts'
import { generateWebhookId, generateWebhookSecret } from './crypto'
import type { EventName } from './events'
import { invalidate } from './invalidate'

/** Webhook management and the test ping. The outbox delivery loop lives in webhooks/dispatcher. */

export const MAX_WEBHOOKS_PER_APP = 5

type Row = typeof webhooks.$inferSelect

/** The public shape of a webhook: never the secret. */
function present(row: Row) {
  return {
    webhookId: row.id,
    appId: row.appId,
    url: row.url,
    events: row.events,
    enabled: row.enabled,
    lastDeliveryAt: row.lastDeliveryAt?.toISOString() ?? null,
    lastDeliveryStatus: row.lastDeliveryStatus,
    createdAt: row.createdAt.toISOString(),
  }
}

async function checkedUrl(deps: Deps, url: string): Promise<string> {
  try {
    return (await checkTarget(url, deps.config.webhookAllowPrivateTargets)).href
  } catch (err) {
    if (err instanceof TargetError) throw badRequest(err.message)
    throw err
  }
}

/** The validate path caches "does this app have a license.validated subscriber": make it re-read. */
function invalidateApp(deps: Deps, appId: string): Promise<void> {
  return invalidate(deps, [keys.appEpoch(appId)])
}

export interface NewWebhook {
  url: string
  events: EventName[]
  enabled?: boolean
}

export async function createWebhook(deps: Deps, accountId: string, appId: string, input: NewWebhook) {
  await requireOwnedApp(deps, accountId, appId)
  const url = await checkedUrl(deps, input.url)
  const secret = generateWebhookSecret()
  const row = await deps.database.db.transaction(async (tx) => {
    // The app row lock serialises concurrent creates, so the limit holds across instances.
    await tx.select({ id: apps.id }).from(apps).where(eq(apps.id, appId)).for('update')
    const [existing] = await tx.select({ n: count() }).from(webhooks).where(eq(webhooks.appId, appId))
    if ((existing?.n ?? 0) >= MAX_WEBHOOKS_PER_APP) {
      throw badRequest(`An app can have at most ${MAX_WEBHOOKS_PER_APP} webhooks`)
    }
    const [inserted] = await tx
      .insert(webhooks)
      .values({
        id: generateWebhookId(),
        appId,
        url,
        events: [...new Set(input.events)],
        enabled: input.enabled ?? true,
        secretEnc: deps.sealer.seal(secret),
      })
      .returning()
    if (!inserted) throw new Error('webhook insert returned nothing')
    return inserted
  })
  await invalidateApp(deps, appId)
  return { ...present(row), secret }
}

export async function listWebhooks(deps: Deps, accountId: string, appId: string) {
  await requireOwnedApp(deps, accountId, appId)
  const rows = await deps.database.db
    .select()
    .from(webhooks)
    .where(eq(webhooks.appId, appId))
    .orderBy(asc(webhooks.createdAt), asc(webhooks.id))
  return rows.map(present)
}

export interface WebhookPatch {
  url?: string
  events?: EventName[]
  enabled?: boolean
}

const missing = () => notFound('Webhook not found in this app')

export async function updateWebhook(
  deps: Deps,
  accountId: string,
  appId: string,
  webhookId: string,
  patch: WebhookPatch,
): Promise<void> {
  await requireOwnedApp(deps, accountId, appId)
  const set: Partial<Pick<Row, 'url' | 'events' | 'enabled'>> = {}
  if (patch.url !== undefined) set.url = await checkedUrl(deps, patch.url)
  if (patch.events !== undefined) set.events = [...new Set(patch.events)]
  if (patch.enabled !== undefined) set.enabled = patch.enabled
  const where = and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId))
  const changed =
    Object.keys(set).length > 0
      ? await deps.database.db.update(webhooks).set(set).where(where).returning({ id: webhooks.id })
      : await deps.database.db.select({ id: webhooks.id }).from(webhooks).where(where)
  if (changed.length === 0) throw missing()
  await invalidateApp(deps, appId)
}

export async function deleteWebhook(deps: Deps, accountId: string, appId: string, webhookId: string): Promise<void> {
  await requireOwnedApp(deps, accountId, appId)
  const gone = await deps.database.db
    .delete(webhooks)
    .where(and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId)))
    .returning({ id: webhooks.id })
  if (gone.length === 0) throw missing()
  await invalidateApp(deps, appId)
}

/** Sample data of test.ping: the shape every event's data has, marked as a test. */
const PING_LICENSE_KEY = 'TEST-TEST-TEST-TEST'

/**
 * Sends a signed test.ping now, on the delivery workers (the address guard applies again there), and
 * records it as the webhook's latest attempt. A disabled webhook can be pinged: it is an explicit request.
 */
export async function sendTestPing(deps: Deps, accountId: string, appId: string, webhookId: string) {
  await requireOwnedApp(deps, accountId, appId)
  const [row] = await deps.database.db
    .select()
    .from(webhooks)
    .where(and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId)))
  if (!row) throw missing()
  const secret = deps.sealer.open(row.secretEnc).toString('utf8')
  const data = { licenseKey: PING_LICENSE_KEY, appId, webhookId, test: true }
  const job = signedDelivery(row.url, secret, 'test.ping', new Date(deps.clock()), JSON.stringify(data))
  const result = await deps.webhookPool.send(job)
  await recordAttempts(deps.database.db, [{ webhookId, at: new Date(deps.clock()), status: result.status }])
  return { ok: true as const, status: result.status }
}
