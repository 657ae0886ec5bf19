import { beforeAll, describe, expect, test } from 'bun:test'
import { asc, eq, sql } from 'drizzle-orm'
import { createApiKey, revokeApiKey } from '../../src/accounts/service'
import { generateLicenseKey } from '../../src/lib/crypto'
import { createLicenses } from '../../src/licenses/service'
import { events, licenses } from '../../src/db/schema'
import { makeTestApp, type TestApp } from '../support/helpers'
import { licenseEpochKey } from '../support/client'

const KEY_SHAPE = /^[A-HJ-NP-Z2-9]{4}-[A-HJ-NP-Z2-9]{4}-[A-HJ-NP-Z2-9]{4}-[A-HJ-NP-Z2-9]{4}$/
const errorBody = (error: string) => ({ error, message: expect.any(String) })

let t: TestApp
let now = Date.parse('2026-03-01T12:00:00.000Z')
// A clock the tests move, so creation order is visible in createdAt.
const tick = () => (now += 1000)

beforeAll(async () => {
  t = await makeTestApp({ clock: () => now })
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

async function create(s: Seeded, body: Record<string, unknown> = {}) {
  const res = await t.req('POST', '/v1/licenses', {
    apiKey: s.apiKey,
    body: { appId: s.appId, ...body },
  })
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body.licenses as any[]
}

async function createOne(s: Seeded, body: Record<string, unknown> = {}) {
  const [license] = await create(s, body)
  return license
}

function eventsOf(licenseKey: string) {
  return t.ctx.database.db
    .select()
    .from(events)
    .where(sql`${events.data}->>'licenseKey' = ${licenseKey}`)
    .orderBy(asc(events.id))
}

async function epochOf(s: Seeded, licenseKey: string) {
  const [epoch] = await t.ctx.store.epochs([await licenseEpochKey(t.ctx, s.appId, licenseKey)])
  return epoch ?? 0
}

async function bindHwids(licenseKey: string, hwids: string[]) {
  await t.ctx.database.db.update(licenses).set({ hwids }).where(eq(licenses.key, licenseKey))
}

describe('POST /v1/licenses', () => {
  test('creates one active lifetime license with the defaults', async () => {
    const s = await t.seed()
    const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    expect(res.status).toBe(201)
    expect(res.body.licenses).toHaveLength(1)
    const [license] = res.body.licenses
    expect(license).toEqual({
      licenseKey: expect.stringMatching(KEY_SHAPE),
      appId: s.appId,
      status: 'active',
      expiresAt: null,
      maxHwidSlots: 1,
      unlimitedHwidSlots: false,
      label: null,
      createdAt: new Date(now).toISOString(),
    })
    expect(license.hwidList).toBeUndefined()
  })

  test('creates 100 distinct keys with every field set, one license.created event each', async () => {
    const s = await t.seed()
    const created = await create(s, {
      quantity: 100,
      expiresAt: '2030-06-01T10:00:00+02:00',
      maxHwidSlots: 16,
      label: 'x'.repeat(128),
    })
    expect(created).toHaveLength(100)
    expect(new Set(created.map((l) => l.licenseKey)).size).toBe(100)
    for (const l of created) {
      expect(l).toMatchObject({
        status: 'active',
        expiresAt: '2030-06-01T08:00:00.000Z',
        maxHwidSlots: 16,
        label: 'x'.repeat(128),
      })
    }
    const rows = await t.ctx.database.db
      .select()
      .from(events)
      .where(sql`${events.appId} = ${s.appId} AND ${events.event} = 'license.created'`)
    expect(rows.map((r) => r.data.licenseKey).sort()).toEqual(
      created.map((l) => l.licenseKey).sort(),
    )
    expect(rows[0]?.data).toMatchObject({
      appId: s.appId,
      maxHwidSlots: 16,
      expiresAt: '2030-06-01T08:00:00.000Z',
    })
  })

  test('unlimitedHwidSlots is stored and returned; maxHwidSlots is kept as given', async () => {
    const s = await t.seed()
    const license = await createOne(s, { unlimitedHwidSlots: true, maxHwidSlots: 4 })
    expect(license).toMatchObject({ unlimitedHwidSlots: true, maxHwidSlots: 4 })
    const detail = await t.req('GET', `/v1/licenses/${license.licenseKey}`, { apiKey: s.apiKey })
    expect(detail.body.unlimitedHwidSlots).toBe(true)
  })

  test('with unlimitedHwidSlots, maxHwidSlots is ignored as the spec says: any integer is taken, one outside 1 to 16 recorded as 1', async () => {
    const s = await t.seed()
    for (const maxHwidSlots of [0, 17, -3, 1000]) {
      const license = await createOne(s, { unlimitedHwidSlots: true, maxHwidSlots })
      expect([maxHwidSlots, license]).toMatchObject([maxHwidSlots, { unlimitedHwidSlots: true, maxHwidSlots: 1 }])
    }
    // Not a whole number is still a mistyped field.
    const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, unlimitedHwidSlots: true, maxHwidSlots: 2.5 } })
    expect(res.status).toBe(400)
    const limited = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, unlimitedHwidSlots: false, maxHwidSlots: 17 } })
    expect([limited.status, limited.body]).toEqual([400, { error: 'bad_request', message: 'maxHwidSlots must be an integer from 1 to 16' }])
  })

  test('expiresAt: null means lifetime; a date alone is midnight UTC; a time without offset is UTC', async () => {
    const s = await t.seed()
    expect((await createOne(s, { expiresAt: null })).expiresAt).toBeNull()
    expect((await createOne(s, { expiresAt: '2031-02-28' })).expiresAt).toBe(
      '2031-02-28T00:00:00.000Z',
    )
    expect((await createOne(s, { expiresAt: '2031-02-28T13:14:15.5' })).expiresAt).toBe(
      '2031-02-28T13:14:15.500Z',
    )
  })

  test('bumps the cache epoch of each new key', async () => {
    const s = await t.seed()
    const license = await createOne(s)
    expect(await epochOf(s, license.licenseKey)).toBeGreaterThan(0)
  })

  describe.each([
    ['missing appId', { appId: undefined }],
    ['appId not a string', { appId: 5 }],
    ['quantity 0', { quantity: 0 }],
    ['quantity 101', { quantity: 101 }],
    ['quantity not whole', { quantity: 1.5 }],
    ['maxHwidSlots 0', { maxHwidSlots: 0 }],
    ['maxHwidSlots 17', { maxHwidSlots: 17 }],
    ['unlimitedHwidSlots not boolean', { unlimitedHwidSlots: 'yes' }],
    ['label of 129 characters', { label: 'x'.repeat(129) }],
    ['expiresAt not a date', { expiresAt: 'next tuesday' }],
    ['expiresAt an impossible date', { expiresAt: '2027-02-30' }],
    ['expiresAt with hour 24', { expiresAt: '2027-01-01T24:00:00Z' }],
    ['expiresAt a number', { expiresAt: 1893456000 }],
  ])('400 bad_request: %s', (_name, patch) => {
    test('is refused and creates nothing', async () => {
      const s = await t.seed()
      // JSON drops an undefined appId, which is how the missing case is sent.
      const body = { appId: s.appId, ...patch }
      const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body })
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      const list = await t.req('GET', `/v1/licenses?appId=${s.appId}`, { apiKey: s.apiKey })
      expect(list.body.licenses).toEqual([])
    })
  })

  test('a generated key that clashes, with a stored key or within the batch, is replaced', async () => {
    const s = await t.seed()
    const other = await t.seed()
    const taken = (await createOne(other)).licenseKey
    const fresh = [generateLicenseKey(), generateLicenseKey(), generateLicenseKey()]
    const sequence = [taken, fresh[0], fresh[0], taken, fresh[1], fresh[2]]
    const newKey = () => sequence.shift() ?? generateLicenseKey()
    const created = await createLicenses(
      t.ctx,
      s.accountId,
      { appId: s.appId, quantity: 3 },
      newKey,
    )
    expect(created.map((l) => l.licenseKey).sort()).toEqual([...fresh].sort())
    const theirs = await t.req('GET', `/v1/licenses/${taken}`, { apiKey: other.apiKey })
    expect(theirs.body.appId).toBe(other.appId)
  })

  test('when no unique key can be found nothing is created and no event is written', async () => {
    const s = await t.seed()
    const taken = (await createOne(s)).licenseKey
    const first = generateLicenseKey()
    const sequence = [first]
    const newKey = () => sequence.shift() ?? taken
    const attempt = createLicenses(t.ctx, s.accountId, { appId: s.appId, quantity: 2 }, newKey)
    await expect(attempt).rejects.toThrow()
    expect((await t.req('GET', `/v1/licenses/${first}`, { apiKey: s.apiKey })).status).toBe(404)
    expect(await eventsOf(first)).toEqual([])
  })

  test('400 on a body that is not JSON', async () => {
    const s = await t.seed()
    const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: '{"appId":' })
    expect(res.status).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
  })

  test('402 no_credits when the balance is not positive', async () => {
    const s = await t.seed({ credits: 0 })
    const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    expect(res.status).toBe(402)
    expect(res.body).toEqual(errorBody('no_credits'))
  })

  test('creating licenses spends no credits', async () => {
    const s = await t.seed({ credits: 1 })
    await create(s, { quantity: 5 })
    await create(s)
    const account = await t.req('GET', '/v1/account', { apiKey: s.apiKey })
    expect(account.body.credits).toBe(1)
  })

  test.each([
    ['an app of another account', async (other: Seeded) => other.appId],
    ['an app that does not exist', async () => '00000000-0000-4000-8000-000000000000'],
    ['an appId that is not a UUID', async () => 'not-an-app'],
  ])('403 forbidden for %s', async (_name, appIdOf) => {
    const s = await t.seed()
    const other = await t.seed()
    const res = await t.req('POST', '/v1/licenses', {
      apiKey: s.apiKey,
      body: { appId: await appIdOf(other) },
    })
    expect(res.status).toBe(403)
    expect(res.body).toEqual(errorBody('forbidden'))
  })
})

