/**
 * Redis loses its data (restarted empty, or flushed with no reconnect) while the service runs: epochs
 * restart at 0, so no instance may take a cache entry read before the loss for a fresh one.
 */
import { afterAll, expect, test } from 'bun:test'
import Redis from 'ioredis'
import { RedisStore } from '../../src/store/redis'
import { decode, hwid, nonce } from '../support/client'
import { makeTestApp, type TestApp } from '../support/helpers'
import { ownRedis, until } from '../support/servers'

const redis = await ownRedis()
const stores: RedisStore[] = []
const admin = new Redis(redis.url, { maxRetriesPerRequest: 1 })
admin.on('error', () => {})
afterAll(async () => {
  for (const store of stores) await store.close()
  admin.disconnect()
  await redis.stop()
})

/** One service instance: its own store connection and caches, the shared database. */
async function instance(): Promise<TestApp> {
  const store = new RedisStore(redis.url)
  stores.push(store)
  return makeTestApp({ store })
}

const a = await instance()
const b = await instance()
const account = await a.seed({ credits: 1000 })

async function createLicense(t: TestApp, body: Record<string, unknown>): Promise<string> {
  const res = await t.req('POST', '/v1/licenses', { apiKey: account.apiKey, body: { appId: account.appId, ...body } })
  expect(res.status, JSON.stringify(res.body)).toBe(201)
  return res.body.licenses[0].licenseKey
}

async function change(t: TestApp, licenseKey: string, body: Record<string, unknown>): Promise<void> {
  const res = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: account.apiKey, body })
  expect(res.status, JSON.stringify(res.body)).toBe(200)
}

const validate = (t: TestApp, licenseKey: string, h: string) =>
  t.req('POST', '/auth/validate', {
    body: { appId: account.appId, appSecret: account.appSecret, licenseKey, hwid: h, nonce: nonce() },
  })

const heartbeat = (t: TestApp, sessionToken: string, h: string) =>
  t.req('POST', '/auth/heartbeat', { body: { appId: account.appId, sessionToken, hwid: h } })

async function restartEmpty(): Promise<void> {
  await redis.stop()
  await redis.start()
  for (const store of stores) await until(() => store.ping(), (up) => up)
}

test('an unlimited key revoked after Redis restarted empty is refused', async () => {
  const licenseKey = await createLicense(a, { unlimitedHwidSlots: true })
  const h = hwid()
  expect((await validate(a, licenseKey, h)).status).toBe(200)
  await restartEmpty()
  await change(a, licenseKey, { action: 'revoke' })
  const res = await validate(a, licenseKey, h)
  expect(res.body).toEqual({ status: 'failed', error: 'revoked' })
  expect(res.status).toBe(410)
})

test('a one-seat key revoked and extended after Redis restarted empty fails its heartbeat and validate', async () => {
  const licenseKey = await createLicense(a, { maxHwidSlots: 1 })
  const h = hwid()
  const first = await validate(a, licenseKey, h)
  expect(first.status, JSON.stringify(first.body)).toBe(200)
  const token = decode(first.body.payload).sessionToken
  expect((await heartbeat(a, token, h)).status).toBe(200)
  await restartEmpty()
  await change(a, licenseKey, { action: 'revoke' })
  await change(a, licenseKey, { action: 'extend', expiresAt: '2040-01-01T00:00:00Z' })
  const beat = await heartbeat(a, token, h)
  expect(beat.body).toEqual({ status: 'failed', error: 'revoked' })
  expect((await validate(a, licenseKey, h)).body).toEqual({ status: 'failed', error: 'revoked' })
})

test('FLUSHALL without a reconnect: a revoke made afterwards is seen at once', async () => {
  const licenseKey = await createLicense(a, { unlimitedHwidSlots: true })
  const h = hwid()
  expect((await validate(a, licenseKey, h)).status).toBe(200)
  await admin.flushall()
  await change(a, licenseKey, { action: 'revoke' })
  expect((await validate(a, licenseKey, h)).body).toEqual({ status: 'failed', error: 'revoked' })
})

