import { describe, expect, test } from 'bun:test'
import { createHmac, randomUUID } from 'node:crypto'
import { existsSync } from 'node:fs'
import { and, eq, inArray, sql } from 'drizzle-orm'
import { type DomainEvent, EVENT_NAMES, type EventName, recordEvents } from '../../src/delivery/outbox'
import { buildContext } from '../../src/boot'
import { openDb } from '../../src/db/client'
import { events, webhookDeliveries } from '../../src/db/schema'
import type { Context } from '../../src/context'
import { startDispatcher } from '../../src/delivery/dispatcher'
import { DeliveryPool } from '../../src/delivery/pool'
import { pinnedTarget, TargetError } from '../../src/delivery/target'
import { TEST_PINGS_PER_ACCOUNT } from '../../src/webhooks/service'
import { DELIVERY_FETCHES, PING_FETCHES } from '../../src/delivery/fetch-limit'
import { createApplication } from '../../src/apps/service'
import { makeTestApp, sharedInfra, TEST_DATABASE_URL, TEST_MASTER_KEY, type TestApp } from '../support/helpers'

// Opening the shared database (and migrating it) takes seconds on a busy machine: do it before any test's clock starts.
await sharedInfra()
import { type Received, type Reply, signatureValid, startReceiver, testCertificate, until } from '../support/webhooks-receiver'

/** A test app whose delivery workers trust the receiver's self-signed certificate. */
function appWithReceiverCa(env: Record<string, string> = {}) {
  return makeTestApp({ env: { NODE_EXTRA_CA_CERTS: testCertificate().certFile, ...env } })
}

async function addHook(t: TestApp, s: { appId: string; apiKey: string }, url: string, evts: readonly string[], enabled = true) {
  const res = await t.req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: { url, events: evts, enabled } })
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body as { webhookId: string; secret: string }
}

/**
 * Two accounts of `t`: `slow`, whose webhook goes to a receiver that hangs (`/backlog`), and `other`,
 * whose webhook goes to one that answers (`/other`); `created` makes an event of either. Disposing it
 * stops both receivers.
 */
async function hangingBeside(t: TestApp) {
  const slow = await t.seed()
  const other = await t.seed()
  const hanging = startReceiver(() => 'hang')
  const answering = startReceiver()
  await addHook(t, slow, hanging.url('/backlog'), ['license.created'])
  await addHook(t, other, answering.url('/other'), ['license.created'])
  const created = (s: { appId: string }) => ({ event: 'license.created' as EventName, data: dataFor('license.created', s.appId, keyFor()) })
  return {
    slow,
    other,
    hanging,
    answering,
    created,
    async [Symbol.asyncDispose]() {
      await hanging[Symbol.asyncDispose]()
      await answering[Symbol.asyncDispose]()
    },
  }
}

async function hooksOf(t: TestApp, s: { appId: string; apiKey: string }) {
  const res = await t.req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })
  return res.body.webhooks as { webhookId: string; lastDeliveryAt: string | null; lastDeliveryStatus: number | null }[]
}

function dataFor(event: EventName, appId: string, licenseKey: string): DomainEvent['data'] {
  if (event === 'license.validated') return { licenseKey, appId, status: 'active', hwid: 'hwid-validated' }
  if (event === 'license.hwid_bound') return { licenseKey, appId, hwid: 'hwid-bound' }
  return { licenseKey, appId }
}

/** Commits events the way producers do: in a transaction, then a wake-up. */
async function emit(ctx: Context, list: { event: EventName; data: DomainEvent['data'] }[], occurredAt = new Date()) {
  await ctx.database.db.transaction((tx) => recordEvents(tx, list.map((e) => ({ ...e, occurredAt }))))
  ctx.bus.notify()
}

const keyFor = () => `T${randomUUID().slice(0, 3)}-${randomUUID().slice(0, 4)}-${randomUUID().slice(0, 4)}-${randomUUID().slice(0, 4)}`.toUpperCase()


/** A second instance on the same database and store, built as boot builds one: its own connection pool (on PostgreSQL), bus, actors and workers. */
async function secondInstance(ctx: Context) {
  const database = TEST_DATABASE_URL ? await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null }) : ctx.database
  const other = await buildContext(ctx.config, { database, store: ctx.store, masterKey: TEST_MASTER_KEY, clock: ctx.clock, embedded: true })
  return {
    ctx: other,
    async [Symbol.asyncDispose]() {
      await other.webhookPool.close()
      if (database !== ctx.database) await database.close()
    },
  }
}

