import { beforeAll, describe, expect, test } from 'bun:test'
import { LICENSE_FILE_TYPE } from '../../src/licenses/offline/routes'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, type TestApp } from '../support/helpers'

type Json = Record<string, any>
let t: TestApp
let doc: Json

// A clock that stands still: the API key's bucket refills by none while the test empties it.
const NOW = Date.parse('2031-05-04T12:00:00.000Z')

beforeAll(async () => {
  t = await makeTestApp({
    clock: () => NOW,
    // In-process requests have no socket peer: trusting it lets X-Forwarded-For name the client for /auth limits.
    env: { TRUSTED_PROXIES: '0.0.0.0', VALIDATE_LIMIT_PER_IP: '1' },
  })
  doc = (await t.req('GET', '/docs/json')).body
})

const RATE_LIMIT = ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset']
const FILE_MINTS = ['POST /v1/licenses/{licenseKey}/offline-files', 'POST /v1/apps/{appId}/activation-requests']

/** Every response of the document, with the operation it belongs to. */
function responses(): { where: string; status: string; op: Json; headers: Json }[] {
  return Object.entries<Json>(doc.paths).flatMap(([path, item]) =>
    Object.entries<Json>(item).flatMap(([method, op]) =>
      Object.entries<Json>(op.responses).map(([status, response]) => ({
        where: `${method.toUpperCase()} ${path}`,
        status,
        op,
        headers: response.headers ?? {},
      })),
    ),
  )
}

/** A response's declared headers by lower-case name, references resolved. */
function declared(where: string, status: string): Map<string, Json> {
  const [method = '', path = ''] = where.split(' ')
  const headers: Json = doc.paths[path]?.[method.toLowerCase()]?.responses[status]?.headers ?? {}
  return new Map(
    Object.entries<Json>(headers).map(([name, header]) => [
      name.toLowerCase(),
      header.$ref ? doc.components.headers[header.$ref.replace('#/components/headers/', '')] : header,
    ]),
  )
}

describe('declared headers', () => {
  test('every response declares X-Request-Id, as always sent', () => {
    expect(doc.components.headers['X-Request-Id'].required).toBe(true)
    for (const { where, status, headers } of responses())
      expect(headers['X-Request-Id'], `${where} ${status}`).toEqual({ $ref: '#/components/headers/X-Request-Id' })
  })

  test('responses of routes behind the API key declare RateLimit-*, except a 408, a 413 and a 500; no other route does', () => {
    let keyed = 0
    for (const { where, status, op, headers } of responses()) {
      const behindKey = (op.security ?? []).some((s: Json) => 'bearerAuth' in s)
      const sends = behindKey && !['408', '413', '500'].includes(status)
      if (sends) keyed++
      for (const name of RATE_LIMIT) expect(name in headers, `${where} ${status} ${name}`).toBe(sends)
    }
    expect(keyed).toBeGreaterThan(100)
  })

  test('every 429 declares Retry-After: always sent on /v1, with rate_limited on /auth', () => {
    const limited = responses().filter((r) => r.status === '429')
    expect(limited.some((r) => r.where.includes(' /v1/'))).toBe(true)
    expect(limited.some((r) => r.where.includes(' /auth/'))).toBe(true)
    for (const { where } of limited) {
      const retryAfter = declared(where, '429').get('retry-after')
      expect(retryAfter?.schema.type, where).toBe('integer')
      expect(retryAfter?.required ?? false, where).toBe(where.includes(' /v1/'))
    }
  })

  test('only the 201 of a mint, which can be the file itself, declares Content-Disposition', () => {
    for (const { where, status, headers } of responses()) {
      expect('Content-Disposition' in headers, `${where} ${status}`).toBe(FILE_MINTS.includes(where) && status === '201')
    }
  })
})

const TRACKED = ['x-request-id', 'ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset', 'retry-after', 'content-disposition']

