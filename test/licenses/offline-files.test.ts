import { beforeAll, describe, expect, spyOn, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { ROWS_PER_READ } from '../../src/http/streamed-list'
import { and, eq } from 'drizzle-orm'
import { events, licenses, offlineFiles, signingKeys } from '../../src/db/schema'
import { makeTestApp, type TestApp } from '../support/helpers'
import { hwid, insertLicense, nonce } from '../support/client'
import { type Verdict, verifyLicenseFile } from '../support/license-verifier'
// AuthForge's cross-SDK conformance vectors, copied unchanged from AuthForgeCC/authforge-rust,
// offline_license_vectors.json at commit b7fd234993477f874c557a6ed1cae1d32bd6edc0.
import vectors from '../fixtures/offline_license_vectors.json'

const errorBody = (error: string) => ({ error, message: expect.any(String) })

// ---- The test verifier (test/support/license-verifier.ts) must pass AuthForge's vectors first.

describe('the test verifier against AuthForge offline_license_vectors.json', () => {
  test.each(vectors.cases.map((c) => [c.name, c] as const))('%s', (_, c) => {
    const verdict = verifyLicenseFile(c.file, {
      appId: c.appId,
      publicKeys: c.publicKey.split(','),
      hwid: c.hwid,
      nowMs: Date.parse(c.now),
    })
    expect(verdict.code).toBe(c.expect as Verdict['code'])
    if ('payload' in c && c.payload && verdict.code === 'ok') expect(verdict.payload).toEqual(c.payload)
  })
})

// ---- The routes.

let t: TestApp
/** A second instance: its own actors and caches, the same database and store. */
let other: TestApp
let now = Date.now()
/** Moves the shared clock on, so each mint has its own issuedAt. */
const tick = () => (now += 1000)

beforeAll(async () => {
  t = await makeTestApp({ clock: () => now })
  other = await makeTestApp({ clock: () => now })
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

const DAY = 86_400_000
const iso = (ms: number) => new Date(ms).toISOString()
const path = (licenseKey: string) => `/v1/licenses/${licenseKey}/offline-files`

function mint(s: Seeded, licenseKey: string, body: Record<string, unknown> = {}, on: TestApp = t) {
  tick()
  return on.req('POST', path(licenseKey), { apiKey: s.apiKey, body })
}

async function minted(s: Seeded, licenseKey: string, body: Record<string, unknown> = {}) {
  const res = await mint(s, licenseKey, body)
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body
}

const check = (s: Seeded, file: string, machine: string, opts: { appId?: string; nowMs?: number } = {}) =>
  verifyLicenseFile(file, { appId: opts.appId ?? s.appId, publicKeys: [s.publicKey], hwid: machine, nowMs: opts.nowMs ?? now })

const row = async (licenseKey: string) => (await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey)))[0]!
const fileRows = (licenseKey: string) => t.ctx.database.db.select().from(offlineFiles).where(eq(offlineFiles.licenseKey, licenseKey))
const balance = (s: Seeded) => t.ctx.credits.currentBalance(s.accountId)

describe('POST /v1/licenses/:licenseKey/offline-files: the file', () => {
  test('a file carries the app variables as they stand at its commit, not as read before its transaction', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const variables = (body: Record<string, string>) => t.req('PUT', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey, body })
    expect((await variables({ theme: 'dark' })).status).toBe(200)
    const charge = t.ctx.credits.charge.bind(t.ctx.credits)
    let changed = 0
    // A change of the app's variables commits after the mint read the app, before its transaction.
    const between = spyOn(t.ctx.credits, 'charge').mockImplementation(async (...args) => {
      expect((await variables({ theme: 'light' })).status).toBe(200)
      changed++
      return charge(...args)
    })
    let body: Awaited<ReturnType<typeof minted>>
    try {
      body = await minted(s, licenseKey, { hwids: ['machine-a'] })
    } finally {
      between.mockRestore()
    }
    expect(changed).toBe(1)
    const verdict = check(s, body.file, 'machine-a')
    expect(verdict.code === 'ok' && verdict.payload.appVariables).toEqual({ theme: 'light' })
  })

  test('a bound file verifies with the app key on its machine only, and carries the contract fields in order', async () => {
    const s = await t.seed()
    const expiresAt = iso(now + 30 * DAY)
    const licenseKey = await insertLicense(t.ctx, s.appId, {
      maxHwidSlots: 2,
      expiresAt: new Date(expiresAt),
      label: 'Studio seat',
      variables: { tier: 'pro' },
    })
    const put = await t.req('PUT', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey, body: { theme: 'dark' } })
    expect(put.status, JSON.stringify(put.body)).toBe(200)
    const body = await minted(s, licenseKey, { hwids: ['machine-a'] })
    expect(body).toEqual({
      fileId: expect.stringMatching(/^[0-9a-f-]{36}$/),
      licenseKey,
      appId: s.appId,
      keyId: s.keyId,
      issuedAt: iso(now),
      expiresAt,
      hwid: { mode: 'bound', hwids: ['machine-a'] },
      file: expect.any(String),
    })
    const verdict = check(s, body.file, 'machine-a')
    expect(verdict.code).toBe('ok')
    if (verdict.code !== 'ok') return
    expect(Object.keys(verdict.payload)).toEqual([
      'v', 'typ', 'appId', 'licenseKey', 'jti', 'kid', 'issuedAt', 'expiresAt', 'hwid', 'label',
      'licenseExpiresAt', 'licenseVariables', 'appVariables',
    ])
    expect(verdict.payload).toEqual({
      v: 1,
      typ: 'authforge-license',
      appId: s.appId,
      licenseKey,
      jti: body.fileId,
      kid: s.keyId,
      issuedAt: body.issuedAt,
      expiresAt,
      hwid: { mode: 'bound', hwids: ['machine-a'] },
      label: 'Studio seat',
      licenseExpiresAt: expiresAt,
      licenseVariables: { tier: 'pro' },
      appVariables: { theme: 'dark' },
    })
    expect(verdict.headers).toEqual({ Version: '1', 'App-Id': s.appId, License: licenseKey, 'Key-Id': s.keyId, 'Expires-At': expiresAt })
    // Written exactly as the contract shows: 64-column base64 lines, a final newline.
    const lines = (body.file as string).split('\n')
    expect(lines[0]).toBe('-----BEGIN AUTHFORGE LICENSE-----')
    expect(lines[6]).toBe('')
    const endAt = lines.indexOf('-----END AUTHFORGE LICENSE-----')
    for (const block of [lines.slice(7, endAt), lines.slice(endAt + 2, -2)]) {
      expect(block.slice(0, -1).every((line) => line.length === 64)).toBe(true)
      expect(block.at(-1)!.length).toBeLessThanOrEqual(64)
    }
    expect(lines.slice(-2)).toEqual(['-----END AUTHFORGE SIGNATURE-----', ''])
    // What verifiers tolerate: CRLF, re-wrapping and text around the armor.
    const mangled = `Your license:\r\n${(body.file as string).replace(/([A-Za-z0-9+/=]{64})\n/g, (line) => `${line.slice(0, 20)}\r\n${line.slice(20)}`).replace(/\n/g, '\r\n')}\r\n-- thanks`
    expect(check(s, mangled, 'machine-a').code).toBe('ok')
    expect(check(s, body.file, 'machine-b').code).toBe('hwid_mismatch')
    expect(check(s, body.file, '').code).toBe('hwid_mismatch')
    expect(check(s, body.file, 'machine-a', { appId: crypto.randomUUID() }).code).toBe('wrong_app')
    expect(check(s, body.file, 'machine-a', { nowMs: Date.parse(expiresAt) }).code).toBe('expired')
    expect(verifyLicenseFile(body.file, { appId: s.appId, publicKeys: [vectors.keys.wrongPublicKey], hwid: 'machine-a', nowMs: now }).code).toBe('bad_signature')
    expect((await row(licenseKey)).hwids).toEqual(['machine-a'])
  })

  test('signed by the active key after a rotation', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const rotated = await t.req('POST', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    expect(rotated.status, JSON.stringify(rotated.body)).toBe(201)
    const body = await minted(s, licenseKey)
    expect(body.keyId).toBe(rotated.body.keyId)
    expect(check(s, body.file, 'm1').code).toBe('bad_signature')
    expect(verifyLicenseFile(body.file, { appId: s.appId, publicKeys: [rotated.body.publicKey], hwid: 'm1', nowMs: now }).code).toBe('ok')
  })

  test('with Accept: application/x-authforge-license the body is the file, as an attachment', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    tick()
    const res = await t.req('POST', path(licenseKey), {
      apiKey: s.apiKey,
      body: {},
      headers: { accept: 'application/x-authforge-license' },
    })
    expect(res.status).toBe(201)
    expect(res.headers.get('content-type')).toStartWith('application/x-authforge-license')
    expect(res.headers.get('content-disposition')).toBe(`attachment; filename="${licenseKey}.authforge"`)
    expect(res.headers.get('ratelimit-limit')).not.toBeNull()
    expect(typeof res.body).toBe('string')
    expect(check(s, res.body, 'm1').code).toBe('ok')
    expect(await fileRows(licenseKey)).toHaveLength(1)
  })

  test.each([
    ['application/x-authforge-license;q=0, application/json', 'json'],
    ['application/x-authforge-license; q=0', 'json'],
    ['application/json, application/x-authforge-license;q=0.1', 'json'],
    ['application/x-authforge-license;q=0.1, */*;q=0.5', 'json'],
    ['*/*', 'json'],
    ['application/*', 'json'],
    ['text/html', 'json'],
    ['application/json;q=0.5, application/x-authforge-license', 'file'],
    ['application/x-authforge-license, */*', 'file'],
    ['Application/X-AuthForge-License', 'file'],
  ])('Accept: %s answers with the %s', async (accept, answer) => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    tick()
    const res = await t.req('POST', path(licenseKey), { apiKey: s.apiKey, body: {}, headers: { accept } })
    expect(res.status).toBe(201)
    const type = answer === 'file' ? 'application/x-authforge-license' : 'application/json'
    expect(res.headers.get('content-type')).toStartWith(type)
    expect(check(s, answer === 'file' ? res.body : res.body.file, 'm1').code).toBe('ok')
  })
})