describe('401 invalid_api_key on every license route', () => {
  const routes = (appId: string, key: string) =>
    [
      ['POST', '/v1/licenses', { appId }],
      ['GET', `/v1/licenses?appId=${appId}`, undefined],
      ['GET', `/v1/licenses/${key}`, undefined],
      ['PUT', `/v1/licenses/${key}`, { action: 'revoke' }],
      ['DELETE', `/v1/licenses/${key}`, undefined],
    ] as const

  test.each([
    ['no Authorization header', async () => undefined],
    ['a malformed key', async () => 'not-a-key'],
    ['an unknown key', async () => 'svc_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'],
    [
      'a revoked key',
      async (s: Seeded) => {
        const apiKey = await createApiKey(t.ctx, s.accountId)
        await revokeApiKey(t.ctx, apiKey)
        return apiKey
      },
    ],
  ])('%s', async (_name, keyOf) => {
    const s = await t.seed()
    const license = await createOne(s)
    const apiKey = await keyOf(s)
    for (const [method, path, body] of routes(s.appId, license.licenseKey)) {
      const res = await t.req(method, path, { apiKey, body })
      expect(res.status, `${method} ${path}`).toBe(401)
      expect(res.body).toEqual(errorBody('invalid_api_key'))
    }
    const still = await t.req('GET', `/v1/licenses/${license.licenseKey}`, { apiKey: s.apiKey })
    expect(still.body.status).toBe('active')
  })
  test('authentication is checked before the body: a keyless request with a bad body gets 401', async () => {
    const s = await t.seed()
    const cases = [
      ['POST', '/v1/licenses', { quantity: 'many' }],
      ['PUT', `/v1/licenses/${(await createOne(s)).licenseKey}`, { action: 'explode' }],
      ['PUT', `/v1/apps/${s.appId}/variables`, [1, 2]],
      ['PUT', `/v1/apps/${s.appId}/security`, { ipBlacklist: 'x' }],
    ] as const
    for (const [method, path, body] of cases) {
      const res = await t.req(method, path, { body })
      expect(res.status, `${method} ${path}`).toBe(401)
      expect(res.body).toEqual(errorBody('invalid_api_key'))
    }
  })
})