describe('webhook delivery', () => {
  test('every event type is delivered once, signed, with the spec body and headers', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const hook = await addHook(t, s, rx.url('/all'), EVENT_NAMES)
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    const licenseKey = keyFor()
    const occurredAt = new Date(Date.now() - 1234)
    await emit(t.ctx, EVENT_NAMES.map((event) => ({ event, data: dataFor(event, s.appId, licenseKey) })), occurredAt)

    await until(() => rx.at('/all').length >= EVENT_NAMES.length, 'all seven events')
    const got = rx.at('/all')
    expect(got.map((r) => r.body.event).sort()).toEqual([...EVENT_NAMES].sort())
    for (const r of got) {
      expect(signatureValid(r, hook.secret), r.raw).toBe(true)
      expect(signatureValid(r, 'whsec_wrong'), r.raw).toBe(false)
      expect(r.headers['content-type']).toBe('application/json')
      expect(r.headers['x-service-event']).toBe(r.body.event)
      expect(r.headers['x-service-timestamp']).toBe(occurredAt.toISOString())
      expect(r.headers['x-service-signature']).toMatch(/^sha256=[0-9a-f]{64}$/)
      // A receiver written from AuthForge's documentation: its headers, the HMAC of the raw body in bare hex.
      expect(r.headers['x-authforge-event']).toBe(r.body.event)
      expect(r.headers['x-authforge-timestamp']).toBe(occurredAt.toISOString())
      expect(r.headers['x-authforge-signature']).toBe(createHmac('sha256', hook.secret).update(r.raw).digest('hex'))
      expect(Object.keys(r.body)).toEqual(['event', 'timestamp', 'data'])
      expect(r.body.timestamp).toBe(occurredAt.toISOString())
      expect(r.body.data).toMatchObject({ licenseKey, appId: s.appId })
    }
    const byEvent = Object.fromEntries(got.map((r) => [r.body.event, r.body.data]))
    expect(byEvent['license.validated']).toEqual({ licenseKey, appId: s.appId, status: 'active', hwid: 'hwid-validated' })
    expect(byEvent['license.hwid_bound']).toEqual({ licenseKey, appId: s.appId, hwid: 'hwid-bound' })

    await until(async () => (await hooksOf(t, s))[0]?.lastDeliveryStatus === 200, 'lastDeliveryStatus 200')
    const [listed] = await hooksOf(t, s)
    expect(Date.parse(listed!.lastDeliveryAt!)).toBeGreaterThan(Date.now() - 60_000)
    expect(rx.at('/all')).toHaveLength(EVENT_NAMES.length)
  })

  test("deliveries hanging on 16 receivers leave room in Bun's fetches for another account's test ping: it goes at once", async () => {
    const t = await appWithReceiverCa()
    const [hostile, victim] = [await t.seed(), await t.seed()]
    const receivers = Array.from({ length: 16 }, () => startReceiver(() => 'hang'))
    await using answering = startReceiver(() => ({ delayMs: 500 }))
    try {
      // 16 hosts (16 ports), 4 webhooks an app: each host may have its 16 deliveries open, 256 in all.
      const apps = [hostile.appId]
      for (let i = 0; i < 3; i++) apps.push((await createApplication(t.ctx, hostile.accountId, `hanging-${i}`, false)).appId)
      for (const [i, rx] of receivers.entries()) await addHook(t, { appId: apps[i >> 2]!, apiKey: hostile.apiKey }, rx.url('/hang'), ['license.created'])
      const hook = await addHook(t, victim, answering.url('/ping'), ['license.created'])
      await using _d = startDispatcher(t.ctx, { pollMs: 50 })
      await emit(t.ctx, apps.flatMap((appId) => Array.from({ length: 16 }, () => ({ event: 'license.created' as EventName, data: dataFor('license.created', appId, keyFor()) }))))
      const open = () => receivers.reduce((n, rx) => n + rx.at('/hang').length, 0)
      await until(() => open() >= DELIVERY_FETCHES, 'the deliveries the fetch limit leaves room for')
      await Bun.sleep(1_000)
      expect(open()).toBe(DELIVERY_FETCHES)
      const started = performance.now()
      const ping = await t.req('POST', `/v1/apps/${victim.appId}/webhooks/${hook.webhookId}/test`, { apiKey: victim.apiKey })
      expect(ping.body).toEqual({ ok: true, status: 200 })
      expect(performance.now() - started).toBeLessThan(3_000)
    } finally {
      for (const rx of receivers) await rx.stop()
    }
  }, 60_000)

  test('license API changes reach the receiver once each, in order', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const hook = await addHook(t, s, rx.url('/lic'), EVENT_NAMES)
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    expect(created.status, JSON.stringify(created.body)).toBe(201)
    const key: string = created.body.licenses[0].licenseKey
    for (const action of ['revoke', 'activate', 'reset-hwid']) {
      const res = await t.req('PUT', `/v1/licenses/${key}`, { apiKey: s.apiKey, body: { action } })
      expect(res.status, JSON.stringify(res.body)).toBe(200)
    }
    expect((await t.req('DELETE', `/v1/licenses/${key}`, { apiKey: s.apiKey })).status).toBe(200)

    const expected = ['license.created', 'license.revoked', 'license.activated', 'license.hwid_reset', 'license.deleted']
    await until(() => rx.at('/lic').length >= expected.length, 'five license events')
    const got = rx.at('/lic')
    expect(got.map((r) => r.body.event).sort()).toEqual([...expected].sort())
    // The outbox keeps commit order, and timestamps say when each change happened.
    const byTime = [...got].sort((a, b) => a.body.timestamp.localeCompare(b.body.timestamp))
    expect(byTime.map((r) => r.body.event)).toEqual(expected)
    for (const r of got) {
      expect(signatureValid(r, hook.secret)).toBe(true)
      expect(r.body.data).toMatchObject({ licenseKey: key, appId: s.appId })
    }
  })

  test('a disabled webhook receives nothing and an unsubscribed event is not sent', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const created = await addHook(t, s, rx.url('/created'), ['license.created'])
    const disabled = await addHook(t, s, rx.url('/disabled'), EVENT_NAMES, false)
    const revokedOnly = await addHook(t, s, rx.url('/revoked'), ['license.revoked'])
    const toggled = await addHook(t, s, rx.url('/toggled'), ['license.created'])
    await t.req('PUT', `/v1/apps/${s.appId}/webhooks/${toggled.webhookId}`, { apiKey: s.apiKey, body: { enabled: false } })
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    const licenseKey = keyFor()
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, licenseKey) }])
    await emit(t.ctx, [{ event: 'license.revoked', data: dataFor('license.revoked', s.appId, licenseKey) }])

    await until(() => rx.at('/created').length === 1 && rx.at('/revoked').length === 1, 'the subscribed deliveries')
    await until(async () => (await hooksOf(t, s)).filter((h) => h.lastDeliveryStatus === 200).length === 2, 'both recorded')
    expect(rx.at('/created')[0]!.body.event).toBe('license.created')
    expect(rx.at('/revoked')[0]!.body.event).toBe('license.revoked')
    expect(rx.at('/disabled')).toHaveLength(0)
    expect(rx.at('/toggled')).toHaveLength(0)
    // Nothing is owed to the disabled or unsubscribed webhooks either, so re-enabling replays nothing.
    const owed = await t.ctx.database.db
      .select()
      .from(webhookDeliveries)
      .where(inArray(webhookDeliveries.webhookId, [disabled.webhookId, toggled.webhookId, created.webhookId, revokedOnly.webhookId]))
    expect(owed.map((d) => d.webhookId).sort()).toEqual([created.webhookId, revokedOnly.webhookId].sort())
    const hooks = await hooksOf(t, s)
    expect(hooks.find((h) => h.webhookId === disabled.webhookId)?.lastDeliveryStatus).toBeNull()
  })

  test('receiver errors, redirects and refused connections are recorded, never retried or followed', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    const replies: Record<string, Reply> = { '/fail': 500, '/moved': { redirect: '/target' }, '/target': 200 }
    await using rx = startReceiver((path) => replies[path] ?? 200)
    const fail = await addHook(t, s, rx.url('/fail'), ['license.created'])
    const moved = await addHook(t, s, rx.url('/moved'), ['license.created'])
    const refused = await addHook(t, s, 'https://127.0.0.1:9/closed', ['license.created'])
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])

    await until(async () => (await hooksOf(t, s)).every((h) => h.lastDeliveryStatus !== null), 'three attempts recorded')
    const status = Object.fromEntries((await hooksOf(t, s)).map((h) => [h.webhookId, h.lastDeliveryStatus]))
    expect(status).toEqual({ [fail.webhookId]: 500, [moved.webhookId]: 302, [refused.webhookId]: 0 })
    expect(rx.at('/fail')).toHaveLength(1)
    expect(rx.at('/moved')).toHaveLength(1)
    expect(rx.at('/target')).toHaveLength(0)
    const rows = await t.ctx.database.db
      .select()
      .from(webhookDeliveries)
      .where(inArray(webhookDeliveries.webhookId, [fail.webhookId, moved.webhookId, refused.webhookId]))
    expect(rows.map((r) => r.httpStatus).sort()).toEqual([0, 302, 500])
    expect(rows.every((r) => r.attemptedAt !== null)).toBe(true)
  })

  test('a hanging receiver times out as status 0 without holding up other deliveries or API calls', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver((path) => (path === '/hang' ? 'hang' : 200))
    const hang = await addHook(t, s, rx.url('/hang'), ['license.created'])
    await addHook(t, s, rx.url('/fast'), ['license.created'])
    // The spec's 10 s timeout, shortened so the test sees it expire.
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, timeoutMs: 1_500 })
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])

    await until(() => rx.at('/hang').length === 1 && rx.at('/fast').length === 1, 'both receivers reached')
    const started = performance.now()
    const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    expect(created.status).toBe(201)
    expect(performance.now() - started).toBeLessThan(1_000)
    await until(async () => (await hooksOf(t, s)).find((h) => h.webhookId === hang.webhookId)?.lastDeliveryStatus === 0, 'timeout recorded')
    await t.ctx.webhookPool.close()
  })

  test('deliveries queued behind a hanging host go where their webhook now points, or nowhere once it is disabled or deleted', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using hanging = startReceiver(() => 'hang')
    await using rx = startReceiver()
    const moved = await addHook(t, s, hanging.url('/moved'), ['license.created'])
    const disabled = await addHook(t, s, hanging.url('/disabled'), ['license.created'])
    const deleted = await addHook(t, s, hanging.url('/deleted'), ['license.created'])
    // One request at a time to a host: the one that hangs holds it, and the other eight queue behind it.
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, perHost: 1, timeoutMs: 4_000 })
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await emit(t.ctx, [1, 2, 3].map(() => ({ event: 'license.created' as const, data: dataFor('license.created', s.appId, keyFor()) })))
    await until(() => hanging.received.length === 1, 'the hanging host holding its one request')
    const held = hanging.received[0]!.path

    const hook = (id: string) => `/v1/apps/${s.appId}/webhooks/${id}`
    expect((await t.req('PUT', hook(moved.webhookId), { apiKey: s.apiKey, body: { url: rx.url('/moved') } })).status).toBe(200)
    expect((await t.req('PUT', hook(disabled.webhookId), { apiKey: s.apiKey, body: { enabled: false } })).status).toBe(200)
    expect((await t.req('DELETE', hook(deleted.webhookId), { apiKey: s.apiKey })).status).toBe(200)

    // The moved webhook's deliveries still queued go to its new URL, signed as before, well before the held request times out.
    const movedQueued = held === '/moved' ? 2 : 3
    await until(() => rx.at('/moved').length === movedQueued, "the moved webhook's queued deliveries at its new URL", 3_500)
    for (const r of rx.at('/moved')) expect(signatureValid(r, moved.secret), r.raw).toBe(true)
    // The disabled webhook's are closed unsent; the deleted one's are gone with it.
    const owed = async () =>
      t.ctx.database.db.select().from(webhookDeliveries).where(inArray(webhookDeliveries.webhookId, [disabled.webhookId, deleted.webhookId]))
    await until(async () => (await owed()).every((d) => d.attemptedAt !== null), "the disabled webhook's deliveries closed")
    const closed = await owed()
    expect(closed.map((d) => d.webhookId)).toEqual(Array(3).fill(disabled.webhookId))
    expect(closed.map((d) => d.httpStatus).sort()).toEqual(held === '/disabled' ? [0, null, null] : [null, null, null])
    // Once the held request timed out, nothing more reached the old host.
    await Bun.sleep(1_000)
    expect(hanging.received.map((r) => r.path)).toEqual([held])
    expect(rx.received).toHaveLength(movedQueued)
  }, 30_000)

  test('a receiver that hangs holds a few of the workers\' requests, never another receiver\'s deliveries', async () => {
    const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 3_000 })
    await using hanging = startReceiver(() => 'hang')
    await using answering = startReceiver()
    // Outbox deliveries (a test ping, with no webhook, goes past a host's limit).
    const job = (url: string) => ({ url, headers: { 'content-type': 'application/json' }, body: '{}', webhookId: 'wh_test' })
    try {
      // More than a worker has open at once, all to the host that hangs, then one to another host.
      for (let i = 0; i < 80; i++) void pool.send(job(hanging.url('/stuck')))
      await until(() => hanging.at('/stuck').length >= 16, 'the hanging host holding its requests')
      const started = performance.now()
      expect(await pool.send(job(answering.url('/served')))).toEqual({ status: 200 })
      expect(performance.now() - started).toBeLessThan(1_500)
      // The hanging host has no more open than its share.
      expect(hanging.at('/stuck').length).toBe(16)
    } finally {
      await pool.close()
    }
  })

  test('receivers that hang on more hosts than fill 64 requests still leave another host\'s delivery to go at once', async () => {
    const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 3_000 })
    const hanging = Array.from({ length: 5 }, () => startReceiver(() => 'hang'))
    await using answering = startReceiver()
    // Outbox deliveries (a test ping, with no webhook, goes past a host's limit).
    const job = (url: string) => ({ url, headers: { 'content-type': 'application/json' }, body: '{}', webhookId: 'wh_test' })
    try {
      for (const rx of hanging) for (let i = 0; i < 20; i++) void pool.send(job(rx.url('/stuck')))
      await until(() => hanging.every((rx) => rx.at('/stuck').length === 16), 'each hanging host holding its 16 requests')
      const started = performance.now()
      expect(await pool.send(job(answering.url('/served')))).toEqual({ status: 200 })
      expect(performance.now() - started).toBeLessThan(1_500)
    } finally {
      await pool.close()
      for (const rx of hanging) await rx.stop()
    }
  })

  test("one account's receivers that hang with a backlog leave room for other accounts' deliveries once they are seen to be slow", async () => {
    const t = await appWithReceiverCa()
    await using accounts = await hangingBeside(t)
    const { slow, other, hanging, answering, created } = accounts
    // The spec's 10 s timeout, shortened so the test sees the first ones expire.
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, timeoutMs: 3_000 })
    // 8 slots, one account's first delivery on the way within its share. The poll never comes round,
    // and passes never give way to the test's own CPU: wake-ups alone move the deliveries.
    await using _d = startDispatcher(t.ctx, { pollMs: 60_000, maxInFlight: 8, yieldAbove: 2 })
    await emit(t.ctx, Array.from({ length: 30 }, () => created(slow)))
    // No receiver was slow yet: the account alone borrows every slot.
    await until(() => hanging.at('/backlog').length === 8, 'the hanging receiver holding every slot')
    // They time out after more than a second: the next 6 leave a reserve of 2.
    await until(() => hanging.at('/backlog').length === 14, 'the hanging receiver holding all but the reserve')
    const started = performance.now()
    await emit(t.ctx, Array.from({ length: 4 }, () => created(other)))
    await until(() => answering.at('/other').length === 4, "the other account's deliveries")
    // Long before those 6 time out.
    expect(performance.now() - started).toBeLessThan(2_500)
    expect(hanging.at('/backlog')).toHaveLength(14)
    await t.ctx.webhookPool.close()
  })

  test("when one account's receiver starts to hang with every slot, another account's delivery goes once the first timeouts free a few", async () => {
    const t = await appWithReceiverCa()
    await using accounts = await hangingBeside(t)
    const { slow, other, hanging, answering, created } = accounts
    // The spec's 10 s timeout, shortened; the dispatcher's 256 slots, of which the hanging host holds
    // 16 open and the rest wait behind them, 16 freed a timeout.
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 2_000 })
    await using _d = startDispatcher(t.ctx, { pollMs: 200, yieldAbove: 2 })
    await emit(t.ctx, Array.from({ length: 300 }, () => created(slow)))
    await until(() => hanging.at('/backlog').length === 16, 'the hanging receiver holding its 16')
    const started = performance.now()
    await emit(t.ctx, [created(other)])
    await until(() => answering.at('/other').length === 1, "the other account's delivery")
    // After the first timeouts, not after the four it took to free a chunk of 64 slots.
    expect(performance.now() - started).toBeLessThan(4_500)
    await t.ctx.webhookPool.close()
  }, 30_000)

  test('the private-address guard applies again at delivery time', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    // Accepted while private targets were allowed, then the delivery side no longer allows them.
    const hook = await addHook(t, s, rx.url('/private'), ['license.created'])
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: false, extraCaFile: testCertificate().certFile })
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])
    await until(async () => (await hooksOf(t, s))[0]?.lastDeliveryStatus === 0, 'blocked attempt recorded')
    const ping = await t.req('POST', `/v1/apps/${s.appId}/webhooks/${hook.webhookId}/test`, { apiKey: s.apiKey })
    expect(ping.body).toEqual({ ok: true, status: 0 })
    expect(rx.received).toHaveLength(0)
    await t.ctx.webhookPool.close()
  })
})

