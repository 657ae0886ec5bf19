import { describe, expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'
import { accountDigest } from '../support/account-digest'

describe('expiry dates outside what PostgreSQL stores', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const [license] = (await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })).body.licenses

  test('an expiry outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z gets 400 on create and extend, nothing changed', async () => {
    for (const expiresAt of ['0000-01-01T00:00:00Z', '9999-12-31T23:59:59-23:59', '1969-12-31T23:59:59.999Z']) {
      const before = await accountDigest(t.ctx, s.accountId)
      const create = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, expiresAt } })
      expect(create.status, `${expiresAt}: ${JSON.stringify(create.body)}`).toBe(400)
      expect(create.body.message).toContain('expiresAt')
      const extend = await t.req('PUT', `/v1/licenses/${license.licenseKey}`, {
        apiKey: s.apiKey,
        body: { action: 'extend', expiresAt },
      })
      expect(extend.status, `${expiresAt}: ${JSON.stringify(extend.body)}`).toBe(400)
      expect(await accountDigest(t.ctx, s.accountId)).toBe(before)
    }
    // The edges themselves are inside.
    for (const [expiresAt, stored] of [
      ['1970-01-01T00:00:00Z', '1970-01-01T00:00:00.000Z'],
      ['9999-12-31T23:59:59.999Z', '9999-12-31T23:59:59.999Z'],
      ['9999-12-31T23:59:59+01:00', '9999-12-31T22:59:59.000Z'],
    ]) {
      const res = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, expiresAt } })
      expect(res.status, JSON.stringify(res.body)).toBe(201)
      expect(res.body.licenses[0].expiresAt).toBe(stored)
    }
  })
})

describe('list cursors are verified', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const other = await t.seed()
  for (const app of [s, other]) {
    await t.req('POST', '/v1/licenses', { apiKey: app.apiKey, body: { appId: app.appId, quantity: 3 } })
  }
  const list = (apiKey: string, appId: string, cursor: string) =>
    t.req('GET', `/v1/licenses?appId=${appId}&limit=1&cursor=${encodeURIComponent(cursor)}`, { apiKey })
  const first = await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=1`, { apiKey: s.apiKey })
  const issued: string = first.body.cursor
  const [position = '', tag = ''] = issued.split('.')
  const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64url')

  test('a cursor the API did not return gets 400; the one it returned pages on', async () => {
    const crafted = [
      b64('0000-01-01T00:00:00.000Z|AAAA-BBBB-CCCC-DDDD'),
      b64('+275760-09-13T00:00:00.000Z|AAAA-BBBB-CCCC-DDDD'),
      b64(JSON.stringify({ createdAt: '2030-01-01T00:00:00Z', key: "x' OR 1=1", __proto__: 1 })),
      b64('2030-01-01T00:00:00.000Z|AAAA\u0000BBBB'),
      `${b64('2999-01-01T00:00:00.000Z|ZZZZ-ZZZZ-ZZZZ-ZZZZ')}.${tag}`,
      `${position}.${'A'.repeat(22)}`,
      position,
      `.${tag}`,
      '***',
    ]
    for (const cursor of crafted) {
      const res = await list(s.apiKey, s.appId, cursor)
      expect(res.status, `${cursor}: ${JSON.stringify(res.body)}`).toBe(400)
      expect(res.body).toEqual({ error: 'bad_request', message: 'cursor is not one this API returned' })
    }
    const next = await list(s.apiKey, s.appId, issued)
    expect(next.status, JSON.stringify(next.body)).toBe(200)
    expect(next.body.licenses[0].licenseKey).not.toBe(first.body.licenses[0].licenseKey)
  })

  test("another app's cursor is not one of this listing", async () => {
    const theirs = await t.req('GET', `/v1/licenses?appId=${other.appId}&limit=1`, { apiKey: other.apiKey })
    expect((await list(s.apiKey, s.appId, theirs.body.cursor)).status).toBe(400)
  })
})