describe('GET /v1/licenses', () => {
  test('pages newest first over more than two pages without repeating or losing a key', async () => {
    const s = await t.seed()
    const made: string[] = []
    for (let i = 0; i < 4; i++) {
      tick()
      // Same-millisecond batches exercise the key tie-break of the keyset.
      made.push(...(await create(s, { quantity: 3 })).map((l) => l.licenseKey))
    }
    const seen: string[] = []
    const pages: any[][] = []
    let cursor: string | null = null
    do {
      const query: string = `/v1/licenses?appId=${s.appId}&limit=5${cursor ? `&cursor=${cursor}` : ''}`
      const res = await t.req('GET', query, { apiKey: s.apiKey })
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      pages.push(res.body.licenses)
      seen.push(...res.body.licenses.map((l: any) => l.licenseKey))
      cursor = res.body.cursor
    } while (cursor !== null)
    expect(pages.map((p) => p.length)).toEqual([5, 5, 2])
    expect(new Set(seen).size).toBe(seen.length)
    expect([...seen].sort()).toEqual([...made].sort())
    const all = pages.flat()
    const order = [...all].sort((a, b) =>
      a.createdAt === b.createdAt
        ? a.licenseKey < b.licenseKey
          ? 1
          : -1
        : a.createdAt < b.createdAt
          ? 1
          : -1,
    )
    expect(all.map((l) => l.licenseKey)).toEqual(order.map((l) => l.licenseKey))
    expect(all[0]).toHaveProperty('hwidList', [])
  })

  test('cursor is null when the last page is exactly full, and the default limit is 50', async () => {
    const s = await t.seed()
    await create(s, { quantity: 50 })
    const res = await t.req('GET', `/v1/licenses?appId=${s.appId}`, { apiKey: s.apiKey })
    expect(res.body.licenses).toHaveLength(50)
    expect(res.body.cursor).toBeNull()
    await create(s)
    const more = await t.req('GET', `/v1/licenses?appId=${s.appId}`, { apiKey: s.apiKey })
    expect(more.body.licenses).toHaveLength(50)
    expect(more.body.cursor).toEqual(expect.any(String))
  })

  test('limit 200 and limit 1 are accepted', async () => {
    const s = await t.seed()
    await create(s, { quantity: 2 })
    const big = await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=200`, { apiKey: s.apiKey })
    expect(big.body.licenses).toHaveLength(2)
    const one = await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=1`, { apiKey: s.apiKey })
    expect(one.body.licenses).toHaveLength(1)
    expect(one.body.cursor).toEqual(expect.any(String))
  })

  test('lists only the requested app', async () => {
    const s = await t.seed()
    const mine = await createOne(s)
    const other = await t.seed()
    await createOne(other)
    const res = await t.req('GET', `/v1/licenses?appId=${s.appId}`, { apiKey: s.apiKey })
    expect(res.body.licenses.map((l: any) => l.licenseKey)).toEqual([mine.licenseKey])
  })

  describe.each([
    ['missing appId', ''],
    ['limit 0', '&limit=0'],
    ['limit 201', '&limit=201'],
    ['limit not a number', '&limit=ten'],
    // What coercion would read as numbers: the limit is digits as sent.
    ['limit in hex', '&limit=0x10'],
    ['limit with an exponent', '&limit=1e1'],
    ['limit after a space', '&limit=%201'],
    ['limit given twice', '&limit=1&limit=2'],
    ['appId given twice', '&appId=00000000-0000-4000-8000-000000000000'],
    ['an unknown parameter', '&zz=1'],
    // Names of Object.prototype's own properties, unknown all the same.
    ['an unknown parameter named constructor', '&constructor=1'],
    ['an unknown parameter named __proto__', '&__proto__=1'],
    ['cursor not base64url', '&cursor=***'],
    ['cursor of garbage', `&cursor=${Buffer.from('hello').toString('base64url')}`],
    [
      'cursor with a bad date',
      `&cursor=${Buffer.from('yesterday|AAAA-BBBB-CCCC-DDDD').toString('base64url')}`,
    ],
    [
      'cursor with a bad key',
      `&cursor=${Buffer.from('2026-01-01T00:00:00.000Z|nope').toString('base64url')}`,
    ],
  ])('400 bad_request: %s', (name, suffix) => {
    test('is refused', async () => {
      const s = await t.seed()
      const path =
        name === 'missing appId' ? '/v1/licenses' : `/v1/licenses?appId=${s.appId}${suffix}`
      const res = await t.req('GET', path, { apiKey: s.apiKey })
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      // The message names the parameter.
      if (suffix.startsWith('&limit')) expect(res.body.message).toContain('limit')
      if (name.startsWith('an unknown')) expect(res.body.message).toBe(`Unknown field "${suffix.slice(1, suffix.indexOf('='))}"`)
      // The key was checked first: its bucket's headers are there, and without a key the answer is 401.
      expect(res.headers.get('ratelimit-limit')).toEqual(expect.any(String))
      const keyless = await t.req('GET', path)
      expect(keyless.status, JSON.stringify(keyless.body)).toBe(401)
    })
  })

  test("403 for another account's app or an absent app", async () => {
    const s = await t.seed()
    const other = await t.seed()
    for (const appId of [other.appId, '00000000-0000-4000-8000-000000000000']) {
      const res = await t.req('GET', `/v1/licenses?appId=${appId}`, { apiKey: s.apiKey })
      expect(res.status).toBe(403)
      expect(res.body).toEqual(errorBody('forbidden'))
    }
  })
})