describe('seats', () => {
  test('more new HWIDs than free seats: 409 seats_full, nothing bound, nothing charged or minted', async () => {
    const s = await t.seed({ credits: 10 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2, hwids: ['m1'] })
    const res = await mint(s, licenseKey, { hwids: ['m2', 'm3'] })
    expect(res.status).toBe(409)
    expect(res.body).toEqual(errorBody('seats_full'))
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(10)
  })

  test('bound HWIDs are reused; new ones take the free seats; omitted means the bound ones', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2, hwids: ['m1'] })
    expect((await minted(s, licenseKey, { hwids: ['m1'] })).hwid).toEqual({ mode: 'bound', hwids: ['m1'] })
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect((await minted(s, licenseKey, { hwids: ['m1', 'm2', 'm2'] })).hwid).toEqual({ mode: 'bound', hwids: ['m1', 'm2'] })
    expect((await row(licenseKey)).hwids).toEqual(['m1', 'm2'])
    const all = await minted(s, licenseKey)
    expect(all.hwid).toEqual({ mode: 'bound', hwids: ['m1', 'm2'] })
    expect(check(s, all.file, 'm2').code).toBe('ok')
    const bound = await t.ctx.database.db
      .select()
      .from(events)
      .where(and(eq(events.appId, s.appId), eq(events.event, 'license.hwid_bound')))
    expect(bound.map((e) => e.data)).toEqual([{ licenseKey, appId: s.appId, hwid: 'm2' }])
  })

  test('no HWID given and none bound: 400', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const res = await mint(s, licenseKey)
    expect(res.status).toBe(400)
    expect(res.body.message).toContain('hwids')
  })

  test.each([
    ['an HWID over 128 characters', { hwids: ['x'.repeat(129)] }, '128'],
    ['an empty HWID', { hwids: [''] }, 'hwids'],
    ['17 HWIDs', { hwids: Array.from({ length: 17 }, (_, i) => `m${i}`) }, 'hwids'],
    ['an empty list', { hwids: [] }, 'hwids'],
    ['an unknown field', { hwid: 'm1' }, 'hwid'],
  ])('%s: 400 saying so', async (_, body, words) => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 16 })
    const res = await mint(s, licenseKey, body)
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
    expect(res.body.message).toContain(words)
    expect((await row(licenseKey)).hwids).toEqual([])
  })

  test('anyMachine: only for unlimited-seat licenses, never with hwids; the file verifies anywhere', async () => {
    const s = await t.seed()
    const limited = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 16, hwids: ['m1'] })
    const refused = await mint(s, limited, { anyMachine: true })
    expect(refused.status).toBe(400)
    expect(refused.body.message).toContain('unlimited')
    const unlimited = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await mint(s, unlimited, { anyMachine: true, hwids: ['m1'] })).status).toBe(400)
    const any = await minted(s, unlimited, { anyMachine: true })
    expect(any.hwid).toEqual({ mode: 'any' })
    expect(check(s, any.file, '').code).toBe('ok')
    expect(check(s, any.file, 'whatever').code).toBe('ok')
    // An unlimited-seat license binds nothing, as on validate.
    const bound = await minted(s, unlimited, { hwids: ['m7', 'm8'] })
    expect(bound.hwid).toEqual({ mode: 'bound', hwids: ['m7', 'm8'] })
    expect((await row(unlimited)).hwids).toEqual([])
  })
})

