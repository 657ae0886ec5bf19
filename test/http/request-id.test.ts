/**
 * X-Request-Id: the client's when sane, else a new one; on every response, and on the log lines of
 * that request. The access log line, at debug only, names the route pattern and never the path.
 */
import { afterEach, describe, expect, setSystemTime, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { signingKeys } from '../../src/db/schema'
import { REPEAT_EVERY_MS, setLogLevel } from '../../src/lib/log'
import { MemoryStore } from '../../src/store/memory'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { loggedBy } from '../support/log-capture'

const GENERATED = /^[0-9a-f]{12}-[0-9a-z]+$/

afterEach(() => setLogLevel('error'))

async function appWithFailures() {
  const t = await makeTestApp()
  t.app.use(
    new Elysia().get(
      '/v1/boom',
      () => {
        throw new Error('boom')
      },
      { detail: { hide: true } },
    ),
  )
  return t
}

describe('X-Request-Id', () => {
  test('a sane id sent is answered on every kind of response', async () => {
    const t = await appWithFailures()
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const validate = { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }
    const cases: [string, string, { body?: unknown; apiKey?: string }, number][] = [
      ['POST', '/auth/validate', { body: validate }, 200],
      ['POST', '/auth/validate', { body: { ...validate, nonce: nonce(), appSecret: 'wrong' } }, 401],
      ['POST', '/auth/validate', { body: { appId: 7 } }, 400],
      ['POST', '/auth/validate', { body: JSON.stringify({ pad: 'x'.repeat(16 * 1024) }) }, 413],
      ['GET', '/v1/account', { apiKey: s.apiKey }, 200],
      ['GET', '/v1/account', {}, 401],
      ['GET', '/v1/boom', {}, 500],
      ['GET', '/no/such/route', {}, 404],
      ['GET', '/docs', {}, 200],
      ['GET', '/docs/json', {}, 200],
      ['GET', '/metrics', {}, 200],
      ['GET', '/healthz', {}, 200],
    ]
    for (const [i, [method, path, init, status]] of cases.entries()) {
      const id = `trace-${i}_a.b:c`
      const res = await t.req(method, path, { ...init, headers: { 'x-request-id': id } })
      expect(res.status, `${method} ${path}`).toBe(status)
      expect(res.headers.get('x-request-id'), `${method} ${path}`).toBe(id)
    }
  })

  test.each([
    ['absent', undefined],
    ['empty', ''],
    ['with a space', 'a b'],
    ['with a quote', 'a"b'],
    ['too long', 'x'.repeat(129)],
    ['not ASCII', 'id-é'],
  ])('an id %s is replaced by a new one, unique per request', async (_, given) => {
    const { req } = await makeTestApp()
    const headers: Record<string, string> = given === undefined ? {} : { 'x-request-id': given }
    const ids = await Promise.all([1, 2, 3].map(async () => (await req('GET', '/healthz', { headers })).headers.get('x-request-id')))
    for (const id of ids) expect(id).toMatch(GENERATED)
    expect(new Set(ids).size).toBe(3)
  })

  test('128 characters is still sane', async () => {
    const { req } = await makeTestApp()
    const id = 'y'.repeat(128)
    expect((await req('GET', '/healthz', { headers: { 'x-request-id': id } })).headers.get('x-request-id')).toBe(id)
  })

  test("the request's error line carries its id", async () => {
    const t = await appWithFailures()
    let answered: string | null = null
    const entries = await loggedBy(async () => {
      answered = (await t.req('GET', '/v1/boom')).headers.get('x-request-id')
    })
    expect(answered).toMatch(GENERATED)
    expect(entries).toEqual([expect.objectContaining({ msg: 'unhandled error', requestId: answered, route: '/v1/boom' })])
  })
})

/** A store whose rate limiter is unreachable. */
class LimiterDown extends MemoryStore {
  override async take(): Promise<never> {
    throw new Error('store down')
  }
}

describe("request-scoped warnings carry the request's id", () => {
  test('a signed answer the app cannot sign: the line says why, with the id answered', async () => {
    const t = await makeTestApp()
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    await t.ctx.database.db.update(signingKeys).set({ active: false }).where(eq(signingKeys.appId, s.appId))
    let status = 0
    const entries = await loggedBy(async () => {
      const res = await t.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
        headers: { 'x-request-id': 'unsignable-1' },
      })
      status = res.status
    })
    expect(status).toBe(500)
    expect(entries).toContainEqual(
      expect.objectContaining({ level: 'error', msg: 'app has no active signing key', requestId: 'unsignable-1', appId: s.appId }),
    )
  })

  test('an outage line written while serving a request names that request', async () => {
    // A store of its own: the shared one serves the other tests of this process.
    const t = await makeTestApp({ store: new LimiterDown() })
    const s = await t.seed()
    setLogLevel('warn')
    // Past the last line this message may have logged in this test process (one per REPEAT_EVERY_MS).
    setSystemTime(new Date(Date.now() + REPEAT_EVERY_MS + 1000))
    try {
      const entries = await loggedBy(async () => {
        expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey, headers: { 'x-request-id': 'outage-1' } })).status).toBe(200)
      })
      expect(entries).toContainEqual(
        expect.objectContaining({ msg: 'rate-limit store unreachable: Developer API requests are not limited', requestId: 'outage-1' }),
      )
    } finally {
      setSystemTime()
    }
  })
})

describe('access log', () => {
  test('at debug: one line per request with method, route pattern, status, duration and id; never the path', async () => {
    setLogLevel('debug')
    const t = await makeTestApp()
    const s = await t.seed()
    const written: Record<string, unknown>[] = []
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const ids = ['lookup-1', 'scan-1']
    const entries = await loggedBy(async () => {
      await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, headers: { 'x-request-id': 'lookup-1' } })
      await t.req('GET', `/scanner/${licenseKey}`, { headers: { 'x-request-id': 'scan-1' } })
      // Written once the response is sent: wait for the second line.
      const seen = (e: Record<string, unknown>) => e.msg === 'request' && e.requestId === 'scan-1'
      for (let i = 0; i < 200 && !written.some(seen); i++) await Bun.sleep(10)
    }, written)
    // Lines of earlier tests' requests may land meanwhile: only these two requests' count.
    const access = entries.filter((e) => e.msg === 'request' && ids.includes(e.requestId))
    expect(access).toEqual([
      { time: expect.any(String), level: 'debug', requestId: 'lookup-1', method: 'GET', route: '/v1/licenses/:licenseKey', status: 200, ms: expect.any(Number), msg: 'request' },
      { time: expect.any(String), level: 'debug', requestId: 'scan-1', method: 'GET', route: 'unmatched', status: 404, ms: expect.any(Number), msg: 'request' },
    ])
    expect(JSON.stringify(entries)).not.toContain(licenseKey)
  })

  test('above debug: no line at all', async () => {
    setLogLevel('info')
    const t = await makeTestApp()
    const entries = await loggedBy(async () => {
      await t.req('GET', '/healthz')
      await t.req('GET', '/no/such/route')
      await Bun.sleep(20)
    })
    expect(entries).toEqual([])
  })
})