describe('test ping', () => {
  test("sends a signed test.ping now and answers with the receiver's status", async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    const replies: Record<string, number> = { '/ok': 204, '/teapot': 418 }
    await using rx = startReceiver((path) => replies[path] ?? 200)
    const ok = await addHook(t, s, rx.url('/ok'), ['license.created'])
    const teapot = await addHook(t, s, rx.url('/teapot'), ['license.created'], false)
    const refused = await addHook(t, s, 'https://127.0.0.1:9/closed', ['license.created'])
    const ping = (id: string) => t.req('POST', `/v1/apps/${s.appId}/webhooks/${id}/test`, { apiKey: s.apiKey })

    expect(await ping(ok.webhookId)).toMatchObject({ status: 200, body: { ok: true, status: 204 } })
    expect(await ping(teapot.webhookId)).toMatchObject({ status: 200, body: { ok: true, status: 418 } })
    expect(await ping(refused.webhookId)).toMatchObject({ status: 200, body: { ok: true, status: 0 } })

    const [sent] = rx.at('/ok') as [Received]
    expect(sent.body.event).toBe('test.ping')
    expect(sent.headers['x-service-event']).toBe('test.ping')
    expect(sent.headers['x-service-timestamp']).toBe(sent.body.timestamp)
    expect(Math.abs(Date.parse(sent.body.timestamp) - Date.now())).toBeLessThan(60_000)
    expect(sent.body.data).toMatchObject({ appId: s.appId, webhookId: ok.webhookId, test: true })
    expect(typeof sent.body.data.licenseKey).toBe('string')
    expect(signatureValid(sent, ok.secret)).toBe(true)
    expect(signatureValid(rx.at('/teapot')[0]!, teapot.secret)).toBe(true)

    const status = Object.fromEntries((await hooksOf(t, s)).map((h) => [h.webhookId, h.lastDeliveryStatus]))
    expect(status).toEqual({ [ok.webhookId]: 204, [teapot.webhookId]: 418, [refused.webhookId]: 0 })
    for (const h of await hooksOf(t, s)) expect(h.lastDeliveryAt).not.toBeNull()
  })
})