describe('GET /v1/licenses/:licenseKey', () => {
  test('returns hwidList, hwid (first bound) and label', async () => {
    const s = await t.seed()
    const license = await createOne(s, { label: 'Customer 42', maxHwidSlots: 3 })
    const unbound = await t.req('GET', `/v1/licenses/${license.licenseKey}`, { apiKey: s.apiKey })
    expect(unbound.status).toBe(200)
    expect(unbound.body).toEqual({ ...license, hwidList: [], hwid: null })
    await bindHwids(license.licenseKey, ['hw-first', 'hw-second'])
    const bound = await t.req('GET', `/v1/licenses/${license.licenseKey}`, { apiKey: s.apiKey })
    expect(bound.body).toMatchObject({
      hwidList: ['hw-first', 'hw-second'],
      hwid: 'hw-first',
      label: 'Customer 42',
    })
  })

  test.each([
    ['an absent key', 'ZZZZ-ZZZZ-ZZZZ-ZZZZ'],
    ['a malformed key', 'not-a-license'],
  ])('404 not_found for %s', async (_name, key) => {
    const s = await t.seed()
    const res = await t.req('GET', `/v1/licenses/${key}`, { apiKey: s.apiKey })
    expect(res.status).toBe(404)
    expect(res.body).toEqual(errorBody('not_found'))
  })

  test('403 for a license of another account', async () => {
    const s = await t.seed()
    const other = await t.seed()
    const theirs = await createOne(other)
    const res = await t.req('GET', `/v1/licenses/${theirs.licenseKey}`, { apiKey: s.apiKey })
    expect(res.status).toBe(403)
    expect(res.body).toEqual(errorBody('forbidden'))
  })
})