describe('expiry and license state', () => {
  test("omitted: the license's expiry (Expires-At: never for a lifetime license); earlier is kept; later, null or past: 400", async () => {
    const s = await t.seed()
    const lifetime = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const forever = await minted(s, lifetime)
    expect(forever.expiresAt).toBeNull()
    expect(forever.file).toContain('\nExpires-At: never\n')
    expect(check(s, forever.file, 'm1', { nowMs: Date.parse('9999-01-01T00:00:00Z') }).code).toBe('ok')
    const short = iso(now + DAY)
    expect((await minted(s, lifetime, { expiresAt: short })).expiresAt).toBe(short)

    const until = iso(now + 10 * DAY)
    const expiring = await insertLicense(t.ctx, s.appId, { hwids: ['m1'], expiresAt: new Date(until) })
    expect((await minted(s, expiring)).expiresAt).toBe(until)
    const earlier = await minted(s, expiring, { expiresAt: iso(now + DAY) })
    expect(check(s, earlier.file, 'm1', { nowMs: now + 2 * DAY }).code).toBe('expired')
    for (const expiresAt of [iso(now + 11 * DAY), null, iso(now - DAY), 'next week']) {
      const res = await mint(s, expiring, { expiresAt })
      expect(res.status, JSON.stringify({ expiresAt, body: res.body })).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
    }
    expect(await fileRows(expiring)).toHaveLength(2)
  })

  test('a revoked or expired license: 409 license_inactive', async () => {
    const s = await t.seed({ credits: 5 })
    const revoked = await insertLicense(t.ctx, s.appId, { hwids: ['m1'], status: 'revoked' })
    const expired = await insertLicense(t.ctx, s.appId, { hwids: ['m1'], expiresAt: new Date(now - 1000) })
    for (const licenseKey of [revoked, expired]) {
      const res = await mint(s, licenseKey)
      expect(res.status).toBe(409)
      expect(res.body).toEqual(errorBody('license_inactive'))
      expect(await fileRows(licenseKey)).toHaveLength(0)
    }
    expect(await balance(s)).toBe(5)
  })
})