describe('test pings in flight', () => {
  test("the server's are limited to the fetches kept for them: past those a ping is a 429, not a wait inside Bun", async () => {
    const t = await appWithReceiverCa()
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, timeoutMs: 3_000 })
    await using rx = startReceiver(() => 'hang')
    const pingFrom = async () => {
      const s = await t.seed()
      const { webhookId } = await addHook(t, s, rx.url('/hang'), ['license.created'])
      return () => t.req('POST', `/v1/apps/${s.appId}/webhooks/${webhookId}/test`, { apiKey: s.apiKey })
    }
    const pings: Promise<{ status: number; body: any }>[] = []
    while (pings.length < PING_FETCHES) {
      const ping = await pingFrom()
      for (let n = 0; n < TEST_PINGS_PER_ACCOUNT && pings.length < PING_FETCHES; n++) pings.push(ping())
    }
    await until(() => rx.received.length === PING_FETCHES, 'the pings the fetches kept for them let through')
    // An account with none on its way: the server's limit, not the account's.
    const refused = await (await pingFrom())()
    expect(refused.status).toBe(429)
    expect(refused.body.message).toContain('on this server')
    for (const done of await Promise.all(pings)) expect(done.body).toEqual({ ok: true, status: 0 })
    await t.ctx.webhookPool.close()
  })

  test("an account's are limited, so its receivers that hang cannot take the delivery workers from other accounts", async () => {
    const t = await appWithReceiverCa()
    t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, timeoutMs: 3_000 })
    const [busy, other] = [await t.seed(), await t.seed()]
    await using rx = startReceiver((path) => (path === '/hang' ? 'hang' : 200))
    const hanging = await addHook(t, busy, rx.url('/hang'), ['license.created'])
    const answering = await addHook(t, other, rx.url('/ok'), ['license.created'])
    const ping = (s: { appId: string; apiKey: string }, id: string) =>
      t.req('POST', `/v1/apps/${s.appId}/webhooks/${id}/test`, { apiKey: s.apiKey })

    const held = Array.from({ length: TEST_PINGS_PER_ACCOUNT }, () => ping(busy, hanging.webhookId))
    await until(() => rx.at('/hang').length === TEST_PINGS_PER_ACCOUNT, 'the pings the limit lets through')
    const refused = await ping(busy, hanging.webhookId)
    expect(refused.status).toBe(429)
    expect(refused.body.error).toBe('rate_limited')
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0)
    // Not the key's bucket, whose headers would say requests remain.
    expect(refused.headers.get('ratelimit-remaining')).toBeNull()
    // The limit is the account's: another's ping goes out at once.
    const started = performance.now()
    expect(await ping(other, answering.webhookId)).toMatchObject({ status: 200, body: { ok: true, status: 200 } })
    expect(performance.now() - started).toBeLessThan(1_500)

    for (const done of await Promise.all(held)) expect(done.body).toEqual({ ok: true, status: 0 })
    // Each one that ends makes room again; only the one past the limit was not sent.
    expect(await ping(busy, hanging.webhookId)).toMatchObject({ status: 200, body: { ok: true, status: 0 } })
    expect(rx.at('/hang')).toHaveLength(TEST_PINGS_PER_ACCOUNT + 1)
    await t.ctx.webhookPool.close()
  })
})