test('two instances: a change made through one after a flush is seen by the other', async () => {
  const licenseKey = await createLicense(a, { unlimitedHwidSlots: true })
  const h = hwid()
  const first = await validate(b, licenseKey, h)
  expect(first.status, JSON.stringify(first.body)).toBe(200)
  const token = decode(first.body.payload).sessionToken
  expect((await validate(a, licenseKey, h)).status).toBe(200)
  expect((await heartbeat(b, token, h)).status).toBe(200)
  await admin.flushall()
  await change(a, licenseKey, { action: 'revoke' })
  expect((await heartbeat(b, token, h)).body).toEqual({ status: 'failed', error: 'revoked' })
  expect((await validate(b, licenseKey, h)).body).toEqual({ status: 'failed', error: 'revoked' })
  await admin.flushall()
  await change(b, licenseKey, { action: 'activate' })
  expect((await heartbeat(a, token, h)).status).toBe(200)
})

test('Redis back with older data that kept its generation id (a replica that missed writes): the reconnect starts over', async () => {
  const older = await ownRedis()
  const store = new RedisStore(older.url)
  const t = await makeTestApp({ store })
  try {
    const licenseKey = await createLicense(t, { unlimitedHwidSlots: true })
    const h = hwid()
    expect((await validate(t, licenseKey, h)).status).toBe(200)
    // The copy the server comes back with: ls:gen is in it, the two changes below are not.
    await store.redis.save()
    await change(t, licenseKey, { action: 'revoke' })
    await change(t, licenseKey, { action: 'activate' })
    expect((await validate(t, licenseKey, h)).status).toBe(200)
    await older.stop()
    await older.start()
    await until(() => store.ping(), (up) => up)
    // Two changes bring the license epoch back to the value the cache holds.
    await change(t, licenseKey, { action: 'revoke' })
    await change(t, licenseKey, { action: 'extend', expiresAt: '2040-01-01T00:00:00Z' })
    expect((await validate(t, licenseKey, h)).body).toEqual({ status: 'failed', error: 'revoked' })
  } finally {
    await store.close()
    await older.stop()
  }
})

test('after Redis restarted empty, the cache warm-up fills the emptied cache again', async () => {
  const c = await instance()
  const h = hwid()
  const first = await createLicense(a, {})
  const second = await createLicense(a, {})
  const warm = c.ctx.actors.startWarmUp()
  await warm.idle()
  expect(c.ctx.actors.cachedLicense(account.appId, second)?.value?.key).toBe(second)
  await restartEmpty()
  // The first request after the loss learns of it: every entry goes, and the warm-up starts again.
  expect((await validate(c, first, h)).status).toBe(200)
  await warm.idle()
  expect(c.ctx.actors.cachedLicense(account.appId, second)?.value?.key).toBe(second)
  await warm.stop()
})

test('an app disabled before Redis restarted empty is refused by a request whose license load saw the restart', async () => {
  const c = await instance()
  // Sandbox: no charge, so no lost balance sends the request round again (that would hide the bug).
  const own = await a.seed({ sandbox: true })
  // The app's epoch key goes with a first loss, so c's copy is read under epoch 0: what a lost key reads as.
  await restartEmpty()
  const license = async () => {
    const res = await a.req('POST', '/v1/licenses', { apiKey: own.apiKey, body: { appId: own.appId } })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    return res.body.licenses[0].licenseKey as string
  }
  const check = (licenseKey: string) =>
    c.req('POST', '/auth/validate', { body: { appId: own.appId, appSecret: own.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
  expect((await check(await license())).status).toBe(200)
  const res = await a.req('PATCH', `/v1/apps/${own.appId}`, { apiKey: own.apiKey, body: { disabled: true } })
  expect(res.status, JSON.stringify(res.body)).toBe(200)
  // The bump that made c's copy stale is lost with the data: only the generation says so now.
  await restartEmpty()
  // A license c never loaded: its load reads the new generation while the request holds the old app entry.
  const refused = await check(await license())
  expect(refused.body).toEqual({ status: 'failed', error: 'app_disabled' })
})
