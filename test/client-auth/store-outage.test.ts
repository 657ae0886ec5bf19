import { afterAll, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { Redis } from 'ioredis'
import { addCredits } from '../../src/accounts/service'
import { accounts } from '../../src/db/schema'
import { RedisStore } from '../../src/store/redis'
import { makeTestApp, type TestApp } from '../support/helpers'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { ownRedis, until } from '../support/servers'

const redis = await ownRedis()
const store = new RedisStore(redis.url)
afterAll(async () => {
  await store.close()
  await redis.stop()
})

const t = await makeTestApp({ store })

/** A new app of `on`'s with a license, and one device's session on it. */
async function signedIn(on: TestApp) {
  const s = await on.seed()
  const licenseKey = await insertLicense(on.ctx, s.appId)
  const h = hwid()
  const first = await on.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  expect(first.status, JSON.stringify(first.body)).toBe(200)
  return { s, licenseKey, h, sessionToken: decode(first.body.payload).sessionToken as string }
}

test('Redis unreachable: validate fails closed, heartbeat fails open, minting fails charging nothing, /readyz is 503, all recover when it returns', async () => {
  await until(() => store.ping(), (up) => up)
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const h = hwid()
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const first = await validate()
  expect(first.status, JSON.stringify(first.body)).toBe(200)
  const token = decode(first.body.payload).sessionToken
  const beat = () => t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })

  await redis.stop()
  const down = await validate()
  expect(down.status).toBe(500)
  const notReady = await t.req('GET', '/readyz')
  expect(notReady.status).toBe(503)
  expect(notReady.body).toEqual({ status: 'unavailable', database: 'ok', store: 'failed' })
  expect(down.body).toEqual({ status: 'failed', error: 'system_error' })
  const open = await beat()
  expect(open.status, JSON.stringify(open.body)).toBe(200)
  expect(decode(open.body.payload).licenseKey).toBe(licenseKey)
  // Failing open still reads the license fresh: a bad token is refused without the store.
  expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: 'x.y', hwid: h } })).status).toBe(401)
  // A billed mint is charged in the store first: it fails, and no file is made.
  const files = `/v1/licenses/${licenseKey}/offline-files`
  const refused = await t.req('POST', files, { apiKey: s.apiKey, body: {} })
  expect(refused.status).toBe(500)
  expect(refused.body.error).toBe('internal_error')
  expect((await t.req('GET', files, { apiKey: s.apiKey })).body.files).toEqual([])

  await redis.start()
  const back = await until(validate, (r) => r.status === 200)
  expect(back.status).toBe(200)
  expect((await beat()).status).toBe(200)
  expect((await t.req('GET', '/readyz')).status).toBe(200)
  expect((await t.req('POST', files, { apiKey: s.apiKey, body: {} })).status).toBe(201)
})

test('Redis unreachable: an IP past its budget of made-up app ids still reaches an app this process holds', async () => {
  await until(() => store.ping(), (up) => up)
  // A context of its own: its budget of app ids that turn out not to exist is spent below.
  const own = await makeTestApp({ store })
  const { s, licenseKey, h, sessionToken } = await signedIn(own)
  const unheld = await own.seed()
  const beat = (appId: string) => own.req('POST', '/auth/heartbeat', { body: { appId, sessionToken, hwid: h } })

  await redis.stop()
  try {
    // Heartbeats fail open without the store: each made-up app id is read from PostgreSQL, until the budget is spent.
    const madeUp: string[] = []
    for (let i = 0; i < 200 && !madeUp.includes('rate_limited'); i++) madeUp.push((await beat(crypto.randomUUID())).body.error)
    expect(madeUp.length).toBeGreaterThanOrEqual(60)
    expect(new Set(madeUp.slice(0, -1))).toEqual(new Set(['invalid_app']))
    expect(madeUp.at(-1)).toBe('rate_limited')
    const held = await beat(s.appId)
    expect(held.status, JSON.stringify(held.body)).toBe(200)
    expect(decode(held.body.payload).licenseKey).toBe(licenseKey)
    const refused = await beat(unheld.appId)
    expect([refused.status, refused.body.error]).toEqual([429, 'rate_limited'])
  } finally {
    await redis.start()
  }
})