describe('exactly one attempt per delivery', () => {
  test('events committed while no dispatcher ran are sent when one starts; live claims and attempts are not repeated', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const hook = await addHook(t, s, rx.url('/backlog'), ['license.created'])
    const db = t.ctx.database.db
    const keysByCase = { pending: keyFor(), expired: keyFor(), live: keyFor(), done: keyFor(), sentinel: keyFor() }
    const ids: Record<string, number> = {}
    for (const [name, licenseKey] of Object.entries(keysByCase)) {
      const [row] = await db
        .insert(events)
        .values({ appId: s.appId, event: 'license.created', data: { licenseKey, appId: s.appId }, occurredAt: new Date() })
        .returning({ id: events.id })
      ids[name] = row!.id
    }
    // What a crash leaves behind: a claim whose lease ran out mid-send, a claim another instance
    // holds right now, and an attempt already recorded.
    await db.update(events).set({ dispatchedAt: new Date() }).where(inArray(events.id, [ids.expired!, ids.live!, ids.done!]))
    await db.insert(webhookDeliveries).values([
      { eventId: ids.expired!, webhookId: hook.webhookId, claimedAt: sql`now() - interval '5 minutes'` },
      { eventId: ids.live!, webhookId: hook.webhookId, claimedAt: sql`now()` },
      { eventId: ids.done!, webhookId: hook.webhookId, claimedAt: sql`now() - interval '1 minute'`, attemptedAt: new Date(), httpStatus: 200 },
    ])

    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await until(() => rx.at('/backlog').length >= 3, 'the backlog')
    await until(async () => {
      const [row] = await db
        .select()
        .from(webhookDeliveries)
        .where(and(eq(webhookDeliveries.eventId, ids.sentinel!), eq(webhookDeliveries.webhookId, hook.webhookId)))
      return row?.attemptedAt != null
    }, 'the sentinel recorded')
    const sent = rx.at('/backlog').map((r) => r.body.data.licenseKey).sort()
    expect(sent).toEqual([keysByCase.pending, keysByCase.expired, keysByCase.sentinel].sort())
    const [live] = await db
      .select()
      .from(webhookDeliveries)
      .where(and(eq(webhookDeliveries.eventId, ids.live!), eq(webhookDeliveries.webhookId, hook.webhookId)))
    expect(live?.attemptedAt).toBeNull()
    // Remove the live claim so later tests' dispatchers don't send it when its lease runs out (no
    // foreign key cascades from events to deliveries).
    await db.delete(webhookDeliveries).where(eq(webhookDeliveries.eventId, ids.live!))
    await db.delete(events).where(eq(events.id, ids.live!))
  })

  test('a delivery waiting on a slow receiver longer than the lease is not taken over by another instance', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver(() => ({ delayMs: 3_000 }))
    const hook = await addHook(t, s, rx.url('/slow'), ['license.created'])
    await using second = await secondInstance(t.ctx)
    const attempted = async () =>
      (await t.ctx.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.webhookId, hook.webhookId))).filter(
        (r) => r.attemptedAt !== null,
      ).length
    {
      // A lease of a second: the first instance's claim would run out three times over while it waits.
      await using _one = startDispatcher(t.ctx, { pollMs: 50, leaseSeconds: 1 })
      await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])
      await until(() => rx.at('/slow').length === 1, 'the delivery open on the receiver')
      await using _two = startDispatcher(second.ctx, { pollMs: 50, leaseSeconds: 1 })
      await until(async () => (await attempted()) === 1, 'the delivery recorded')
    }
    expect(rx.at('/slow')).toHaveLength(1)
  })

  test('two dispatchers on one database send each delivery exactly once', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const a = await addHook(t, s, rx.url('/a'), ['license.created', 'license.deleted'])
    const b = await addHook(t, s, rx.url('/b'), ['license.created'])
    await using second = await secondInstance(t.ctx)
    const other = second.ctx
    {
      await using _one = startDispatcher(t.ctx, { pollMs: 20, maxInFlight: 8 })
      await using _two = startDispatcher(other, { pollMs: 20, maxInFlight: 8 })
      const n = 60
      const list = Array.from({ length: n }, (_, i) => ({
        event: (i % 2 === 0 ? 'license.created' : 'license.deleted') as EventName,
        data: { licenseKey: keyFor(), appId: s.appId, seq: i },
      }))
      for (let i = 0; i < n; i += 10) {
        await emit(t.ctx, list.slice(i, i + 10))
        other.bus.notify()
      }
      const expectA = n
      const expectB = n / 2
      await until(async () => {
        const [row] = await t.ctx.database.db
          .select({ n: sql<number>`count(*)::int` })
          .from(webhookDeliveries)
          .where(and(inArray(webhookDeliveries.webhookId, [a.webhookId, b.webhookId]), sql`${webhookDeliveries.attemptedAt} IS NOT NULL`))
        return Number(row?.n) === expectA + expectB
      }, 'every delivery recorded')
      const seqs = (path: string) => rx.at(path).map((r) => r.body.data.seq as number)
      expect(seqs('/a').sort((x, y) => x - y)).toEqual(list.map((_, i) => i))
      expect(seqs('/b').sort((x, y) => x - y)).toEqual(list.map((_, i) => i).filter((i) => i % 2 === 0))
    }
  })
})