/** A real response against its operation's declaration: what it sends is declared, what is required is sent. */
function expectAgrees(where: string, res: { status: number; headers: Headers }, carries: string[], lacks: string[] = []) {
  const at = `${where} ${res.status}`
  const headers = declared(where, String(res.status))
  expect(headers.size, `${at} is documented`).toBeGreaterThan(0)
  for (const name of TRACKED) if (res.headers.has(name)) expect(headers.has(name), `${at} declares ${name}`).toBe(true)
  for (const [name, header] of headers) if (header.required) expect(res.headers.has(name), `${at} sends ${name}`).toBe(true)
  for (const [name, header] of headers) {
    const value = res.headers.get(name)
    if (value === null) continue
    if (header.schema.type === 'integer') expect(Number(value), `${at} ${name}: ${value}`).toBeGreaterThanOrEqual(header.schema.minimum)
    if (header.schema.pattern) expect(value, `${at} ${name}`).toMatch(new RegExp(header.schema.pattern))
  }
  for (const name of carries) expect(res.headers.get(name), `${at} carries ${name}`).not.toBeNull()
  for (const name of lacks) expect(res.headers.get(name), `${at} lacks ${name}`).toBeNull()
}

const rateLimit = RATE_LIMIT.map((name) => name.toLowerCase())

describe('real responses carry what the document declares', () => {
  test('Developer API: success, errors after the key check, a 413 and a missing key', async () => {
    const { apiKey } = await t.seed()
    expectAgrees('GET /v1/account', await t.req('GET', '/v1/account', { apiKey }), ['x-request-id', ...rateLimit])
    expectAgrees(
      'GET /v1/licenses/{licenseKey}',
      await t.req('GET', '/v1/licenses/K7QM-3XWT-9HFP-2RDN', { apiKey }),
      ['x-request-id', ...rateLimit],
    )
    expectAgrees('POST /v1/licenses', await t.req('POST', '/v1/licenses', { apiKey, body: { bogus: 1 } }), [
      'x-request-id',
      ...rateLimit,
    ])
    const tooLarge = await t.req('POST', '/v1/licenses', { apiKey, body: JSON.stringify({ label: 'x'.repeat(1_100_000) }) })
    expect(tooLarge.status).toBe(413)
    expectAgrees('POST /v1/licenses', tooLarge, ['x-request-id'], rateLimit)
    const noKey = await t.req('GET', '/v1/account')
    expect(noKey.status).toBe(401)
    expectAgrees('GET /v1/account', noKey, ['x-request-id'], rateLimit)
  })

  test("Developer API: the 429 of a spent key's bucket", async () => {
    const { apiKey } = await t.seed()
    let res = await t.req('GET', '/v1/account', { apiKey })
    for (let sent = 1; res.status === 200 && sent <= 100; sent++) res = await t.req('GET', '/v1/account', { apiKey })
    expect(res.status).toBe(429)
    expectAgrees('GET /v1/account', res, ['x-request-id', 'retry-after', ...rateLimit])
  })

  test('a mint answered with the file', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const res = await t.req('POST', `/v1/licenses/${licenseKey}/offline-files`, {
      apiKey: s.apiKey,
      body: {},
      headers: { accept: LICENSE_FILE_TYPE },
    })
    expect(res.status).toBe(201)
    expectAgrees('POST /v1/licenses/{licenseKey}/offline-files', res, ['x-request-id', 'content-disposition', ...rateLimit])
  })

  test('client endpoints: success, a failure, the per-IP limit; and an operations route', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const validate = () =>
      t.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
        headers: { 'x-forwarded-for': '198.51.100.7' },
      })
    const first = await validate()
    expect(first.status).toBe(200)
    expectAgrees('POST /auth/validate', first, ['x-request-id'], rateLimit)
    const limited = await validate()
    expect(limited.status).toBe(429)
    expectAgrees('POST /auth/validate', limited, ['x-request-id', 'retry-after'], rateLimit)
    const badSession = await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: 'x', hwid: hwid() } })
    expect(badSession.status).toBe(401)
    expectAgrees('POST /auth/heartbeat', badSession, ['x-request-id'])
    expectAgrees('GET /healthz', await t.req('GET', '/healthz'), ['x-request-id'])
  })
})
