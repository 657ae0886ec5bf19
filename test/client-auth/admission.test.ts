/**
 * Unauthenticated traffic never reaches PostgreSQL: the app secret, the app's state and lists and a
 * token of the caller's IP limit come before any license lookup, and made-up keys never push real
 * licenses out of the cache.
 */
import { afterEach, expect, spyOn, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { AppActors } from '../../src/actors/registry'
import { generateLicenseKey } from '../../src/lib/crypto'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'

const PER_IP = 10
// In-process requests come from 0.0.0.0; trusting it as a proxy lets each test name the caller's IP.
// The budget for absent apps refills a token a second: a test that counts its reads holds the clock still
// (on a loaded host 100 validates one after another took over a second).
let heldAt: number | null = null
afterEach(() => {
  heldAt = null
})
const t = await makeTestApp({ clock: () => heldAt ?? Date.now(), env: { VALIDATE_LIMIT_PER_IP: String(PER_IP), TRUSTED_PROXIES: '0.0.0.0' } })

const validate = (body: { appId: string; appSecret: string; licenseKey: string }, ip: string) =>
  t.req('POST', '/auth/validate', { body: { ...body, hwid: hwid(), nonce: nonce() }, headers: { 'x-forwarded-for': ip } })

test('validates with a wrong app secret and random keys load no license and the app once', async () => {
  const s = await t.seed()
  const before = ({ ...t.ctx.actors.loads })
  const replies = await Promise.all(
    Array.from({ length: 300 }, (_, i) =>
      validate({ appId: s.appId, appSecret: randomBytes(16).toString('hex'), licenseKey: generateLicenseKey() }, `198.51.100.${i % 250}`),
    ),
  )
  expect(new Set(replies.map((r) => `${r.status} ${r.body.error}`))).toEqual(new Set(['401 invalid_app']))
  const after = ({ ...t.ctx.actors.loads })
  expect(after.licenses - before.licenses).toBe(0)
  expect(after.apps - before.apps).toBeLessThanOrEqual(1)
})

test('a flood of absent keys with the right secret from one IP is limited before PostgreSQL', async () => {
  const s = await t.seed()
  const ip = '203.0.113.7'
  const before = ({ ...t.ctx.actors.loads })
  const statuses: number[] = []
  for (let i = 0; i < 60; i++) {
    statuses.push((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: generateLicenseKey() }, ip)).status)
  }
  expect(statuses.filter((x) => x === 401)).toHaveLength(PER_IP)
  expect(statuses.filter((x) => x === 429)).toHaveLength(60 - PER_IP)
  expect(({ ...t.ctx.actors.loads }).licenses - before.licenses).toBe(PER_IP)
  // Another IP still gets through: the limit is the caller's, not the app's.
  const real = await insertLicense(t.ctx, s.appId)
  expect((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: real }, '203.0.113.8')).status).toBe(200)
})

test("a lookup whose entry is gone before use (a store generation flip, a full absent bound) takes a token again: reads never outnumber the IP's tokens", async () => {
  const s = await t.seed()
  const ip = '203.0.113.9'
  const before = t.ctx.actors.loads.licenses
  const actors = t.ctx.actors
  // The entry just read is dropped before its use, as a generation flip or a full absent bound would.
  const gone = spyOn(actors, 'cachedLicense').mockImplementation((appId, licenseKey) => {
    actors.forgetLicense(appId, licenseKey)
    return undefined
  })
  try {
    // Every attempt finds its entry gone: the request gives up after its attempts, each one a read.
    await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: generateLicenseKey() }, ip)
  } finally {
    gone.mockRestore()
  }
  const reads = t.ctx.actors.loads.licenses - before
  expect(reads).toBeGreaterThan(1)
  let admittedAfter = 0
  while ((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: generateLicenseKey() }, ip)).status === 401) admittedAfter++
  expect(reads + admittedAfter).toBe(PER_IP)
})