test('batches written outside a transaction (validate) are fanned out and sent once each, with two instances writing and sending', async () => {
  const t = await appWithReceiverCa()
  const s = await t.seed()
  await using rx = startReceiver()
  const hook = await addHook(t, s, rx.url('/batches'), ['license.validated'])
  await using second = await secondInstance(t.ctx)
  const other = second.ctx
  {
    // Few slots, so the two instances' fan-outs take a few events at a time and race for the rest.
    await using _one = startDispatcher(t.ctx, { pollMs: 20, maxInFlight: 8 })
    await using _two = startDispatcher(other, { pollMs: 20, maxInFlight: 8 })
    const n = 80
    const writes: Promise<void>[] = []
    for (let i = 0; i < n; i += 10) {
      const ctx = (i / 10) % 2 === 0 ? t.ctx : other
      const list = Array.from({ length: 10 }, (_, j) => ({
        event: 'license.validated' as const,
        data: { licenseKey: keyFor(), appId: s.appId, status: 'active', hwid: `h${i + j}`, seq: i + j },
        occurredAt: new Date(),
      }))
      writes.push(recordEvents(ctx.database.db, list).then(() => ctx.bus.notify()))
    }
    await Promise.all(writes)
    await until(async () => {
      const [row] = await t.ctx.database.db
        .select({ n: sql<number>`count(*)::int` })
        .from(webhookDeliveries)
        .where(and(eq(webhookDeliveries.webhookId, hook.webhookId), sql`${webhookDeliveries.attemptedAt} IS NOT NULL`))
      return Number(row?.n) === n
    }, 'every delivery recorded')
    const seqs = rx.at('/batches').map((r) => r.body.data.seq as number)
    expect(seqs.sort((x, y) => x - y)).toEqual(Array.from({ length: n }, (_, i) => i))
    for (const r of rx.at('/batches')) expect(signatureValid(r, hook.secret)).toBe(true)
  }
})

