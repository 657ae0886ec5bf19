import { describe, expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'
import { hwid, insertLicense, nonce } from '../support/client'
import { accountDigest } from '../support/account-digest'

/**
 * A NUL character and an unpaired surrogate, neither storable in a PostgreSQL text or JSON column: as
 * JSON text, and percent-encoded for a path (ED A0 80 is the surrogate's would-be UTF-8, invalid).
 */
const HOSTILE = [
  ['NUL', 'a\u0000b', 'a%00b'],
  ['a lone surrogate', 'a\ud800b', 'a%ED%A0%80b'],
] as const

describe.each(HOSTILE)('%s in a Developer API string', async (_name, bad, _inPath) => {
  const t = await makeTestApp()
  const s = await t.seed()
  const [licenseKey] = (await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })).body
    .licenses.map((l: { licenseKey: string }) => l.licenseKey)
  const webhook = await t.req('POST', `/v1/apps/${s.appId}/webhooks`, {
    apiKey: s.apiKey,
    body: { url: 'https://127.0.0.1:9/hook', events: ['license.created'] },
  })
  expect(webhook.status, JSON.stringify(webhook.body)).toBe(201)
  const webhookPath = `/v1/apps/${s.appId}/webhooks/${webhook.body.webhookId}`

  test.each([
    ['POST', '/v1/apps', { name: bad }, 'name'],
    ['POST', '/v1/licenses', { appId: s.appId, label: bad }, 'label'],
    ['PUT', `/v1/apps/${s.appId}/variables`, { tier: bad }, 'tier'],
    ['PUT', `/v1/apps/${s.appId}/variables`, { [bad]: 1 }, bad],
    ['PUT', `/v1/licenses/${licenseKey}/variables`, { tier: bad }, 'tier'],
    ['PUT', `/v1/apps/${s.appId}/security`, { hwidBlacklist: ['ok', bad] }, 'hwidBlacklist.1'],
    ['PUT', `/v1/apps/${s.appId}/security`, { ipWhitelist: [bad] }, 'ipWhitelist.0'],
    ['POST', `/v1/apps/${s.appId}/security/blacklist`, { type: 'hwid', value: bad }, 'value'],
    ['DELETE', `/v1/apps/${s.appId}/security/whitelist`, { type: 'hwid', value: bad }, 'value'],
    ['POST', `/v1/apps/${s.appId}/webhooks`, { url: `https://example.com/${bad}`, events: ['license.created'] }, 'url'],
    ['PUT', webhookPath, { url: `https://example.com/${bad}` }, 'url'],
  ])('%s %s %j: 400 naming the field, nothing changed', async (method, path, body, field) => {
    const before = await accountDigest(t.ctx, s.accountId)
    const res = await t.req(method, path, { apiKey: s.apiKey, body })
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body.error).toBe('bad_request')
    expect(res.body.message).toContain(JSON.stringify(field).slice(1, -1))
    expect(await accountDigest(t.ctx, s.accountId)).toBe(before)
  })
})

test('NUL or a lone surrogate in a path or query parameter: 4xx on every route that takes one, never 500', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const routes = [
    ['PUT', `/v1/apps/${s.appId}/webhooks/{}`, { enabled: false }],
    ['DELETE', `/v1/apps/${s.appId}/webhooks/{}`, undefined],
    ['POST', `/v1/apps/${s.appId}/webhooks/{}/test`, undefined],
    ['GET', '/v1/apps/{}/webhooks', undefined],
    ['PUT', '/v1/apps/{}/variables', { a: 1 }],
    ['GET', '/v1/licenses/{}', undefined],
    ['PUT', '/v1/licenses/{}', { action: 'revoke' }],
    ['DELETE', '/v1/licenses/{}', undefined],
    ['PUT', '/v1/licenses/{}/variables', { a: 1 }],
    ['GET', `/v1/licenses?appId=${s.appId}&cursor={}`, undefined],
    ['GET', '/v1/licenses?appId={}', undefined],
  ] as const
  for (const [, , inPath] of HOSTILE) {
    for (const [method, template, body] of routes) {
      const path = template.replace('{}', inPath)
      const res = await t.req(method, path, { apiKey: s.apiKey, body })
      expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBeGreaterThanOrEqual(400)
      expect(res.status, `${method} ${path}: ${JSON.stringify(res.body)}`).toBeLessThan(500)
    }
  }
})

