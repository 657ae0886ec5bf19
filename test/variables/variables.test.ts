import { beforeAll, describe, expect, test } from 'bun:test'
import { createApiKey, revokeApiKey } from '../../src/accounts/service'
import { makeTestApp, type TestApp } from '../support/helpers'
import { appEpochKey, licenseEpochKey } from '../support/client'

const errorBody = (error: string) => ({ error, message: expect.any(String) })

let t: TestApp
beforeAll(async () => {
  t = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

interface Target {
  /** Path of the variables of a fresh owned resource. */
  path: string
  epochKey: string
}

async function newLicense(s: Seeded): Promise<string> {
  const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
  return res.body.licenses[0].licenseKey
}

const targets: [string, (s: Seeded) => Promise<Target>][] = [
  [
    'app',
    async (s) => ({ path: `/v1/apps/${s.appId}/variables`, epochKey: await appEpochKey(t.ctx, s.appId) }),
  ],
  [
    'license',
    async (s) => {
      const key = await newLicense(s)
      return { path: `/v1/licenses/${key}/variables`, epochKey: await licenseEpochKey(t.ctx, s.appId, key) }
    },
  ],
]

const sizedMap = (bytes: number) => ({ a: 'x'.repeat(bytes - '{"a":""}'.length) })

describe.each(targets)('%s variables', (_kind, targetOf) => {
  test('start empty, are replaced whole by PUT and cleared by {}', async () => {
    const s = await t.seed()
    const { path, epochKey } = await targetOf(s)
    const initial = await t.req('GET', path, { apiKey: s.apiKey })
    expect(initial.status).toBe(200)
    expect(initial.body).toEqual({})

    const [before] = await t.ctx.store.epochs([epochKey])
    const put = await t.req('PUT', path, {
      apiKey: s.apiKey,
      body: { tier: 'pro', seats: 5, ratio: 0.5, beta: true },
    })
    expect(put.status, JSON.stringify(put.body)).toBe(200)
    expect(put.body).toEqual({ tier: 'pro', seats: 5, ratio: 0.5, beta: true })
    const [after] = await t.ctx.store.epochs([epochKey])
    expect(after ?? 0).toBeGreaterThan(before ?? 0)

    const replaced = await t.req('PUT', path, { apiKey: s.apiKey, body: { tier: 'basic' } })
    expect(replaced.body).toEqual({ tier: 'basic' })
    expect((await t.req('GET', path, { apiKey: s.apiKey })).body).toEqual({ tier: 'basic' })

    const cleared = await t.req('PUT', path, { apiKey: s.apiKey, body: {} })
    expect(cleared.status).toBe(200)
    expect(cleared.body).toEqual({})
    expect((await t.req('GET', path, { apiKey: s.apiKey })).body).toEqual({})
  })

  test('accepts the limits exactly: 50 names, 64-character names, 4,096 bytes', async () => {
    const s = await t.seed()
    const { path } = await targetOf(s)
    const fifty = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`k${i}`, i]))
    expect((await t.req('PUT', path, { apiKey: s.apiKey, body: fifty })).body).toEqual(fifty)
    const longName = { ['n'.repeat(64)]: false }
    expect((await t.req('PUT', path, { apiKey: s.apiKey, body: longName })).body).toEqual(longName)
    const full = sizedMap(4096)
    expect(Buffer.byteLength(JSON.stringify(full))).toBe(4096)
    const res = await t.req('PUT', path, { apiKey: s.apiKey, body: full })
    expect(res.status).toBe(200)
    expect(res.body).toEqual(full)
  })

  describe.each([
    ['51 names', Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`k${i}`, i]))],
    ['an empty name', { '': 'x' }],
    ['a 65-character name', { ['n'.repeat(65)]: 1 }],
    ['4,097 bytes of JSON', sizedMap(4097)],
    ['over 4,096 bytes in multi-byte characters', { a: 'é'.repeat(2045) }],
    ['a null value', { a: null }],
    ['an array value', { a: [1] }],
    ['an object value', { a: { b: 1 } }],
    ['an array body', ['a', 'b']],
    ['a string body', '"text"'],
    ['a number body', '12'],
    ['a body that is not JSON', '{"a":'],
  ])('400 bad_request: %s', (_name, body) => {
    test('keeps the stored map', async () => {
      const s = await t.seed()
      const { path } = await targetOf(s)
      await t.req('PUT', path, { apiKey: s.apiKey, body: { keep: 'me' } })
      const res = await t.req('PUT', path, { apiKey: s.apiKey, body })
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      expect((await t.req('GET', path, { apiKey: s.apiKey })).body).toEqual({ keep: 'me' })
    })
  })

  test("403 for another account's resource, which stays unchanged", async () => {
    const s = await t.seed()
    const other = await t.seed()
    const { path } = await targetOf(other)
    await t.req('PUT', path, { apiKey: other.apiKey, body: { owner: 'other' } })
    for (const [method, body] of [
      ['GET', undefined],
      ['PUT', { owner: 'me' }],
    ] as const) {
      const res = await t.req(method, path, { apiKey: s.apiKey, body })
      expect(res.status, method).toBe(403)
      expect(res.body).toEqual(errorBody('forbidden'))
    }
    expect((await t.req('GET', path, { apiKey: other.apiKey })).body).toEqual({ owner: 'other' })
  })

  test.each([
    ['no key', async () => undefined],
    ['an unknown key', async () => 'svc_live_DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD'],
    [
      'a revoked key',
      async (s: Seeded) => {
        const apiKey = await createApiKey(t.ctx, s.accountId)
        await revokeApiKey(t.ctx, apiKey)
        return apiKey
      },
    ],
  ])('401 invalid_api_key with %s', async (_name, keyOf) => {
    const s = await t.seed()
    const { path } = await targetOf(s)
    const apiKey = await keyOf(s)
    for (const [method, body] of [
      ['GET', undefined],
      ['PUT', { a: 1 }],
    ] as const) {
      const res = await t.req(method, path, { apiKey, body })
      expect(res.status, method).toBe(401)
      expect(res.body).toEqual(errorBody('invalid_api_key'))
    }
    expect((await t.req('GET', path, { apiKey: s.apiKey })).body).toEqual({})
  })
})