describe("the app's side, as a validate would see it", () => {
  const security = (s: Seeded, body: Record<string, string[]>) =>
    t.req('PUT', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey, body })

  test('a disabled app: 409 app_disabled, nothing bound, charged or minted; enabled again, it mints', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3, hwids: ['m1'] })
    expect((await t.req('PATCH', `/v1/apps/${s.appId}`, { apiKey: s.apiKey, body: { disabled: true } })).status).toBe(200)
    // The other instance too: the app state is read where the file is minted, not from one process's cache.
    for (const on of [t, other]) {
      const res = await mint(s, licenseKey, { hwids: ['m2'] }, on)
      expect(res.status).toBe(409)
      expect(res.body).toEqual(errorBody('app_disabled'))
    }
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
    await t.req('PATCH', `/v1/apps/${s.appId}`, { apiKey: s.apiKey, body: { disabled: false } })
    await minted(s, licenseKey, { hwids: ['m2'] })
  })

  test("an HWID the app's blacklist names, or its whitelist leaves out: 409 hwid_blocked, nothing changed", async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 4, hwids: ['m1'] })
    expect((await security(s, { hwidBlacklist: ['evil'] })).status).toBe(200)
    for (const hwids of [['evil'], ['m2', 'evil']]) {
      const res = await mint(s, licenseKey, { hwids }, other)
      expect(res.status).toBe(409)
      expect(res.body).toEqual(errorBody('hwid_blocked'))
    }
    // An HWID bound before it was blacklisted: a validate would refuse it, so is a file.
    await security(s, { hwidBlacklist: ['m1'] })
    expect((await mint(s, licenseKey)).body).toEqual(errorBody('hwid_blocked'))
    await security(s, { hwidBlacklist: [], hwidWhitelist: ['m1', 'm2'] })
    expect((await mint(s, licenseKey, { hwids: ['m3'] })).body).toEqual(errorBody('hwid_blocked'))
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
    await minted(s, licenseKey, { hwids: ['m1', 'm2'] })
  })

  test('a file for any machine: refused while the app has an HWID whitelist, which admits only its own machines', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await security(s, { hwidWhitelist: ['m1'] })).status).toBe(200)
    const refused = await mint(s, licenseKey, { anyMachine: true })
    expect([refused.status, refused.body]).toEqual([409, errorBody('hwid_blocked')])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
    // A blacklist does not refuse it: nothing offline could check it, as the README says.
    expect((await security(s, { hwidWhitelist: [], hwidBlacklist: ['evil'] })).status).toBe(200)
    expect((await minted(s, licenseKey, { anyMachine: true })).hwid).toEqual({ mode: 'any' })
  })

  test('hwids outside 1 to 16 items: 400 saying so', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    for (const hwids of [[], Array.from({ length: 17 }, (_, i) => `m${i}`)]) {
      const res = await mint(s, licenseKey, { hwids })
      expect(res.status).toBe(400)
      expect(res.body.message).toBe('hwids must be an array from 1 to 16 items')
    }
  })

  test('an HWID that begins or ends with white space, or is nothing else: 400 naming it, nothing bound or minted', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    // \x85 and \x1c-\x1f: Python's strip takes them off too, and Go's TrimSpace \x85.
    for (const hwids of [['m1', 'm2 '], ['   '], ['\tm1'], ['m1\u00a0'], ['m1\u0085'], ['\u001fm1'], ['m1', 'm2\u001c']]) {
      const res = await mint(s, licenseKey, { hwids })
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body.message).toStartWith(`hwids.${hwids.length - 1} begins or ends with white space`)
    }
    expect((await row(licenseKey)).hwids).toEqual([])
    expect(await fileRows(licenseKey)).toHaveLength(0)
  })

  test('a license whose bound HWID begins or ends with white space (validate binds it as sent): 400 for a file of the bound HWIDs, nothing charged or minted', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3, hwids: ['m1', ' padded '] })
    const res = await mint(s, licenseKey, {})
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body.message).toStartWith("The license's bound HWID 2 (give hwids) begins or ends with white space")
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
    expect((await mint(s, licenseKey, { hwids: ['m1'] })).status).toBe(201)
  })
})

