import { describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { rotateSigningKey } from '../../src/apps/service'
import { generateKeyPairSync } from 'node:crypto'
import { licenses, signingKeys } from '../../src/db/schema'
import { Sealer } from '../../src/lib/crypto'
import type { AuthorizeInput } from '../../src/store/store'
import { makeTestApp, TEST_MASTER_KEY } from '../support/helpers'
import { withOverrides } from '../support/overrides'
import { decode, hwid, insertLicense, nonce, tokenExp, updateLicense, verifySigned } from '../support/client'

describe('POST /auth/validate', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const body = (licenseKey: string, h: string, extra: Record<string, unknown> = {}) => ({
    appId: s.appId,
    appSecret: s.appSecret,
    licenseKey,
    hwid: h,
    nonce: nonce(),
    ...extra,
  })

  test('signs the payload string with the app key and echoes the nonce', async () => {
    const key = await insertLicense(t.ctx, s.appId, { label: 'pro', variables: { tier: 'gold' } })
    const h = hwid()
    const sent = body(key, h)
    const res = await t.req('POST', '/auth/validate', { body: sent })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body.status).toBe('success')
    expect(res.body.keyId).toBe(s.keyId)
    expect(res.body.signature).toHaveLength(88)
    expect(verifySigned(res.body, s.publicKey)).toBe(true)
    const p = decode(res.body.payload)
    expect(p.nonce).toBe(sent.nonce)
    expect(p).toMatchObject({ appId: s.appId, licenseKey: key, hwid: h, hwidCount: 1, maxHwidSlots: 1, licenseLabel: 'pro' })
    expect(p.licenseVariables).toEqual({ tier: 'gold' })
    expect(p.appVariables).toEqual({})
    const now = Math.floor(Date.now() / 1000)
    expect(p.expiresIn).toBeGreaterThanOrEqual(now + 86_400 - 5)
    expect(tokenExp(p.sessionToken)).toBe(p.expiresIn)
    expect(new Date(p.sessionExpiresAt).getTime()).toBe(p.expiresIn * 1000)
  })

  test("the payload carries the app's variables as last set, written as JSON.stringify writes them", async () => {
    const other = await t.seed()
    const key = await insertLicense(t.ctx, other.appId)
    const h = hwid()
    const send = () => t.req('POST', '/auth/validate', { body: { ...body(key, h), appId: other.appId, appSecret: other.appSecret } })
    for (const variables of [{}, { 'q"': 'ü\n', n: 2 }, { n: 3 }]) {
      const put = await t.req('PUT', `/v1/apps/${other.appId}/variables`, { apiKey: other.apiKey, body: variables })
      expect(put.status, JSON.stringify(put.body)).toBe(200)
      // Twice: the second answer comes from the cached app entry.
      for (let i = 0; i < 2; i++) {
        const res = await send()
        expect(res.status, JSON.stringify(res.body)).toBe(200)
        const text = Buffer.from(res.body.payload, 'base64').toString('utf8')
        expect(JSON.parse(text).appVariables).toEqual(variables)
        expect(JSON.stringify(JSON.parse(text))).toBe(text)
      }
    }
  })

  test('the payload is plain JSON in the fixed field order, escaping what the client sent', async () => {
    const expiresAt = new Date('2031-02-03T04:05:06.789Z')
    const key = await insertLicense(t.ctx, s.appId, { label: 'Q"\\é', variables: { 'a"b': 'ü\n', n: 1 }, expiresAt })
    const h = `hw"\\\u00e9\u{1F600}${hwid()}`
    const sent = body(key, h, { nonce: `n"\\\u2028${nonce()}` })
    let token = ''
    for (const beat of [false, true]) {
      const res = beat
        ? await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
        : await t.req('POST', '/auth/validate', { body: sent })
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      const text = Buffer.from(res.body.payload, 'base64').toString('utf8')
      const p = JSON.parse(text)
      expect(JSON.stringify(p)).toBe(text)
      expect(Object.keys(p)).toEqual([
        'sessionToken', 'expiresIn', 'sessionExpiresAt', 'timestamp', ...(beat ? [] : ['nonce']), 'appId', 'licenseKey',
        'hwid', 'licenseExpiresAt', 'unlimitedHwidSlots', 'maxHwidSlots', 'hwidCount', 'licenseLabel', 'appVariables',
        'licenseVariables',
      ])
      expect(p).toMatchObject({ hwid: h, licenseExpiresAt: expiresAt.toISOString(), licenseLabel: 'Q"\\é' })
      if (!beat) expect(p.nonce).toBe(sent.nonce)
      expect(p.licenseVariables).toEqual({ 'a"b': 'ü\n', n: 1 })
      token = p.sessionToken
    }
  })

  test('a tampered payload fails verification', async () => {
    const key = await insertLicense(t.ctx, s.appId)
    const res = await t.req('POST', '/auth/validate', { body: body(key, hwid()) })
    const p = decode(res.body.payload)
    p.licenseKey = 'AAAA-AAAA-AAAA-AAAA'
    const forged = Buffer.from(JSON.stringify(p)).toString('base64')
    expect(verifySigned({ payload: forged, signature: res.body.signature }, s.publicKey)).toBe(false)
  })

  test('a nonce is accepted once', async () => {
    const key = await insertLicense(t.ctx, s.appId)
    const sent = body(key, hwid())
    expect((await t.req('POST', '/auth/validate', { body: sent })).status).toBe(200)
    const again = await t.req('POST', '/auth/validate', { body: sent })
    expect(again.status).toBe(401)
    expect(again.body).toEqual({ status: 'failed', error: 'replay_detected' })
  })

  test('a validate refused after app authentication consumes its nonce all the same (the contract)', async () => {
    const key = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1, hwids: ['taken'] })
    const sent = body(key, hwid())
    expect((await t.req('POST', '/auth/validate', { body: sent })).body.error).toBe('hwid_mismatch')
    await updateLicense(t.ctx, key, { hwids: [] })
    expect((await t.req('POST', '/auth/validate', { body: sent })).body.error).toBe('replay_detected')
    // A wrong secret is no app authentication: its nonce stays free.
    const wrong = { ...body(key, hwid()), appSecret: 'not-the-secret' }
    expect((await t.req('POST', '/auth/validate', { body: wrong })).body.error).toBe('invalid_app')
    expect((await t.req('POST', '/auth/validate', { body: { ...wrong, appSecret: s.appSecret } })).status).toBe(200)
  })

  test('ttlSeconds is clamped to [3600, 604800]', async () => {
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const now = Math.floor(Date.now() / 1000)
    const short = decode((await t.req('POST', '/auth/validate', { body: body(key, hwid(), { ttlSeconds: 5 }) })).body.payload)
    expect(short.expiresIn - now).toBeWithin(3599, 3602)
    const long = decode((await t.req('POST', '/auth/validate', { body: body(key, hwid(), { ttlSeconds: 10 ** 9 }) })).body.payload)
    expect(long.expiresIn - now).toBeWithin(604_799, 604_802)
  })

  test.each([
    ['unknown app', { appId: '00000000-0000-4000-8000-000000000000' }, 401, 'invalid_app'],
    ['non-uuid app', { appId: 'nope' }, 401, 'invalid_app'],
    ['wrong secret', { appSecret: 'x'.repeat(43) }, 401, 'invalid_app'],
    ['unknown license', { licenseKey: 'ZZZZ-ZZZZ-ZZZZ-ZZZZ' }, 401, 'invalid_key'],
    ['short nonce', { nonce: 'abc' }, 400, 'bad_request'],
    ['long hwid', { hwid: 'h'.repeat(129) }, 400, 'bad_request'],
    ['missing nonce', { nonce: undefined }, 400, 'bad_request'],
    ['ttlSeconds as text', { ttlSeconds: '3600' }, 400, 'bad_request'],
    ['fractional ttlSeconds', { ttlSeconds: 3600.5 }, 400, 'bad_request'],
  ])('%s', async (_name, override, status, error) => {
    const key = await insertLicense(t.ctx, s.appId)
    const res = await t.req('POST', '/auth/validate', { body: { ...body(key, hwid()), ...override } })
    expect(res.status, JSON.stringify(res.body)).toBe(status)
    expect(res.body).toEqual({ status: 'failed', error })
  })

  test('revoked and expired licenses get 410', async () => {
    const revoked = await insertLicense(t.ctx, s.appId, { status: 'revoked' })
    expect((await t.req('POST', '/auth/validate', { body: body(revoked, hwid()) })).body.error).toBe('revoked')
    const expired = await insertLicense(t.ctx, s.appId, { expiresAt: new Date(Date.now() - 1000) })
    const res = await t.req('POST', '/auth/validate', { body: body(expired, hwid()) })
    expect(res.status).toBe(410)
    expect(res.body.error).toBe('expired')
  })

  test('a license of another app is invalid_key', async () => {
    const other = await t.seed()
    const key = await insertLicense(t.ctx, other.appId)
    expect((await t.req('POST', '/auth/validate', { body: body(key, hwid()) })).body.error).toBe('invalid_key')
  })

  test('seats: bound HWIDs pass, a full license refuses new ones, unlimited never does', async () => {
    const key = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const [a, b, c] = [hwid(), hwid(), hwid()]
    expect((await t.req('POST', '/auth/validate', { body: body(key, a) })).status).toBe(200)
    expect((await t.req('POST', '/auth/validate', { body: body(key, b) })).status).toBe(200)
    const third = await t.req('POST', '/auth/validate', { body: body(key, c) })
    expect(third.status).toBe(403)
    expect(third.body.error).toBe('hwid_mismatch')
    expect((await t.req('POST', '/auth/validate', { body: body(key, a) })).status).toBe(200)
    const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, key))
    expect(row?.hwids).toEqual([a, b])

    const shared = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true, maxHwidSlots: 1 })
    for (let i = 0; i < 5; i++) expect((await t.req('POST', '/auth/validate', { body: body(shared, hwid()) })).status).toBe(200)
  })

  test('concurrent validates with different HWIDs bind exactly the seat count', async () => {
    const key = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    const results = await Promise.all(
      Array.from({ length: 20 }, () => t.req('POST', '/auth/validate', { body: body(key, hwid()) })),
    )
    expect(results.filter((r) => r.status === 200)).toHaveLength(3)
    expect(results.filter((r) => r.body.error === 'hwid_mismatch')).toHaveLength(17)
    const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, key))
    expect(row?.hwids).toHaveLength(3)
  })

  test('after a key rotation the next response is signed by the new active key', async () => {
    const app = await t.seed()
    const key = await insertLicense(t.ctx, app.appId, { unlimitedHwidSlots: true })
    const login = () =>
      t.req('POST', '/auth/validate', {
        body: { appId: app.appId, appSecret: app.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() },
      })
    expect((await login()).body.keyId).toBe(app.keyId)
    const rotated = await rotateSigningKey(t.ctx, app.appId)
    const res = await login()
    expect(res.body.keyId).toBe(rotated.keyId)
    expect(verifySigned(res.body, rotated.publicKey)).toBe(true)
    expect(verifySigned(res.body, app.publicKey)).toBe(false)
  })

  test('a change published through the store takes effect on the next request', async () => {
    const key = await insertLicense(t.ctx, s.appId)
    const h = hwid()
    expect((await t.req('POST', '/auth/validate', { body: body(key, h) })).status).toBe(200)
    await updateLicense(t.ctx, key, { status: 'revoked' })
    expect((await t.req('POST', '/auth/validate', { body: body(key, h) })).body.error).toBe('revoked')
  })
})