test("Redis unreachable: heartbeats of one address at once on an instance that holds no copy of the app are each served, none answered another's lookup", async () => {
  await until(() => store.ping(), (up) => up)
  const { s, h, sessionToken } = await signedIn(t)
  const cold = await makeTestApp({ store })
  // A read of the app from PostgreSQL slow enough for the second heartbeat to come while the first's is on its way.
  const loadApp = cold.ctx.actors.loadApp.bind(cold.ctx.actors)
  cold.ctx.actors.loadApp = async (appId: string) => {
    await Bun.sleep(100)
    return loadApp(appId)
  }
  const beat = () => cold.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: h } })
  await redis.stop()
  try {
    const firstBeat = beat()
    await Bun.sleep(30)
    const answers = await Promise.all([firstBeat, beat()])
    expect(answers.map((res) => [res.status, res.body.error])).toEqual([
      [200, undefined],
      [200, undefined],
    ])
  } finally {
    await redis.start()
  }
})

test('Developer API changes during a Redis outage answer at once and are seen when it returns', async () => {
  await until(() => store.ping(), (up) => up)
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
  expect((await validate()).status).toBe(200)

  await redis.stop()
  const started = performance.now()
  const revoked = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
  expect(revoked.status).toBe(200)
  expect((await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })).body.status).toBe('revoked')
  expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey })).status).toBe(200)
  // Each would wait for a reconnect attempt (a second or more); none of them does.
  expect(performance.now() - started).toBeLessThan(1000)

  await redis.start()
  const back = await until(validate, (r) => r.status !== 500)
  expect(back.body).toEqual({ status: 'failed', error: 'revoked' })
})

test('Redis killed under load: a real app is never answered invalid_app, however many requests its IP sends meanwhile', async () => {
  await until(() => store.ping(), (up) => up)
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  const h = hwid()
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const token = decode((await validate()).body.payload).sessionToken
  // Requests in flight when the connection drops see a new store generation, which empties the cache:
  // every later request misses the app while the store is down.
  let loading = true
  const load = Array.from({ length: 8 }, async () => {
    while (loading) {
      await validate()
      // Once the store fails at once, in-process requests settle without I/O: a loop of them alone would
      // never let the event loop see Redis's exit, and `loading` would never be cleared.
      await Bun.sleep(0)
    }
  })
  await Bun.sleep(200)
  await redis.stop()
  loading = false
  await Promise.all(load)
  const seen = new Set<string>()
  for (let i = 0; i < 80; i++) seen.add(`${(await validate()).body.error}`)
  expect([...seen]).toEqual(['system_error'])
  const beat = await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
  expect(beat.status, JSON.stringify(beat.body)).toBe(200)
  await redis.start()
})

/**
 * `run` on an app with 10 credits and a license, whose store has a Redis of its own that `pause` makes
 * hold every command (the connection stays open) and gives up on a call after 1 s.
 */
async function onStallingRedis(
  run: (r: { app: TestApp; s: Awaited<ReturnType<TestApp['seed']>>; licenseKey: string; pause(ms: number): Promise<unknown> }) => Promise<void>,
): Promise<void> {
  const stalled = await ownRedis()
  const quiet = new RedisStore(stalled.url, { callTimeoutMs: 1000 })
  const admin = new Redis(stalled.url)
  try {
    const app = await makeTestApp({ store: quiet })
    const s = await app.seed({ credits: 10 })
    const licenseKey = await insertLicense(app.ctx, s.appId)
    await run({ app, s, licenseKey, pause: (ms) => admin.call('CLIENT', 'PAUSE', String(ms), 'ALL') })
  } finally {
    admin.disconnect()
    await quiet.close()
    await stalled.stop()
  }
}

// Redis is paused for up to 7 s and its answer awaited for up to 10 more: beyond bun test's 5 s default
// when this file runs on its own, outside test/run.ts's --timeout.
const STALLING_TEST_MS = 30_000