describe('credits', () => {
  test('1 credit a file on a billed app; 402 no_credits at 0 and nothing minted or bound', async () => {
    const s = await t.seed({ credits: 2 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3, hwids: ['m1'] })
    await minted(s, licenseKey)
    expect(await balance(s)).toBe(1)
    await minted(s, licenseKey, { hwids: ['m2'] })
    expect(await balance(s)).toBe(0)
    const res = await mint(s, licenseKey, { hwids: ['m3'] })
    expect(res.status).toBe(402)
    expect(res.body).toEqual(errorBody('no_credits'))
    expect((await row(licenseKey)).hwids).toEqual(['m1', 'm2'])
    expect(await fileRows(licenseKey)).toHaveLength(2)
  })

  test('sandbox apps mint for free', async () => {
    const s = await t.seed({ credits: 0, sandbox: true })
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    await minted(s, licenseKey)
    await minted(s, licenseKey)
    expect(await balance(s)).toBe(0)
  })

  test('a mint that fails after the charge gives the credit back', async () => {
    const s = await t.seed({ credits: 3 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    // No active signing key: the transaction fails once the credit is taken.
    await t.ctx.database.db.update(signingKeys).set({ active: false }).where(eq(signingKeys.appId, s.appId))
    const res = await mint(s, licenseKey)
    expect(res.status).toBe(500)
    expect(await balance(s)).toBe(3)
    expect(await fileRows(licenseKey)).toHaveLength(0)
  })
})

describe('the license.offline_issued event', () => {
  test('recorded with the file, and subscribable', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const hook = await t.req('POST', `/v1/apps/${s.appId}/webhooks`, {
      apiKey: s.apiKey,
      body: { url: 'https://example.com/hooks', events: ['license.offline_issued'] },
    })
    expect(hook.status, JSON.stringify(hook.body)).toBe(201)
    const body = await minted(s, licenseKey, { expiresAt: iso(now + DAY) })
    const rows = await t.ctx.database.db
      .select()
      .from(events)
      .where(and(eq(events.appId, s.appId), eq(events.event, 'license.offline_issued')))
    expect(rows.map((e) => e.data)).toEqual([
      { licenseKey, appId: s.appId, fileId: body.fileId, hwid: { mode: 'bound', hwids: ['m1'] }, expiresAt: body.expiresAt },
    ])
  })
})

describe('GET /v1/licenses/:licenseKey/offline-files', () => {
  test('newest first, without the text', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true, hwids: [] })
    const made = [
      await minted(s, licenseKey, { anyMachine: true }),
      await minted(s, licenseKey, { hwids: ['m1'] }),
      await minted(s, licenseKey, { anyMachine: true, expiresAt: iso(now + DAY) }),
    ]
    const res = await t.req('GET', path(licenseKey), { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    expect(res.body).toEqual({
      files: made.reverse().map(({ fileId, keyId, issuedAt, expiresAt, hwid }) => ({ fileId, keyId, issuedAt, expiresAt, hwid })),
    })
  })

  test('a license with none: an empty list', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    expect((await t.req('GET', path(licenseKey), { apiKey: s.apiKey })).body).toEqual({ files: [] })
  })

  test('more files than one read takes: every one, once, newest first, ties in time by id', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true, hwids: [] })
    const [active] = await t.ctx.database.db.select({ keyId: signingKeys.id }).from(signingKeys).where(eq(signingKeys.appId, s.appId))
    const keyId = active!.keyId
    // Two reads and a half; many files share a millisecond, across the reads' bounds too.
    const count = ROWS_PER_READ * 2 + ROWS_PER_READ / 2
    const rows = Array.from({ length: count }, (_, i) => ({
      id: randomUUID(),
      licenseKey,
      appId: s.appId,
      keyId,
      issuedAt: new Date(Date.UTC(2030, 0, 1) + Math.floor(i / 7)),
      expiresAt: null,
      hwid: { mode: 'any' as const },
    }))
    for (let i = 0; i < rows.length; i += 500) await t.ctx.database.db.insert(offlineFiles).values(rows.slice(i, i + 500))
    const res = await t.req('GET', path(licenseKey), { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    const newestFirst = rows.toSorted((a, b) => b.issuedAt.getTime() - a.issuedAt.getTime() || (a.id < b.id ? 1 : -1))
    expect(res.body.files.map((f: { fileId: string }) => f.fileId)).toEqual(newestFirst.map((r) => r.id))
    expect(res.body.files[0]).toEqual({ fileId: newestFirst[0]!.id, keyId, issuedAt: newestFirst[0]!.issuedAt.toISOString(), expiresAt: null, hwid: { mode: 'any' } })
    expect(res.headers.get('content-type')).toStartWith('application/json')
    expect(res.headers.get('x-request-id')).toEqual(expect.any(String))
    expect(res.headers.get('ratelimit-limit')).toEqual(expect.any(String))

    // Read and sent a read at a time, the next one after the last went: never all of them at once.
    const streamed = await t.app.handle(new Request(`http://localhost${path(licenseKey)}`, { headers: { authorization: `Bearer ${s.apiKey}` } }))
    let pieces = 0
    for await (const _ of streamed.body!) pieces++
    expect(pieces).toBe(3)
  })
})