test('hot path: a validate of a bound HWID and every heartbeat read no PostgreSQL', async () => {
  const t = await makeTestApp()
  const s = await t.seed({ credits: 100 })
  const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
  const h = hwid()
  const login = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const first = await login()
  expect(first.status).toBe(200)
  const before = ({ ...t.ctx.actors.loads })
  let token = decode(first.body.payload).sessionToken
  for (let i = 0; i < 15; i++) {
    expect((await login()).status).toBe(200)
    const beat = await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
    expect(beat.status).toBe(200)
    token = decode(beat.body.payload).sessionToken
  }
  expect(({ ...t.ctx.actors.loads })).toEqual(before)
})

test("an app written to faster than its entries reload: the request reads its rows for itself after a few stale answers, and is answered by them", async () => {
  const base = await makeTestApp()
  // Every epoch has moved on by the time the script compares it, as under an owner's write a few ms apart.
  const store = withOverrides(base.ctx.store, {
    authorize: (input: AuthorizeInput) =>
      input.epochs.length > 0
        ? Promise.resolve({ kind: 'stale' as const, epochs: input.epochs.map((e) => e.expected + 1) })
        : base.ctx.store.authorize(input),
  })
  const t = await makeTestApp({ store })
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() } })
  const ok = await validate()
  expect(ok.status, JSON.stringify(ok.body)).toBe(200)
  expect(decode(ok.body.payload).licenseKey).toBe(key)
  // The store's checks still apply: a nonce is taken once.
  const sent = { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }
  expect((await t.req('POST', '/auth/validate', { body: sent })).status).toBe(200)
  expect((await t.req('POST', '/auth/validate', { body: sent })).body).toEqual({ status: 'failed', error: 'replay_detected' })
  // A caller with a wrong secret does not get the license read from PostgreSQL, fresh or not.
  const licenseReads = t.ctx.actors.loads.licenses
  const wrong = await t.req('POST', '/auth/validate', { body: { ...sent, appSecret: 'wrong', licenseKey: 'AAAA-BBBB-CCCC-DDDD', nonce: nonce() } })
  expect(wrong.body).toEqual({ status: 'failed', error: 'invalid_app' })
  expect(t.ctx.actors.loads.licenses).toBe(licenseReads)
  // Read afresh, a revoke made a moment ago holds.
  await updateLicense(t.ctx, key, { status: 'revoked' })
  expect((await validate()).body).toEqual({ status: 'failed', error: 'revoked' })
})

test("an app whose stored signing key is not Ed25519 fails its own validates alone, another app's in the same turn pass", async () => {
  const t = await makeTestApp()
  const [broken, other] = [await t.seed({ name: 'Broken key' }), await t.seed({ name: 'Other' })]
  // Sealed under the right master key, so it opens; it only cannot sign.
  const x25519 = generateKeyPairSync('x25519').privateKey.export({ format: 'der', type: 'pkcs8' })
  await t.ctx.database.db.update(signingKeys).set({ privateKeyEnc: new Sealer(TEST_MASTER_KEY).seal(x25519) }).where(eq(signingKeys.appId, broken.appId))
  const validate = async (s: typeof broken) => {
    const key = await insertLicense(t.ctx, s.appId)
    return t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() } })
  }
  const answers = await Promise.all([validate(broken), validate(other), validate(other)])
  expect(answers.map((res) => [res.status, res.body.status ?? res.body.error])).toEqual([
    [500, 'failed'],
    [200, 'success'],
    [200, 'success'],
  ])
  expect(answers[0]!.body.error).toBe('system_error')
})
