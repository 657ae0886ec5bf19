/**
 * Redis that stops answering with its connections open (a stalled host, CLIENT PAUSE, a failover under
 * way), then resumes: a change made meanwhile must not be taken back by another instance's cache.
 */
import { afterAll, expect, test } from 'bun:test'
import { RedisStore } from '../../src/store/redis'
import { decode, hwid, nonce } from '../support/client'
import { makeTestApp, MODE, type TestApp } from '../support/helpers'
import { ownRedis } from '../support/servers'

// Two instances on one PostgreSQL: the PostgreSQL pass only.
test.skipIf(MODE !== 'postgres')('a revoke made while Redis stalls is not undone on another instance when Redis answers again', async () => {
  const redis = await ownRedis()
  const stores: RedisStore[] = []
  const instance = async (): Promise<TestApp> => {
    const store = new RedisStore(redis.url)
    stores.push(store)
    return makeTestApp({ store })
  }
  afterAll(async () => {
    redis.signal('SIGCONT')
    for (const store of stores) await store.close()
    await redis.stop()
  })
  const [a, b] = [await instance(), await instance()]
  const s = await a.seed({ credits: 1_000 })
  const created = await a.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, unlimitedHwidSlots: true } })
  const licenseKey = created.body.licenses[0].licenseKey
  const h = hwid()
  const validated = await b.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const sessionToken = decode(validated.body.payload).sessionToken
  const beat = () => b.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: h } })
  expect((await beat()).status).toBe(200)
  redis.signal('SIGSTOP')
  expect((await a.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })).status).toBe(200)
  // B's store call misses its deadline: B answers from PostgreSQL, as in an outage.
  expect((await beat()).body).toEqual({ status: 'failed', error: 'revoked' })
  redis.signal('SIGCONT')
  await Bun.sleep(50)
  // No sweep runs here: the revoke's own bump must reach Redis, sent while it stalled.
  for (let i = 0; i < 5; i++) expect((await beat()).body).toEqual({ status: 'failed', error: 'revoked' })
}, 30_000)