describe('PUT /v1/licenses/:licenseKey', () => {
  const put = (s: Seeded, key: string, body: unknown) =>
    t.req('PUT', `/v1/licenses/${key}`, { apiKey: s.apiKey, body })

  test('revoke, then revoke again (no-op), then activate, then activate again (no-op)', async () => {
    const s = await t.seed()
    const { licenseKey } = await createOne(s)
    const before = await epochOf(s, licenseKey)

    const revoked = await put(s, licenseKey, { action: 'revoke' })
    expect(revoked.status).toBe(200)
    expect(revoked.body).toEqual({
      ok: true,
      license: expect.objectContaining({ licenseKey, status: 'revoked', hwidList: [] }),
    })
    expect((await eventsOf(licenseKey)).map((e) => e.event)).toEqual([
      'license.created',
      'license.revoked',
    ])
    const afterRevoke = await epochOf(s, licenseKey)
    expect(afterRevoke).toBeGreaterThan(before)

    const again = await put(s, licenseKey, { action: 'revoke' })
    expect(again.status).toBe(200)
    expect(again.body.license.status).toBe('revoked')
    expect(await eventsOf(licenseKey)).toHaveLength(2)
    expect(await epochOf(s, licenseKey)).toBe(afterRevoke)

    const activated = await put(s, licenseKey, { action: 'activate' })
    expect(activated.body.license.status).toBe('active')
    const activate2 = await put(s, licenseKey, { action: 'activate' })
    expect(activate2.status).toBe(200)
    const evs = await eventsOf(licenseKey)
    expect(evs.map((e) => e.event)).toEqual([
      'license.created',
      'license.revoked',
      'license.activated',
    ])
    expect(evs[1]?.data).toMatchObject({ licenseKey, appId: s.appId, status: 'revoked' })
    // Stamped with the injected clock, inside the transaction that made the change.
    expect(evs[1]?.occurredAt.getTime()).toBe(now)
  })

  test('extend sets expiresAt, keeps the status (also on a revoked license) and emits nothing', async () => {
    const s = await t.seed()
    const { licenseKey } = await createOne(s, { expiresAt: '2027-01-01T00:00:00Z' })
    await put(s, licenseKey, { action: 'revoke' })
    const res = await put(s, licenseKey, {
      action: 'extend',
      expiresAt: '2028-05-06T07:08:09.123Z',
    })
    expect(res.status).toBe(200)
    expect(res.body.license).toMatchObject({
      status: 'revoked',
      expiresAt: '2028-05-06T07:08:09.123Z',
    })
    const lifetime = await put(s, licenseKey, { action: 'extend', expiresAt: null })
    expect(lifetime.body.license.expiresAt).toBeNull()
    expect((await eventsOf(licenseKey)).map((e) => e.event)).toEqual([
      'license.created',
      'license.revoked',
    ])
  })

  test('reset-hwid clears the bindings and emits license.hwid_reset', async () => {
    const s = await t.seed()
    const { licenseKey } = await createOne(s, { maxHwidSlots: 2 })
    await bindHwids(licenseKey, ['a', 'b'])
    const res = await put(s, licenseKey, { action: 'reset-hwid' })
    expect(res.status).toBe(200)
    expect(res.body.license).toMatchObject({ status: 'active', hwidList: [] })
    const evs = await eventsOf(licenseKey)
    expect(evs.at(-1)).toMatchObject({
      event: 'license.hwid_reset',
      appId: s.appId,
      data: { licenseKey, appId: s.appId, previousHwidList: ['a', 'b'] },
      dispatchedAt: null,
    })
    const get = await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })
    expect(get.body).toMatchObject({ hwidList: [], hwid: null })
  })

  describe.each([
    ['missing action', {}],
    ['unknown action', { action: 'suspend' }],
    ['extend without expiresAt', { action: 'extend' }],
    ['extend with a bad date', { action: 'extend', expiresAt: '2027-13-01' }],
    ['extend with a number', { action: 'extend', expiresAt: 12 }],
    ['expiresAt with revoke', { action: 'revoke', expiresAt: '2030-01-01' }],
  ])('400 bad_request: %s', (_name, body) => {
    test('changes nothing', async () => {
      const s = await t.seed()
      const license = await createOne(s)
      const res = await put(s, license.licenseKey, body)
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      const get = await t.req('GET', `/v1/licenses/${license.licenseKey}`, { apiKey: s.apiKey })
      expect(get.body).toMatchObject({ status: 'active', expiresAt: null })
    })
  })

  test('a bad body is 400 even for an absent key', async () => {
    const s = await t.seed()
    const res = await put(s, 'ZZZZ-ZZZZ-ZZZZ-ZZZZ', { action: 'extend' })
    expect(res.status).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
  })

  test("404 for an absent or malformed key, 403 for another account's license", async () => {
    const s = await t.seed()
    for (const key of ['ZZZZ-ZZZZ-ZZZZ-ZZZZ', 'nope']) {
      const res = await put(s, key, { action: 'revoke' })
      expect(res.status).toBe(404)
      expect(res.body).toEqual(errorBody('not_found'))
    }
    const other = await t.seed()
    const theirs = await createOne(other)
    const res = await put(s, theirs.licenseKey, { action: 'revoke' })
    expect(res.status).toBe(403)
    expect(res.body).toEqual(errorBody('forbidden'))
    const get = await t.req('GET', `/v1/licenses/${theirs.licenseKey}`, { apiKey: other.apiKey })
    expect(get.body.status).toBe('active')
  })

  test('a path that is not a key is not echoed in the 404: it may be kilobytes and control characters', async () => {
    const s = await t.seed()
    const hostile = `%1B%5B2J${'A'.repeat(4000)}`
    const res = await t.req('GET', `/v1/licenses/${hostile}`, { apiKey: s.apiKey })
    expect(res.status).toBe(404)
    expect(res.body).toEqual(errorBody('not_found'))
    expect(res.body.message).not.toContain('AAAA')
    expect(res.body.message).not.toContain('\u001b')
  })

  test('concurrent revoke and activate leave one consistent state and one event per real change', async () => {
    const s = await t.seed()
    const { licenseKey } = await createOne(s)
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        put(s, licenseKey, { action: i % 2 === 0 ? 'revoke' : 'activate' }),
      ),
    )
    expect(results.every((r) => r.status === 200)).toBe(true)
    const evs = (await eventsOf(licenseKey)).map((e) => e.event).slice(1)
    // Events must alternate: no transition is recorded twice in a row.
    for (let i = 1; i < evs.length; i++) expect(evs[i]).not.toBe(evs[i - 1])
    const final = await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })
    const expected =
      evs.length === 0 ? 'active' : evs.at(-1) === 'license.revoked' ? 'revoked' : 'active'
    expect(final.body.status).toBe(expected)
  })
})