describe.each(HOSTILE)('%s in a client endpoint field', async (_name, bad, _inPath) => {
  const t = await makeTestApp()
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId)
  const validate = { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }
  const heartbeat = { appId: s.appId, sessionToken: 'token', hwid: hwid(), nonce: nonce() }
  const selfban = { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce(), sessionToken: 'token' }

  test.each([
    ...Object.keys(validate).map((field) => ['/auth/validate', validate, field] as const),
    ...Object.keys(heartbeat).map((field) => ['/auth/heartbeat', heartbeat, field] as const),
    ...Object.keys(selfban).map((field) => ['/auth/selfban', selfban, field] as const),
  ])('%s %s field %s: 400 bad_request, nothing changed', async (path, body, field) => {
    const before = await accountDigest(t.ctx, s.accountId)
    // Padded so the length rules (nonce: 8 or more) pass and only the character is wrong.
    const res = await t.req('POST', path, { body: { ...body, [field]: `${bad}${'x'.repeat(10)}` } })
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body).toEqual({ status: 'failed', error: 'bad_request' })
    expect(await accountDigest(t.ctx, s.accountId)).toBe(before)
  })

  test('one hostile HWID among concurrent first activations fails alone', async () => {
    const others = await Promise.all(Array.from({ length: 30 }, () => insertLicense(t.ctx, s.appId)))
    const requests = others.map((licenseKey) =>
      t.req('POST', '/auth/validate', { body: { ...validate, licenseKey, hwid: hwid(), nonce: nonce() } }),
    )
    const hostile = t.req('POST', '/auth/validate', { body: { ...validate, hwid: bad, nonce: nonce() } })
    const [answers, refused] = await Promise.all([Promise.all(requests), hostile])
    expect(refused.status).toBe(400)
    expect(answers.map((r) => r.status)).toEqual(others.map(() => 200))
  })
})

describe('bytes that are not UTF-8 in a Developer API body', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  // {"name":"\xff\xfe"}, and the same bytes as a text/plain body.
  const notUtf8 = Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')])

  test.each([
    ['POST', '/v1/apps', 'application/json'],
    ['PUT', `/v1/apps/${s.appId}/variables`, 'application/json'],
    ['POST', `/v1/apps/${s.appId}/activation-requests`, 'text/plain'],
  ])('%s %s (%s): 400, never U+FFFD stored in their place', async (method, path, contentType) => {
    const before = await accountDigest(t.ctx, s.accountId)
    const res = await t.app.handle(
      new Request(`http://localhost${path}`, {
        method,
        headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': contentType },
        body: notUtf8,
      }),
    )
    expect(res.status).toBe(400)
    expect(await res.json()).toEqual({ error: 'bad_request', message: 'Request body is not valid UTF-8' })
    expect(await accountDigest(t.ctx, s.accountId)).toBe(before)
  })
})

describe('lengths count characters, as the spec does: one outside the BMP (an emoji) is one, not two UTF-16 units', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const emoji = (n: number) => '😀'.repeat(n)

  test('an HWID of 128 such characters validates, binds and is listed; 129 is a 400', async () => {
    const key = await insertLicense(t.ctx, s.appId)
    const validate = (h: string) =>
      t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: h, nonce: nonce() } })
    expect((await validate(emoji(129))).status).toBe(400)
    const ok = await validate(emoji(128))
    expect(ok.status, JSON.stringify(ok.body)).toBe(200)
    const got = await t.req('GET', `/v1/licenses/${key}`, { apiKey: s.apiKey })
    expect(got.status, JSON.stringify(got.body)).toBe(200)
    expect(got.body.hwid).toBe(emoji(128))
  })

  test('a label of 128 such characters is kept; 129 is a 400 saying so', async () => {
    const made = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, label: emoji(128) } })
    expect(made.status, JSON.stringify(made.body)).toBe(201)
    expect(made.body.licenses[0].label).toBe(emoji(128))
    const long = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, label: emoji(129) } })
    expect(long.body).toEqual({ error: 'bad_request', message: 'label must be a string of at most 128 characters' })
  })

  test('a variable name of 64 such characters is kept; 65 is a 400', async () => {
    const path = `/v1/apps/${s.appId}/variables`
    expect((await t.req('PUT', path, { apiKey: s.apiKey, body: { [emoji(64)]: 1 } })).status).toBe(200)
    const long = await t.req('PUT', path, { apiKey: s.apiKey, body: { [emoji(65)]: 1 } })
    expect(long.body).toEqual({ error: 'bad_request', message: `The name ${JSON.stringify(emoji(65))} must be a string from 1 to 64 characters` })
  })

  test('a list entry and an offline file take an HWID of 128 such characters', async () => {
    const listed = await t.req('POST', `/v1/apps/${s.appId}/security/blacklist`, { apiKey: s.apiKey, body: { type: 'hwid', value: emoji(128) } })
    expect(listed.status, JSON.stringify(listed.body)).toBe(200)
    const tooLong = await t.req('POST', `/v1/apps/${s.appId}/security/blacklist`, { apiKey: s.apiKey, body: { type: 'hwid', value: emoji(129) } })
    expect(tooLong.status).toBe(400)
    const key = await insertLicense(t.ctx, s.appId)
    const file = await t.req('POST', `/v1/licenses/${key}/offline-files`, { apiKey: s.apiKey, body: { hwids: [emoji(100)] } })
    expect(file.status, JSON.stringify(file.body)).toBe(201)
    expect(file.body.hwid).toEqual({ mode: 'bound', hwids: [emoji(100)] })
  })
})