describe('client authentication events', () => {
  const validate = (t: TestApp, s: { appId: string; appSecret: string }, licenseKey: string, hwid: string) =>
    t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid, nonce: randomUUID() },
    })

  test('validate sends license.hwid_bound on a new binding and license.validated on every login', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    const hook = await addHook(t, s, rx.url('/auth'), ['license.validated', 'license.hwid_bound'])
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    const key: string = created.body.licenses[0].licenseKey
    for (let i = 0; i < 3; i++) {
      const res = await validate(t, s, key, 'device-1')
      expect(res.status, JSON.stringify(res.body)).toBe(200)
    }

    await until(() => rx.at('/auth').length >= 4, 'three logins and one binding')
    const got = rx.at('/auth')
    expect(got.filter((r) => r.body.event === 'license.hwid_bound').map((r) => r.body.data)).toEqual([
      { licenseKey: key, appId: s.appId, hwid: 'device-1' },
    ])
    const validated = got.filter((r) => r.body.event === 'license.validated')
    expect(validated).toHaveLength(3)
    for (const r of validated) {
      expect(r.body.data).toMatchObject({ licenseKey: key, appId: s.appId, status: 'active', hwid: 'device-1' })
    }
    for (const r of got) expect(signatureValid(r, hook.secret)).toBe(true)
  })

  test('a hanging receiver does not delay validate', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    // Declared first so it is disposed last: the receiver lets go of its hanging requests before.
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await using rx = startReceiver(() => 'hang')
    await addHook(t, s, rx.url('/slow'), ['license.validated', 'license.hwid_bound'])
    const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    const key: string = created.body.licenses[0].licenseKey
    expect((await validate(t, s, key, 'device-1')).status).toBe(200)
    await until(() => rx.at('/slow').length >= 2, 'the receiver holding the first deliveries')

    // Each delivery now waits the full 10 s on the receiver; logins must not.
    const started = performance.now()
    for (let i = 0; i < 10; i++) expect((await validate(t, s, key, 'device-1')).status).toBe(200)
    const elapsed = performance.now() - started
    expect(elapsed).toBeLessThan(2_000)
    await until(() => rx.at('/slow').length >= 12, 'every login delivered while earlier ones still hang')
  })
})

describe('outbox retention', () => {
  test('dispatched events older than the retention are purged once every delivery was attempted', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    const hook = await addHook(t, s, 'https://127.0.0.1:9/closed', ['license.created'])
    const db = t.ctx.database.db
    const old = sql`now() - interval '8 days'`
    // Ids grow with time and the purge walks the oldest ids first: old rows get ids below any other.
    const oldId = () => -Math.floor(1e12 + Math.random() * 1e12)
    const insert = async (dispatchedAt: ReturnType<typeof sql> | Date, id?: number) => {
      const [row] = await db
        .insert(events)
        .values({ id, appId: s.appId, event: 'license.created', data: { licenseKey: keyFor(), appId: s.appId }, occurredAt: new Date(), dispatchedAt })
        .returning({ id: events.id })
      return row!.id
    }
    const done = await insert(old, oldId())
    const owed = await insert(old, oldId())
    const recent = await insert(new Date())
    await db.insert(webhookDeliveries).values([
      { eventId: done, webhookId: hook.webhookId, attemptedAt: new Date(), httpStatus: 200 },
      // Still owed (its claim is live): kept until attempted, whatever its age.
      { eventId: owed, webhookId: hook.webhookId, claimedAt: sql`now()` },
      { eventId: recent, webhookId: hook.webhookId, attemptedAt: new Date(), httpStatus: 200 },
    ])
    const left = async () =>
      (await db.select({ id: events.id }).from(events).where(inArray(events.id, [done, owed, recent]))).map((r) => r.id)

    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await until(async () => !(await left()).includes(done), 'the old event purged')
    expect((await left()).sort((a, b) => a - b)).toEqual([owed, recent].sort((a, b) => a - b))
    expect(await db.select().from(webhookDeliveries).where(eq(webhookDeliveries.eventId, done))).toEqual([])
    // No foreign key cascades from events: the purge deletes both, and so does this cleanup.
    await db.delete(webhookDeliveries).where(eq(webhookDeliveries.eventId, owed))
    await db.delete(events).where(eq(events.id, owed))
  })
})