describe('app and license variables are separate maps', () => {
  test('setting one leaves the other alone', async () => {
    const s = await t.seed()
    const key = await newLicense(s)
    await t.req('PUT', `/v1/apps/${s.appId}/variables`, {
      apiKey: s.apiKey,
      body: { scope: 'app' },
    })
    await t.req('PUT', `/v1/licenses/${key}/variables`, {
      apiKey: s.apiKey,
      body: { scope: 'license' },
    })
    expect(
      (await t.req('GET', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey })).body,
    ).toEqual({ scope: 'app' })
    expect(
      (await t.req('GET', `/v1/licenses/${key}/variables`, { apiKey: s.apiKey })).body,
    ).toEqual({ scope: 'license' })
  })
})

describe('errors that only one kind has', () => {
  test.each([
    ['an absent license', 'ZZZZ-ZZZZ-ZZZZ-ZZZZ'],
    ['a malformed license key', 'not-a-key'],
  ])('404 not_found for %s', async (_name, key) => {
    const s = await t.seed()
    for (const [method, body] of [
      ['GET', undefined],
      ['PUT', { a: 1 }],
    ] as const) {
      const res = await t.req(method, `/v1/licenses/${key}/variables`, { apiKey: s.apiKey, body })
      expect(res.status, method).toBe(404)
      expect(res.body).toEqual(errorBody('not_found'))
    }
  })

  test.each([
    ['an absent app', '00000000-0000-4000-8000-000000000000'],
    ['an appId that is not a UUID', 'nope'],
  ])('403 forbidden for %s', async (_name, appId) => {
    const s = await t.seed()
    for (const [method, body] of [
      ['GET', undefined],
      ['PUT', { a: 1 }],
    ] as const) {
      const res = await t.req(method, `/v1/apps/${appId}/variables`, { apiKey: s.apiKey, body })
      expect(res.status, method).toBe(403)
      expect(res.body).toEqual(errorBody('forbidden'))
    }
  })
})
