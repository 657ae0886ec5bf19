import { describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { webhooks } from '../../src/db/schema'
import { recordAttempts } from '../../src/delivery/attempts'
import { isPublicAddress } from '../../src/delivery/target'
import { makeTestApp, sharedInfra } from '../support/helpers'
import { appEpochKey } from '../support/client'

// Opening the shared database (and migrating it) takes seconds on a busy machine: do it before any test's clock starts.
await sharedInfra()

const hookUrl = 'https://127.0.0.1:9/hook'
const newHook = (over: Record<string, unknown> = {}) => ({ url: hookUrl, events: ['license.created'], ...over })

describe('webhook management', () => {
  test('create returns the secret once; list hides it and reports no delivery yet', async () => {
    const { req, seed, ctx } = await makeTestApp()
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, {
      apiKey: s.apiKey,
      body: newHook({ events: ['license.created', 'license.revoked', 'license.created'] }),
    })
    expect(created.status, JSON.stringify(created.body)).toBe(201)
    expect(created.body).toMatchObject({
      appId: s.appId,
      url: hookUrl,
      events: ['license.created', 'license.revoked'],
      enabled: true,
      lastDeliveryAt: null,
      lastDeliveryStatus: null,
    })
    expect(created.body.webhookId).toMatch(/^wh_[A-Za-z0-9_-]+$/)
    expect(created.body.secret).toMatch(/^whsec_[A-Za-z0-9_-]{20,}$/)
    expect(new Date(created.body.createdAt).toISOString()).toBe(created.body.createdAt)

    const listed = await req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })
    expect(listed.status).toBe(200)
    expect(listed.body.webhooks).toHaveLength(1)
    const [hook] = listed.body.webhooks
    expect(hook).not.toHaveProperty('secret')
    expect(hook).toEqual({ ...created.body, secret: undefined })
    expect(JSON.stringify(listed.body)).not.toContain(created.body.secret)

    // At rest the secret is sealed, never in the clear.
    const [row] = await ctx.database.db.select().from(webhooks).where(eq(webhooks.id, created.body.webhookId))
    expect(row?.secretEnc).not.toContain(created.body.secret)
    expect(ctx.sealer.open(row!.secretEnc).toString()).toBe(created.body.secret)
  })

  test('enabled can be given at creation', async () => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook({ enabled: false }) })
    expect(created.status).toBe(201)
    expect(created.body.enabled).toBe(false)
  })

  test.each([
    ['plain http', newHook({ url: 'http://127.0.0.1/hook' })],
    ['not a URL', newHook({ url: 'not a url' })],
    ['ftp scheme', newHook({ url: 'ftp://127.0.0.1/x' })],
    ['credentials in the URL', newHook({ url: 'https://user:pw@127.0.0.1/x' })],
    ['port 0, where nothing listens', newHook({ url: 'https://1.1.1.1:0/x' })],
    ['an over-long URL', newHook({ url: `https://127.0.0.1/${'a'.repeat(2100)}` })],
    // 724 characters as sent, 4,224 once percent-encoded as stored and sent: no delivery could go.
    ['a URL over-long once normalized', newHook({ url: `https://127.0.0.1/${'é'.repeat(700)}` })],
    ['empty events', newHook({ events: [] })],
    ['an unknown event', newHook({ events: ['license.exploded'] })],
    ['test.ping, which is not subscribable', newHook({ events: ['test.ping'] })],
    ['events not an array', newHook({ events: 'license.created' })],
    ['missing url', { events: ['license.created'] }],
    ['missing events', { url: hookUrl }],
    ['enabled not a boolean', newHook({ enabled: 'yes' })],
  ])('create refuses %s with 400 bad_request', async (_, body) => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const res = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body })
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body.error).toBe('bad_request')
    expect(typeof res.body.message).toBe('string')
  })

  test('at most 5 webhooks per app; deleting one makes room', async () => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const ids: string[] = []
    for (let i = 0; i < 5; i++) {
      const res = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
      expect(res.status).toBe(201)
      ids.push(res.body.webhookId)
    }
    const sixth = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    expect(sixth.status).toBe(400)
    expect(sixth.body).toEqual({ error: 'bad_request', message: 'An app can have at most 5 webhooks' })
    expect((await req('DELETE', `/v1/apps/${s.appId}/webhooks/${ids[0]}`, { apiKey: s.apiKey })).status).toBe(200)
    expect((await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })).status).toBe(201)
  })

  test('concurrent creates never exceed 5', async () => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const results = await Promise.all(
      Array.from({ length: 8 }, () => req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })),
    )
    expect(results.filter((r) => r.status === 201)).toHaveLength(5)
    expect(results.filter((r) => r.status === 400)).toHaveLength(3)
  })

  test('update changes only the fields given', async () => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    const path = `/v1/apps/${s.appId}/webhooks/${created.body.webhookId}`
    const list = async () => (await req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })).body.webhooks[0]

    expect(await req('PUT', path, { apiKey: s.apiKey, body: { enabled: false } })).toMatchObject({ status: 200, body: { ok: true } })
    expect(await list()).toMatchObject({ url: hookUrl, events: ['license.created'], enabled: false })

    await req('PUT', path, { apiKey: s.apiKey, body: { events: ['license.deleted', 'license.validated'] } })
    expect(await list()).toMatchObject({ url: hookUrl, events: ['license.deleted', 'license.validated'], enabled: false })

    await req('PUT', path, { apiKey: s.apiKey, body: { url: 'https://127.0.0.1:10/other', enabled: true } })
    expect(await list()).toMatchObject({ url: 'https://127.0.0.1:10/other', events: ['license.deleted', 'license.validated'], enabled: true })

    expect(await req('PUT', path, { apiKey: s.apiKey, body: {} })).toMatchObject({ status: 200, body: { ok: true } })
    expect(await list()).toMatchObject({ url: 'https://127.0.0.1:10/other', enabled: true })
  })

  test.each([
    ['plain http', { url: 'http://127.0.0.1/x' }],
    ['empty events', { events: [] }],
    ['test.ping', { events: ['test.ping'] }],
    ['enabled not a boolean', { enabled: 1 }],
  ])('update refuses %s with 400 and changes nothing', async (_, body) => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    const res = await req('PUT', `/v1/apps/${s.appId}/webhooks/${created.body.webhookId}`, { apiKey: s.apiKey, body })
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body.error).toBe('bad_request')
    const [hook] = (await req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })).body.webhooks
    expect(hook).toMatchObject({ url: hookUrl, events: ['license.created'], enabled: true })
  })

  test('delete removes the webhook; a second delete is 404', async () => {
    const { req, seed } = await makeTestApp()
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    const path = `/v1/apps/${s.appId}/webhooks/${created.body.webhookId}`
    expect(await req('DELETE', path, { apiKey: s.apiKey })).toMatchObject({ status: 200, body: { ok: true } })
    expect((await req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })).body).toEqual({ webhooks: [] })
    expect(await req('DELETE', path, { apiKey: s.apiKey })).toMatchObject({ status: 404, body: { error: 'not_found' } })
  })

  test('unknown webhooks, and webhooks of another app of the same account, are 404', async () => {
    const { req, seed, ctx } = await makeTestApp()
    const s = await seed()
    const { createApplication } = await import('../../src/apps/service')
    const other = await createApplication(ctx, s.accountId, 'Other app', false)
    const created = await req('POST', `/v1/apps/${other.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    for (const id of ['wh_nope', created.body.webhookId]) {
      const base = `/v1/apps/${s.appId}/webhooks/${id}`
      expect((await req('PUT', base, { apiKey: s.apiKey, body: { enabled: false } })).status).toBe(404)
      expect((await req('DELETE', base, { apiKey: s.apiKey })).status).toBe(404)
      expect((await req('POST', `${base}/test`, { apiKey: s.apiKey })).status).toBe(404)
    }
    const [untouched] = (await req('GET', `/v1/apps/${other.appId}/webhooks`, { apiKey: s.apiKey })).body.webhooks
    expect(untouched.enabled).toBe(true)
  })

  test('another account, an absent app and a malformed app id are 403; no key is 401', async () => {
    const { req, seed } = await makeTestApp()
    const mine = await seed()
    const theirs = await seed()
    const created = await req('POST', `/v1/apps/${theirs.appId}/webhooks`, { apiKey: theirs.apiKey, body: newHook() })
    const hook = `/v1/apps/${theirs.appId}/webhooks/${created.body.webhookId}`
    const calls: [string, string, unknown?][] = [
      ['POST', `/v1/apps/${theirs.appId}/webhooks`, newHook()],
      ['GET', `/v1/apps/${theirs.appId}/webhooks`],
      ['PUT', hook, { enabled: false }],
      ['DELETE', hook],
      ['POST', `${hook}/test`],
      ['GET', '/v1/apps/00000000-0000-4000-8000-000000000000/webhooks'],
      ['GET', '/v1/apps/not-a-uuid/webhooks'],
    ]
    for (const [method, path, body] of calls) {
      const res = await req(method, path, { apiKey: mine.apiKey, body })
      expect(res.status, `${method} ${path}`).toBe(403)
      expect(res.body.error).toBe('forbidden')
    }
    const anonymous = await req('GET', `/v1/apps/${mine.appId}/webhooks`)
    expect(anonymous.status).toBe(401)
    expect(anonymous.body.error).toBe('invalid_api_key')
    const [still] = (await req('GET', `/v1/apps/${theirs.appId}/webhooks`, { apiKey: theirs.apiKey })).body.webhooks
    expect(still.enabled).toBe(true)
  })

  test("every change bumps the app's cache epoch so validate re-reads its subscribers", async () => {
    const { req, seed, ctx } = await makeTestApp()
    const s = await seed()
    const epoch = async () => (await ctx.store.epochs([await appEpochKey(ctx, s.appId)]))[0] ?? 0
    const e0 = await epoch()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
    const e1 = await epoch()
    expect(e1).toBeGreaterThan(e0)
    await req('PUT', `/v1/apps/${s.appId}/webhooks/${created.body.webhookId}`, { apiKey: s.apiKey, body: { enabled: false } })
    const e2 = await epoch()
    expect(e2).toBeGreaterThan(e1)
    await req('DELETE', `/v1/apps/${s.appId}/webhooks/${created.body.webhookId}`, { apiKey: s.apiKey })
    expect(await epoch()).toBeGreaterThan(e2)
  })
})

test("a webhook's last delivery is the one recorded last, whatever its clock said: its time and status, of one attempt", async () => {
  const { req, seed, ctx } = await makeTestApp()
  const s = await seed()
  const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook() })
  const { webhookId } = created.body
  const at = new Date('2031-01-01T12:00:00.000Z')
  await recordAttempts(ctx.database.db, [{ webhookId, at, status: 200 }])
  // From an instance whose clock is a minute behind (or this one's, stepped back).
  await recordAttempts(ctx.database.db, [{ webhookId, at: new Date(at.getTime() - 60_000), status: 500 }])
  const [hook] = (await req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })).body.webhooks
  expect(hook).toMatchObject({ lastDeliveryStatus: 500, lastDeliveryAt: new Date(at.getTime() - 60_000).toISOString() })
})

describe('private-address guard (WEBHOOK_ALLOW_PRIVATE_TARGETS=false)', () => {
  test.each([
    'https://127.0.0.1/hook',
    'https://localhost/hook',
    'https://10.1.2.3/hook',
    'https://172.20.0.1/hook',
    'https://192.168.1.10/hook',
    'https://169.254.169.254/latest/meta-data',
    'https://100.64.0.1/hook',
    'https://0.0.0.0/hook',
    'https://[::1]/hook',
    'https://[::ffff:127.0.0.1]/hook',
    'https://[fd00::1]/hook',
    'https://[fe80::1]/hook',
    'https://2130706433/hook',
    'https://0x7f.1/hook',
    'https://012.0.0.1/hook',
    'https://[::ffff:0:a00:1]/hook',
  ])('refuses %s at create and at update', async (url) => {
    const { req, seed } = await makeTestApp({ env: { WEBHOOK_ALLOW_PRIVATE_TARGETS: 'false' } })
    const s = await seed()
    const created = await req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: newHook({ url }) })
    expect(created.status, JSON.stringify(created.body)).toBe(400)
    expect(created.body.error).toBe('bad_request')

    const ok = await req('POST', `/v1/apps/${s.appId}/webhooks`, {
      apiKey: s.apiKey,
      body: newHook({ url: 'https://93.184.215.14/hook' }),
    })
    expect(ok.status, JSON.stringify(ok.body)).toBe(201)
    const updated = await req('PUT', `/v1/apps/${s.appId}/webhooks/${ok.body.webhookId}`, { apiKey: s.apiKey, body: { url } })
    expect(updated.status).toBe(400)
  })

  test.each([
    ['8.8.8.8', true],
    ['93.184.215.14', true],
    ['2606:4700::1111', true],
    ['127.0.0.1', false],
    ['10.0.0.1', false],
    ['172.31.255.255', false],
    ['172.32.0.1', true],
    ['192.168.0.1', false],
    ['169.254.169.254', false],
    ['100.127.255.255', false],
    ['198.18.0.1', false],
    ['224.0.0.1', false],
    ['255.255.255.255', false],
    ['::1', false],
    ['::', false],
    ['::ffff:10.0.0.1', false],
    ['::ffff:8.8.8.8', true],
    ['fc00::1', false],
    ['fe80::1', false],
    ['ff02::1', false],
    ['64:ff9b::a00:1', false],
    ['2002:a00:1::1', false],
    ['2001:db8::1', false],
    ['2001:4860:4860::8888', true],
    ['0:0:0:0:0:FFFF:A9FE:A9FE', false],
    ['::1.2.3.4', false],
    ['::ffff:0:10.0.0.1', false],
    ['64:ff9b:1::a00:1', false],
    ['100::1', false],
    ['2001::1', false],
    ['3fff::1', false],
    ['5f00::1', false],
    ['fec0::1', false],
    ['fe80::1%eth0', false],
    ['8.8.8.08', false],
  ])('isPublicAddress(%s) is %p', (address, expected) => {
    expect(isPublicAddress(address)).toBe(expected)
  })
})