describe('DELETE /v1/licenses/:licenseKey', () => {
  test('removes the license permanently and emits license.deleted', async () => {
    const s = await t.seed()
    const { licenseKey } = await createOne(s)
    const before = await epochOf(s, licenseKey)
    const res = await t.req('DELETE', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ ok: true })
    expect((await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })).status).toBe(
      404,
    )
    const evs = await eventsOf(licenseKey)
    expect(evs.map((e) => e.event)).toEqual(['license.created', 'license.deleted'])
    expect(evs[1]?.data).toMatchObject({ licenseKey, appId: s.appId })
    expect(await epochOf(s, licenseKey)).toBeGreaterThan(before)
    const again = await t.req('DELETE', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })
    expect(again.status).toBe(404)
    expect(again.body).toEqual(errorBody('not_found'))
  })

  test("403 for another account's license, which survives", async () => {
    const s = await t.seed()
    const other = await t.seed()
    const theirs = await createOne(other)
    const res = await t.req('DELETE', `/v1/licenses/${theirs.licenseKey}`, { apiKey: s.apiKey })
    expect(res.status).toBe(403)
    expect(res.body).toEqual(errorBody('forbidden'))
    expect(
      (await t.req('GET', `/v1/licenses/${theirs.licenseKey}`, { apiKey: other.apiKey })).status,
    ).toBe(200)
  })

  test('404 for a malformed key', async () => {
    const s = await t.seed()
    const res = await t.req('DELETE', '/v1/licenses/abc', { apiKey: s.apiKey })
    expect(res.status).toBe(404)
    expect(res.body).toEqual(errorBody('not_found'))
  })
})

describe('validation messages name the field and what it must be', () => {
  test.each([
    [{ quantity: 101 }, 'quantity must be an integer from 1 to 100'],
    [{ quantity: 'many' }, 'quantity must be an integer from 1 to 100'],
    [{ label: 'x'.repeat(129) }, 'label must be a string of at most 128 characters'],
    [{ unlimitedHwidSlots: 'yes' }, 'unlimitedHwidSlots must be true or false'],
  ])('%j', async (extra, message) => {
    const s = await t.seed()
    const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, ...extra } })
    expect(res.status).toBe(400)
    expect(res.body).toEqual({ error: 'bad_request', message })
  })
})
