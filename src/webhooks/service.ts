import { and, asc, count, eq, isNull } from 'drizzle-orm'
import type { Tx } from '../db/client'
import { apps, webhookDeliveries, webhooks } from '../db/schema'
import type { Context } from '../context'
import { ApiError, badRequest, notFound } from '../lib/errors'
import { signedDelivery } from '../delivery/signed-delivery'
import { recordAttempts } from '../delivery/attempts'
import { PING_FETCHES } from '../delivery/fetch-limit'
import { checkTarget, TargetError } from '../delivery/target'
import { requireOwnedApp } from '../apps/service'
import { requireSealingKey } from '../signing/key-check'
import { generateWebhookId, generateWebhookSecret } from '../lib/crypto'
import type { CreatedWebhook, CreateWebhookBody, TestPingResponse, UpdateWebhookBody, Webhook, WebhookList } from './model'

/** Webhook management and the test ping. The outbox delivery loop lives in delivery/dispatch/ (delivery/dispatcher.ts starts it). */

export const MAX_WEBHOOKS_PER_APP = 5

type Row = typeof webhooks.$inferSelect

/** The public shape of a webhook: never the secret. */
function present(row: Row): typeof Webhook.static {
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

async function checkedUrl(ctx: Context, url: string): Promise<string> {
  try {
    return (await checkTarget(url, ctx.config.webhookAllowPrivateTargets)).href
  } catch (err) {
    if (err instanceof TargetError) throw badRequest(err.message)
    throw err
  }
}

/**
 * Webhook changes go through the app's actor: the actor holds "does this app have a license.validated
 * subscriber", which its publish drops here and in every process.
 */
const appChanged = () => ({ app: true })

/** The app's id as stored (a path may spell it in upper case): the actor, the epochs and the rows use it. */
const ownedAppId = async (ctx: Context, accountId: string, appId: string) => (await requireOwnedApp(ctx, accountId, appId)).id

export async function createWebhook(ctx: Context, accountId: string, appId: string, input: typeof CreateWebhookBody.static): Promise<typeof CreatedWebhook.static> {
  appId = await ownedAppId(ctx, accountId, appId)
  const url = await checkedUrl(ctx, input.url)
  const secret = generateWebhookSecret()
  const write = async (tx: Tx) => {
    // First, before any table a master-key rotation locks (src/apps/service.ts rotateSigningKey).
    await requireSealingKey(tx, ctx.sealer)
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
        secretEnc: ctx.sealer.seal(secret),
      })
      .returning()
    if (!inserted) throw new Error('webhook insert returned nothing')
    return inserted
  }
  const row = await ctx.actors.write(appId, write, appChanged)
  return { ...present(row), secret }
}

export async function listWebhooks(ctx: Context, accountId: string, appId: string): Promise<typeof WebhookList.static> {
  appId = await ownedAppId(ctx, accountId, appId)
  const rows = await ctx.database.db
    .select()
    .from(webhooks)
    .where(eq(webhooks.appId, appId))
    .orderBy(asc(webhooks.createdAt), asc(webhooks.id))
  return { webhooks: rows.map(present) }
}

const missing = () => notFound('Webhook not found in this app')

export async function updateWebhook(
  ctx: Context,
  accountId: string,
  appId: string,
  webhookId: string,
  patch: typeof UpdateWebhookBody.static,
): Promise<void> {
  appId = await ownedAppId(ctx, accountId, appId)
  const set: Partial<Pick<Row, 'url' | 'events' | 'enabled'>> = {}
  if (patch.url !== undefined) set.url = await checkedUrl(ctx, patch.url)
  if (patch.events !== undefined) set.events = [...new Set(patch.events)]
  if (patch.enabled !== undefined) set.enabled = patch.enabled
  const where = and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId))
  const changed = await ctx.actors.write(
    appId,
    (tx) =>
      Object.keys(set).length > 0
        ? tx.update(webhooks).set(set).where(where).returning({ id: webhooks.id })
        : tx.select({ id: webhooks.id }).from(webhooks).where(where),
    (rows) => ({ app: rows.length > 0 }),
  )
  if (changed.length === 0) throw missing()
}

export async function deleteWebhook(ctx: Context, accountId: string, appId: string, webhookId: string): Promise<void> {
  appId = await ownedAppId(ctx, accountId, appId)
  const gone = await ctx.actors.write(
    appId,
    async (tx) => {
      // The row first: its lock waits for a fan-out that holds it (claim.ts), whose deliveries the
      // next statement then sees; none is made for it after.
      const rows = await tx.delete(webhooks).where(and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId))).returning({ id: webhooks.id })
      // Only those still owed, through their partial index: the attempted ones go with their events' purge.
      if (rows.length > 0) {
        await tx.delete(webhookDeliveries).where(and(eq(webhookDeliveries.webhookId, webhookId), isNull(webhookDeliveries.attemptedAt)))
      }
      return rows
    },
    (rows) => ({ app: rows.length > 0 }),
  )
  if (gone.length === 0) throw missing()
}

/**
 * Test pings of one account on their way at once, per process. A receiver that hangs holds each for the
 * delivery timeout: without a limit one account's pings to such receivers took every request the
 * delivery workers open, and every other account's pings (and, embedded, its deliveries) waited.
 */
export const TEST_PINGS_PER_ACCOUNT = 8

/** Sample data of test.ping: the shape every event's data has, marked as a test. */
const PING_LICENSE_KEY = 'TEST-TEST-TEST-TEST'

/**
 * Sends a signed test.ping now, on the delivery workers (the address guard applies again there), and
 * records it as the webhook's latest attempt. A disabled webhook can be pinged: it is an explicit request.
 */
export async function sendTestPing(
  ctx: Context,
  accountId: string,
  appId: string,
  webhookId: string,
): Promise<typeof TestPingResponse.static> {
  appId = await ownedAppId(ctx, accountId, appId)
  const [row] = await ctx.database.db
    .select()
    .from(webhooks)
    .where(and(eq(webhooks.id, webhookId), eq(webhooks.appId, appId)))
  if (!row) throw missing()
  const secret = ctx.sealer.open(row.secretEnc).toString('utf8')
  const data = { licenseKey: PING_LICENSE_KEY, appId, webhookId, test: true }
  const job = signedDelivery(row.url, secret, 'test.ping', new Date(ctx.clock()), JSON.stringify(data))
  const retryAfter = { 'retry-after': String(Math.ceil(ctx.webhookPool.timeoutMs / 1000)) }
  const leave = ctx.testPings.enter(accountId)
  if (!leave) {
    throw new ApiError('rate_limited', 429, `At most ${TEST_PINGS_PER_ACCOUNT} test pings of an account are on their way at once; retry after the Retry-After header`, retryAfter)
  }
  // The fetches kept for pings (fetch-limit.ts): past them a ping would wait unsent inside Bun.
  const leaveRoom = ctx.pingFetches.enter('')
  if (!leaveRoom) {
    leave()
    throw new ApiError('rate_limited', 429, `At most ${PING_FETCHES} test pings are on their way on this server at once; retry after the Retry-After header`, retryAfter)
  }
  const result = await ctx.webhookPool.send(job).finally(() => {
    leave()
    leaveRoom()
  })
  await recordAttempts(ctx.database.db, [{ webhookId, at: new Date(ctx.clock()), status: result.status }])
  return { ok: true, status: result.status }
}