test('absent keys never evict a cached license', async () => {
  const s = await t.seed()
  const real = await insertLicense(t.ctx, s.appId)
  const cache = new AppActors(t.ctx, { apps: 10, cacheBytes: 2 ** 20, absent: 10 })
  await cache.ensureLicense(s.appId, real)
  expect(cache.cachedLicense(s.appId, real)?.value?.key).toBe(real)
  const loads = cache.loads.licenses
  for (let i = 0; i < 50; i++) await cache.ensureLicense(s.appId, generateLicenseKey())
  expect(cache.loads.licenses - loads).toBe(50)
  expect(cache.cachedLicense(s.appId, real)?.value?.key).toBe(real)
  // The absent ones are bounded on their own.
  const absent = generateLicenseKey()
  await cache.ensureLicense(s.appId, absent)
  expect(cache.cachedLicense(s.appId, absent)).toMatchObject({ epoch: expect.any(Number), value: null })
})

test('made-up app ids from one IP cost PostgreSQL a bounded number of reads; real apps spend nothing of it', async () => {
  const s = await t.seed()
  heldAt = Date.now()
  const ip = '203.0.113.9'
  const before = ({ ...t.ctx.actors.loads })
  const codes: string[] = []
  for (let i = 0; i < 100; i++)
    codes.push((await validate({ appId: crypto.randomUUID(), appSecret: 'x', licenseKey: generateLicenseKey() }, ip)).body.error)
  expect(({ ...t.ctx.actors.loads }).apps - before.apps).toBe(60)
  // Past the budget an id is refused unread, as a limit the client retries: `invalid_app` would tell a
  // real app's client behind the same address that its credentials are wrong.
  expect(codes.indexOf('rate_limited')).toBe(60)
  expect(new Set(codes.slice(0, 60))).toEqual(new Set(['invalid_app']))
  expect(new Set(codes.slice(60))).toEqual(new Set(['rate_limited']))
  const real = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  expect(t.ctx.actors.cachedApp(s.appId)).toBeUndefined()
  const unread = await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: real }, ip)
  expect([unread.status, unread.body.error]).toEqual([429, 'rate_limited'])
  expect(Number(unread.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
  // Another IP's first look at a real app is not held up by it; once this process holds the app, the
  // first IP reaches it too.
  expect((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: real }, '203.0.113.10')).status).toBe(200)
  expect((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: real }, ip)).status).toBe(200)
})

test('made-up app ids sent at once from one IP cost no more reads than sent one after another', async () => {
  heldAt = Date.now()
  const before = t.ctx.actors.loads.apps
  const answers = await Promise.all(
    Array.from({ length: 200 }, () => validate({ appId: crypto.randomUUID(), appSecret: 'x', licenseKey: generateLicenseKey() }, '203.0.113.12')),
  )
  expect(t.ctx.actors.loads.apps - before).toBe(60)
  const codes = answers.map((res) => res.body.error)
  expect(codes.filter((code) => code === 'invalid_app')).toHaveLength(60)
  expect(codes.filter((code) => code === 'rate_limited')).toHaveLength(140)
})

test("a burst of first logins to an app the process does not hold yet, from one address, shares one lookup and spends none of its budget", async () => {
  // The per-address limit out of the way: the budget is what is tested.
  const roomy = await makeTestApp({ env: { VALIDATE_LIMIT_PER_IP: '1000', TRUSTED_PROXIES: '0.0.0.0' } })
  const s = await roomy.seed()
  const licenseKey = await insertLicense(roomy.ctx, s.appId, { unlimitedHwidSlots: true })
  const before = roomy.ctx.actors.loads.apps
  const answers = await Promise.all(
    Array.from({ length: 100 }, () =>
      roomy.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
        headers: { 'x-forwarded-for': '203.0.113.13' },
      }),
    ),
  )
  expect(new Set(answers.map((res) => res.status))).toEqual(new Set([200]))
  expect(roomy.ctx.actors.loads.apps - before).toBe(1)
})

test('apps that exist give their lookup token back, however many a caller looks up', async () => {
  const ip = '203.0.113.11'
  for (let i = 0; i < 70; i++) {
    const s = await t.seed()
    const real = await insertLicense(t.ctx, s.appId)
    expect((await validate({ appId: s.appId, appSecret: s.appSecret, licenseKey: real }, ip)).status).toBe(200)
  }
})