test('Redis that stops answering without closing the connection: client requests are answered as in an outage by the deadline, cache misses too, and a charge Redis made late is given back', () =>
  onStallingRedis(async ({ app, s, licenseKey, pause }) => {
    // Never requested: their first validate has to read their epoch from Redis before the authorize call.
    const uncached = await insertLicense(app.ctx, s.appId)
    const uncachedToo = await insertLicense(app.ctx, s.appId)
    const h = hwid()
    const validate = (key = licenseKey) =>
      app.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: h, nonce: nonce() } })
    const credits = async () => (await app.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits
    const first = await validate()
    expect(first.status, JSON.stringify(first.body)).toBe(200)
    const sessionToken = decode(first.body.payload).sessionToken
    expect(await credits()).toBe(9)

    // Redis keeps the connection and reads the commands, but runs none for a while.
    const pausedMs = 5000
    await pause(pausedMs)
    const pausedAt = performance.now()
    const [closed, open, miss] = await Promise.all([
      validate(),
      app.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: h } }),
      validate(uncached),
    ])
    expect(performance.now() - pausedAt).toBeLessThan(pausedMs - 1500)
    expect(closed.body).toEqual({ status: 'failed', error: 'system_error' })
    expect(open.status, JSON.stringify(open.body)).toBe(200)
    expect(decode(open.body.payload).licenseKey).toBe(licenseKey)
    expect(miss.body).toEqual({ status: 'failed', error: 'system_error' })
    // While those calls are unanswered, the next requests do not wait for their own deadline, a cache
    // miss's epoch read neither (it would be answered after them on the same connection).
    const again = performance.now()
    expect((await app.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: h } })).status).toBe(200)
    expect((await validate()).body).toEqual({ status: 'failed', error: 'system_error' })
    expect((await validate(uncachedToo)).body).toEqual({ status: 'failed', error: 'system_error' })
    // Each would wait out its own second otherwise.
    expect(performance.now() - again).toBeLessThan(900)

    // Once Redis runs the held validate it charges for it; the client was told it failed, so that comes back.
    // Until then the balance read fails at once (a call is overdue) and PostgreSQL's 10 is read instead
    // (this app runs no reconciler).
    expect(await until(credits, (n) => n === 9, 10_000)).toBe(9)
    expect(performance.now() - pausedAt).toBeGreaterThan(pausedMs - 200)
    expect((await validate()).status).toBe(200)
    expect(await credits()).toBe(8)
  }), STALLING_TEST_MS)

test('Redis that stops answering without closing the connection: Developer API requests are answered by the deadline, without limit headers and with the balance PostgreSQL holds', () =>
  onStallingRedis(async ({ app, s, licenseKey, pause }) => {
    const account = () => app.req('GET', '/v1/account', { apiKey: s.apiKey })
    // A validate charges the live balance in Redis; PostgreSQL keeps 10 until a flush (this app runs none).
    const validated = await app.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
    })
    expect(validated.status, JSON.stringify(validated.body)).toBe(200)
    const before = await account()
    expect(before.status).toBe(200)
    expect(before.headers.get('ratelimit-limit')).toBe('100')
    expect(before.body.credits).toBe(9)

    const pausedMs = 7000
    await pause(pausedMs)
    const pausedAt = performance.now()
    const during = await account()
    // The limiter waited out its deadline (1 s), not the pause; the balance read behind it failed at once.
    expect(performance.now() - pausedAt).toBeLessThan(pausedMs - 2500)
    expect(during.status).toBe(200)
    expect(during.headers.get('ratelimit-limit')).toBeNull()
    expect(during.body.credits).toBe(10)
    // That call is still unanswered: the next request's would be answered after it, so they fail at
    // once instead of waiting out their own deadlines.
    const again = performance.now()
    const next = await account()
    // Each of its two calls would wait out a second otherwise.
    expect(performance.now() - again).toBeLessThan(900)
    expect(next.status).toBe(200)
    expect(next.headers.get('ratelimit-limit')).toBeNull()
    expect(next.body.credits).toBe(10)

    expect(await until(async () => (await account()).headers.get('ratelimit-limit'), (limit) => limit === '100', 10_000)).toBe('100')
    expect((await account()).body.credits).toBe(9)
  }), STALLING_TEST_MS)

test('Redis that stops answering without closing the connection: adding credits fails by the deadline, adds nothing and leaves the account row free', () =>
  onStallingRedis(async ({ app, s, pause }) => {
    const pausedMs = 5000
    await pause(pausedMs)
    const pausedAt = performance.now()
    await expect(addCredits(app.ctx, s.accountId, 5)).rejects.toThrow()
    expect(performance.now() - pausedAt).toBeLessThan(pausedMs - 2500)
    // A flush (FOR UPDATE) or a balance seed could take the row at once: no transaction waits on Redis.
    const [row] = await app.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, s.accountId)).for('update', { noWait: true })
    expect(row?.credits).toBe(10)
    // Once Redis answers again, the call it ran late dropped a balance PostgreSQL still agrees with.
    const added = await until(() => addCredits(app.ctx, s.accountId, 5).then((r) => r.credits, () => null), (n) => n !== null, 10_000)
    expect(added).toBe(15)
    expect((await app.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(15)
  }), STALLING_TEST_MS)