describe('DNS pinning at delivery time', () => {
  test('a request aimed at the vetted address keeps the host name for Host, SNI and the certificate check', async () => {
    await using rx = startReceiver()
    const url = new URL(rx.url('/pinned').replace('127.0.0.1', 'localhost'))
    const pinned = pinnedTarget(url, '127.0.0.1')!
    expect(pinned.url.hostname).toBe('127.0.0.1')
    expect(pinned).toMatchObject({ host: url.host, serverName: 'localhost' })
    const res = await fetch(pinned.url, {
      method: 'POST',
      body: '{}',
      headers: { host: pinned.host },
      tls: { ca: [testCertificate().cert], serverName: pinned.serverName },
    })
    expect(res.status).toBe(200)
    expect(rx.at('/pinned')[0]?.headers.host).toBe(url.host)
    // The certificate must match the name, not the address: a wrong name is refused.
    const wrong = await fetch(pinned.url, {
      method: 'POST',
      body: '{}',
      tls: { ca: [testCertificate().cert], serverName: 'evil.test' },
    }).catch((err: { code?: string }) => err.code)
    expect(wrong).toBe('ERR_TLS_CERT_ALTNAME_INVALID')
    expect(pinnedTarget(new URL('https://[::1]:8443/x'), '::1')).toBeNull()
    expect(pinnedTarget(new URL('https://hooks.example.com/x'), '2606:4700::1')?.url.href).toBe('https://[2606:4700::1]/x')
    // An address the URL cannot hold is not left for the name to be resolved again.
    expect(() => pinnedTarget(new URL('https://hooks.example.com/x'), '2606:4700::1111%eth0')).toThrow(TargetError)
  })
})

describe('priority', () => {
  test.skipIf(!existsSync('/proc/stat'))('while the host is saturated commits do not wake the dispatcher; its poll still delivers', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    await using rx = startReceiver()
    await addHook(t, s, rx.url('/busy'), ['license.created'])
    // Committed before the start: the start's own pass sends it, which shows the dispatcher runs (on
    // PostgreSQL a worker starts it, later by however long its imports and connection take).
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])
    // Thresholds of 0: any host counts as saturated once a CPU reading covers an interval.
    // The poll's 4 s leave the steps below (800 ms of sleeps) room on a slow, busy host: at 1.5 s the
    // poll came first there.
    await using _d = startDispatcher(t.ctx, { pollMs: 4_000, yieldAbove: 0, yieldApiAbove: 0 })
    await until(() => rx.at('/busy').length === 1, 'the delivery by the start\'s pass')
    // Past the first interval of readings, well before the first poll.
    await Bun.sleep(400)
    await emit(t.ctx, [{ event: 'license.created', data: dataFor('license.created', s.appId, keyFor()) }])
    await Bun.sleep(400)
    expect(rx.at('/busy')).toHaveLength(1)
    await until(() => rx.at('/busy').length === 2, 'the delivery by the poll')
  })
})

describe('shutdown', () => {
  test('stop hands back claimed deliveries that never left the queue; the next start sends them at once', async () => {
    const t = await appWithReceiverCa()
    const s = await t.seed()
    const rx = startReceiver(() => 'hang')
    const hook = await addHook(t, s, rx.url('/queued'), ['license.created'])
    // One request open at a time, so the rest of the claimed deliveries wait in the worker's queue.
    // The open one gives up after a short timeout, so stop() finishes without the receiver's help.
    t.ctx.webhookPool = new DeliveryPool({
      allowPrivate: true,
      extraCaFile: testCertificate().certFile,
      size: 1,
      concurrency: 1,
      timeoutMs: 500,
    })
    const first = startDispatcher(t.ctx, { pollMs: 50 })
    await emit(t.ctx, Array.from({ length: 5 }, () => ({ event: 'license.created' as EventName, data: dataFor('license.created', s.appId, keyFor()) })))
    await until(() => rx.at('/queued').length === 1, 'the first delivery open on the receiver')
    await first.stop()
    await rx.stop()

    const rows = () =>
      t.ctx.database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.webhookId, hook.webhookId))
    const after = await rows()
    expect(after).toHaveLength(5)
    expect(after.filter((r) => r.attemptedAt !== null)).toHaveLength(1)
    expect(after.filter((r) => r.attemptedAt === null && r.claimedAt === null)).toHaveLength(4)

    await using _next = startDispatcher(t.ctx, { pollMs: 50 })
    // Well within the 2-minute lease: the handed-back rows are claimable right away.
    await until(async () => (await rows()).every((r) => r.attemptedAt !== null), 'the handed-back deliveries attempted')
    expect(rx.at('/queued')).toHaveLength(1)
    await t.ctx.webhookPool.close()
  })
})
