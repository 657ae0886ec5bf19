import { describe, expect, test } from 'bun:test'
import { Elysia } from 'elysia'
import { randomBytes } from 'node:crypto'
import { revokeApiKey } from '../../src/accounts/service'
import { apiKeyAuth, UNKNOWN_API_KEYS_PER_MINUTE } from '../../src/http/auth'
import { API_BURST } from '../../src/http/rate-limit'
import { keys, type Store } from '../../src/store/store'
import { makeTestApp, sharedInfra } from '../support/helpers'

/** A test app plus one authenticated /v1 route, so the limiter is tested apart from any feature route. */
async function limitedApp(options: { store?: Store; env?: Record<string, string> } = {}) {
  let now = Date.UTC(2030, 0, 1)
  const t = await makeTestApp({ clock: () => now, ...options })
  t.app.use(
    new Elysia()
      .use(apiKeyAuth(t.ctx))
      .get('/v1/probe', ({ accountId }) => ({ accountId }), { apiKey: true }),
  )
  return { ...t, advance: (ms: number) => (now += ms) }
}

describe('Developer API rate limit', () => {
  test('made-up keys: one address may look up 60 unknown keys a minute, then gets 429 without a lookup; other addresses are served', async () => {
    // In-process requests have no socket peer; trusting the unknown peer lets the test pick its client IP.
    const { req, seed, advance } = await limitedApp({ env: { TRUSTED_PROXIES: '0.0.0.0' } })
    const { apiKey, accountId } = await seed()
    const from = (ip: string, key: string) => req('GET', '/v1/probe', { apiKey: key, headers: { 'x-forwarded-for': ip } })
    const madeUp = () => `svc_live_${randomBytes(16).toString('hex')}`
    for (let i = 0; i < UNKNOWN_API_KEYS_PER_MINUTE; i++) expect((await from('198.51.100.9', madeUp())).status).toBe(401)
    const refused = await from('198.51.100.9', madeUp())
    expect(refused.status).toBe(429)
    expect(refused.body).toEqual({ error: 'rate_limited', message: expect.any(String) })
    expect(refused.headers.get('retry-after')).toBe('1')
    // The made-up key's own bucket did not refuse it: its headers would say requests remain.
    expect(refused.headers.get('ratelimit-remaining')).toBeNull()
    // Another address, and another IPv6 /64, have lookups of their own.
    expect((await from('198.51.100.10', madeUp())).status).toBe(401)
    expect((await from('2001:db8:9:1::1', madeUp())).status).toBe(401)
    expect((await from('198.51.100.10', apiKey)).body).toEqual({ accountId })
    // A real key spends none of the address's lookups: once one is back, it is served.
    advance(1000)
    expect((await from('198.51.100.9', apiKey)).body).toEqual({ accountId })
    expect((await from('198.51.100.9', apiKey)).body).toEqual({ accountId })
    expect((await from('198.51.100.9', madeUp())).status).toBe(401)
    expect((await from('198.51.100.9', madeUp())).status).toBe(429)
  })

  test('made-up keys sent at once from one address cost no more lookups than sent one after another', async () => {
    const { req } = await limitedApp({ env: { TRUSTED_PROXIES: '0.0.0.0' } })
    const answers = await Promise.all(
      Array.from({ length: 100 }, () =>
        req('GET', '/v1/probe', { apiKey: `svc_live_${randomBytes(16).toString('hex')}`, headers: { 'x-forwarded-for': '198.51.100.30' } }),
      ),
    )
    const statuses = answers.map((res) => res.status)
    expect(statuses.filter((status) => status === 401)).toHaveLength(UNKNOWN_API_KEYS_PER_MINUTE)
    expect(statuses.filter((status) => status === 429)).toHaveLength(100 - UNKNOWN_API_KEYS_PER_MINUTE)
  })

  test("a revoked key still in use spends none of its address's lookups: the live keys, a replacement's first use too, are served", async () => {
    const { req, seed, ctx } = await limitedApp({ env: { TRUSTED_PROXIES: '0.0.0.0' } })
    const live = await seed()
    const forgotten = await seed()
    const from = (key: string) => req('GET', '/v1/probe', { apiKey: key, headers: { 'x-forwarded-for': '198.51.100.20' } })
    expect((await from(live.apiKey)).body).toEqual({ accountId: live.accountId })
    expect((await from(forgotten.apiKey)).body).toEqual({ accountId: forgotten.accountId })
    expect(await revokeApiKey(ctx, forgotten.apiKey)).toBe(true)
    // Refused at once, each time, as a revoked key and never as an address past its lookups.
    for (let i = 0; i <= UNKNOWN_API_KEYS_PER_MINUTE; i++) expect((await from(forgotten.apiKey)).status).toBe(401)
    expect((await from(live.apiKey)).body).toEqual({ accountId: live.accountId })
    // The key issued in its place, used for the first time from that address.
    const replacement = await seed()
    expect((await from(replacement.apiKey)).body).toEqual({ accountId: replacement.accountId })
    // Nor does one this process never found live: revoked before its first use here (another process's
    // key, or one revoked while this process was down).
    const revokedElsewhere = await seed()
    expect(await revokeApiKey(ctx, revokedElsewhere.apiKey)).toBe(true)
    for (let i = 0; i <= UNKNOWN_API_KEYS_PER_MINUTE; i++) expect((await from(revokedElsewhere.apiKey)).status).toBe(401)
    const another = await seed()
    expect((await from(another.apiKey)).body).toEqual({ accountId: another.accountId })
  })

  test('a burst of 100 passes, the 101st gets 429 rate_limited with Retry-After, and refill lets it through', async () => {
    const { req, seed, advance } = await limitedApp()
    const { apiKey, accountId } = await seed()
    for (let i = 0; i < API_BURST; i++) {
      const res = await req('GET', '/v1/probe', { apiKey })
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      expect(res.headers.get('ratelimit-limit')).toBe('100')
      expect(res.headers.get('ratelimit-remaining')).toBe(String(API_BURST - 1 - i))
    }
    const limited = await req('GET', '/v1/probe', { apiKey })
    expect(limited.status).toBe(429)
    expect(limited.body).toEqual({ error: 'rate_limited', message: expect.any(String) })
    expect(limited.headers.get('retry-after')).toBe('1')
    expect(limited.headers.get('ratelimit-remaining')).toBe('0')
    expect(limited.headers.get('ratelimit-reset')).toBe('1')

    // 50 tokens per second: one token is back after 20 ms, and only one.
    advance(20)
    const refilled = await req('GET', '/v1/probe', { apiKey })
    expect(refilled.status).toBe(200)
    expect(refilled.body).toEqual({ accountId })
    expect((await req('GET', '/v1/probe', { apiKey })).status).toBe(429)

    // After two seconds the bucket is full again (capacity 100 at 50/s).
    advance(2000)
    const full = await req('GET', '/v1/probe', { apiKey })
    expect(full.status).toBe(200)
    expect(full.headers.get('ratelimit-remaining')).toBe('99')
  })

  test('a clock stepped back (or another instance ahead) holds a key back by no more than the step, and Retry-After says so', async () => {
    const { req, seed, advance } = await limitedApp()
    const { apiKey } = await seed()
    for (let i = 0; i < API_BURST; i++) expect((await req('GET', '/v1/probe', { apiKey })).status).toBe(200)
    // A second behind the time the bucket was last taken at: the next token comes 20 ms after it is reached.
    advance(-1000)
    const behind = await req('GET', '/v1/probe', { apiKey })
    expect(behind.status).toBe(429)
    expect(behind.headers.get('retry-after')).toBe('2')
    // An hour back, further than a whole refill: read as now with a token, not an hour of 429s.
    advance(-3_600_000)
    expect((await req('GET', '/v1/probe', { apiKey })).status).toBe(200)
  })

  test('two instances whose clocks differ by seconds share a key bucket: the limit still holds, neither refilling the other', async () => {
    const { store } = await sharedInfra()
    const key = keys.apiBucket(randomBytes(16).toString('hex'))
    const start = Date.UTC(2031, 0, 1)
    // The instance 3 s ahead empties the bucket; then requests alternate between the two for 0.2 s.
    for (let i = 0; i < API_BURST; i++) expect((await store.take(key, API_BURST, 50, start + 3_000)).ok).toBe(true)
    let passed = 0
    for (let k = 0; k < 100; k++) {
      if ((await store.take(key, API_BURST, 50, start + 2 * k)).ok) passed++
      if ((await store.take(key, API_BURST, 50, start + 3_000 + 2 * k + 1)).ok) passed++
    }
    // 50 a second over 0.2 s.
    expect(passed).toBeLessThanOrEqual(11)
  })

  test("after a clock step back of under a minute, the address's unknown-key lookups say truly when one is back", async () => {
    const { req, advance } = await limitedApp({ env: { TRUSTED_PROXIES: '0.0.0.0' } })
    const from = () => req('GET', '/v1/probe', { apiKey: `svc_live_${randomBytes(16).toString('hex')}`, headers: { 'x-forwarded-for': '198.51.100.78' } })
    for (let i = 0; i < UNKNOWN_API_KEYS_PER_MINUTE; i++) expect((await from()).status).toBe(401)
    advance(-30_000)
    const refused = await from()
    expect(refused.status).toBe(429)
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(30)
    advance(Number(refused.headers.get('retry-after')) * 1000)
    expect((await from()).status).toBe(401)
  })

  test("a clock stepped back an hour does not hold an address's unknown-key lookups back for the hour", async () => {
    const { req, seed, advance } = await limitedApp({ env: { TRUSTED_PROXIES: '0.0.0.0' } })
    const from = (key: string) => req('GET', '/v1/probe', { apiKey: key, headers: { 'x-forwarded-for': '198.51.100.77' } })
    for (let i = 0; i < UNKNOWN_API_KEYS_PER_MINUTE; i++) expect((await from(`svc_live_${randomBytes(16).toString('hex')}`)).status).toBe(401)
    advance(-3_600_000)
    const { apiKey, accountId } = await seed()
    expect((await from(apiKey)).body).toEqual({ accountId })
  })

  test('each key has its own bucket', async () => {
    const { req, seed } = await limitedApp()
    const a = await seed()
    const b = await seed()
    for (let i = 0; i < API_BURST; i++) await req('GET', '/v1/probe', { apiKey: a.apiKey })
    expect((await req('GET', '/v1/probe', { apiKey: a.apiKey })).status).toBe(429)
    expect((await req('GET', '/v1/probe', { apiKey: b.apiKey })).status).toBe(200)
  })

  test("unknown keys are limited too, by their own bucket before the address's lookups", async () => {
    const { req } = await limitedApp()
    const bogus = `svc_live_${crypto.randomUUID().replaceAll('-', '')}`
    const first = await req('GET', '/v1/probe', { apiKey: bogus })
    expect(first.status).toBe(401)
    expect(first.body.error).toBe('invalid_api_key')
    expect(first.headers.get('ratelimit-remaining')).toBe('99')
    const rest = []
    for (let i = 1; i < API_BURST; i++) rest.push((await req('GET', '/v1/probe', { apiKey: bogus })).status)
    // 401 while the address may look keys up, then 429 from its lookups; the key's bucket still counts.
    expect(rest).toEqual([...Array(UNKNOWN_API_KEYS_PER_MINUTE - 1).fill(401), ...Array(API_BURST - UNKNOWN_API_KEYS_PER_MINUTE).fill(429)])
    const last = await req('GET', '/v1/probe', { apiKey: bogus })
    expect(last.status).toBe(429)
    expect(last.headers.get('ratelimit-remaining')).toBe('0')
  })

  test('a missing or malformed key is 401 without touching the limiter', async () => {
    const { req } = await limitedApp()
    const missing = await req('GET', '/v1/probe')
    expect(missing.status).toBe(401)
    expect(missing.headers.get('ratelimit-limit')).toBeNull()
    const malformed = await req('GET', '/v1/probe', { headers: { authorization: 'Bearer nope' } })
    expect(malformed.status).toBe(401)
  })

  test('an unreachable store fails open: the request is served, never a 500', async () => {
    const { MemoryStore } = await import('../../src/store/memory')
    class BrokenStore extends MemoryStore {
      override async take(): Promise<never> {
        throw new Error('connection refused')
      }
    }
    const { req, seed } = await limitedApp({ store: new BrokenStore() })
    const { apiKey, accountId } = await seed()
    const res = await req('GET', '/v1/probe', { apiKey })
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ accountId })
    expect(res.headers.get('ratelimit-limit')).toBeNull()
  })
})
