/**
 * Epoch keys expire an hour after their last write, so Redis keeps one per license in use, not per
 * license ever served; a key that went is written anew at a value no instance's entry holds.
 */
import { afterAll, expect, test } from 'bun:test'
import { RedisStore } from '../../src/store/redis'
import { EPOCH_TTL_MS, keys } from '../../src/store/store'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_REDIS_URL } from '../support/helpers'

// Two instances on the shared PostgreSQL and Redis: the PostgreSQL pass only.
if (MODE === 'postgres') {
  const stores = [0, 1].map(() => new RedisStore(TEST_REDIS_URL!)) as [RedisStore, RedisStore]
  afterAll(() => Promise.all(stores.map((store) => store.close())))

  test("a license's epoch is kept an hour after its last write, and an entry read before a change is not served once it went", async () => {
    const [a, b] = [await makeTestApp({ store: stores[0] }), await makeTestApp({ store: stores[1] })]
    const s = await a.seed({ credits: 100 })
    const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
    const validate = (on: typeof a) =>
      on.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
    // The other instance holds the license, read under its epoch.
    expect((await validate(b)).status).toBe(200)
    const epochKey = keys.licenseEpoch(stores[0].shardOf(s.accountId), licenseKey)
    const kept = async () => stores[0].redis.pttl(epochKey)
    expect(await kept()).toBeGreaterThan(EPOCH_TTL_MS - 60_000)

    const revoked = await a.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
    expect(revoked.status).toBe(200)
    expect(await kept()).toBeGreaterThan(EPOCH_TTL_MS - 60_000)
    // The hour passes without another change: the key goes, as Redis's expiry would take it.
    await stores[0].redis.pexpire(epochKey, 1)
    await Bun.sleep(20)
    expect(await stores[0].redis.exists(epochKey)).toBe(0)
    expect((await validate(b)).body).toEqual({ status: 'failed', error: 'revoked' })
  })
}
