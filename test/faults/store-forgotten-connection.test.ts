/**
 * A Redis connection a network path forgot (a NAT or load balancer that dropped the flow without a
 * reset): nothing sent on it arrives, nothing comes back, and no close either, while new connections
 * reach Redis. The calls on it fail as in an outage, and the connection is replaced within seconds, not
 * the 15 minutes TCP would retransmit for.
 */
import { afterAll, expect, test } from 'bun:test'
import Redis from 'ioredis'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { until } from '../support/servers'
import { storeBehindProxy } from '../support/tampering-proxy'

const { proxy, store, redisUrl } = await storeBehindProxy()
const t = await makeTestApp({ store, env: { PUBLIC_RATE_LIMITS: 'false' } })
const s = await t.seed({ credits: 100 })
const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
const validate = () =>
  t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
let release: (() => void) | null = null
afterAll(() => release?.())

test('a connection the path forgot is replaced once Redis answers on a new one: validates are served again within seconds', async () => {
  expect((await validate()).status).toBe(200)
  release = proxy.holdWrites('open')
  // The call that meets the forgotten connection goes past its deadline; the next ones fail at once.
  expect((await validate()).body).toEqual({ status: 'failed', error: 'system_error' })
  const forgottenAt = performance.now()
  const served = await until(() => validate().then((res) => res.status), (status) => status === 200, 10_000)
  expect(served).toBe(200)
  expect(performance.now() - forgottenAt).toBeLessThan(8_000)
}, 30_000)

test('a Redis busy with a long command keeps its connection: a PING aside waits behind the command too', async () => {
  expect((await validate()).status).toBe(200)
  const generation = t.ctx.actors.generation
  const admin = new Redis(redisUrl)
  try {
    // Seven seconds of one script: Redis answers nothing else meanwhile, on any connection (past 5 s, BUSY).
    const busy = admin.eval("local t = redis.call('TIME') local until_s = t[1] + 7 repeat t = redis.call('TIME') until t[1] + t[2] / 1e6 >= until_s return 1", 0)
    await Bun.sleep(100)
    expect((await validate()).body).toEqual({ status: 'failed', error: 'system_error' })
    await busy
    expect((await until(() => validate().then((res) => res.status), (status) => status === 200, 5_000))).toBe(200)
    // Not taken for a dead connection: the cache, which a replaced connection empties, was kept.
    expect(t.ctx.actors.generation).toBe(generation)
  } finally {
    admin.disconnect()
  }
}, 30_000)