describe('ownership', () => {
  test.each(['POST', 'GET'])('%s: 404 absent key, 403 another account, 401 without a key', async (method) => {
    const s = await t.seed()
    const stranger = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const body = method === 'POST' ? {} : undefined
    const absent = await t.req(method, path('ZZZZ-ZZZZ-ZZZZ-ZZZZ'), { apiKey: s.apiKey, body })
    expect(absent.status).toBe(404)
    expect(absent.body).toEqual(errorBody('not_found'))
    const foreign = await t.req(method, path(licenseKey), { apiKey: stranger.apiKey, body })
    expect(foreign.status).toBe(403)
    expect(foreign.body).toEqual(errorBody('forbidden'))
    const anonymous = await t.req(method, path(licenseKey), { body })
    expect(anonymous.status).toBe(401)
    expect(anonymous.body).toEqual(errorBody('invalid_api_key'))
    expect(await fileRows(licenseKey)).toHaveLength(0)
  })
})

describe('two instances', () => {
  test('mints and validates racing for a 3-seat license bind exactly 3 HWIDs', async () => {
    const s = await t.seed()
    const seats = 3
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: seats })
    const machines = Array.from({ length: 24 }, () => hwid())
    const results = await Promise.all(
      machines.map(async (machine, i) => {
        const on = i % 2 === 0 ? t : other
        if (i % 4 < 2) {
          const res = await on.req('POST', path(licenseKey), { apiKey: s.apiKey, body: { hwids: [machine] } })
          return { machine, ok: res.status === 201, status: res.status, error: res.body.error }
        }
        const res = await on.req('POST', '/auth/validate', {
          body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: machine, nonce: nonce() },
        })
        return { machine, ok: res.status === 200, status: res.status, error: res.body.error }
      }),
    )
    const won = results.filter((r) => r.ok).map((r) => r.machine)
    expect(won).toHaveLength(seats)
    expect(results.filter((r) => !r.ok).every((r) => r.error === 'seats_full' || r.error === 'hwid_mismatch')).toBe(true)
    expect([...(await row(licenseKey)).hwids].sort()).toEqual([...won].sort())
    const files = await fileRows(licenseKey)
    expect(files.every((f) => f.hwid.mode === 'bound' && won.includes(f.hwid.hwids[0]!))).toBe(true)
  })
})
