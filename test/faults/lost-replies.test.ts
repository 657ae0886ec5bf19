/**
 * Redis ran a call and its reply was lost with the connection. Sent again on the next connection, the
 * call would run twice: a refund would give the credits back twice, an authorize call take twice what
 * it takes. So a call in flight when its connection drops fails at once, as in an outage, and runs once.
 */
import { expect, test } from 'bun:test'
import { keys } from '../../src/store/store'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { until } from '../support/servers'
import { storeBehindProxy } from '../support/tampering-proxy'

const { proxy, store } = await storeBehindProxy()
const t = await makeTestApp({ store })

/** Runs `work` with the reply to the next write naming `key` lost, and waits for the store to reconnect. */
async function losingReplyTo<T>(key: string, work: () => Promise<T>): Promise<T> {
  proxy.loseReplyTo = (data) => data.includes(key)
  try {
    return await work()
  } finally {
    proxy.loseReplyTo = null
    await until(() => store.ping(), (up) => up)
  }
}

test('a refund whose reply is lost gives the credits back once', async () => {
  const s = await t.seed({ credits: 100 })
  const charge = await t.ctx.credits.charge(s.accountId, 10, Date.now())
  expect(charge).not.toBeNull()
  const pending = () => store.redis.get(keys.pendingCharges('', s.accountId))
  expect(await pending()).toBe('10')
  await losingReplyTo(keys.pendingCharges('', s.accountId), () => t.ctx.credits.refund(s.accountId, 5, charge!.chargedUnder))
  await Bun.sleep(200)
  expect(await store.balance(s.accountId)).toBe(95)
  expect(await pending()).toBe('5')
})

test('a heartbeat whose authorize reply is lost is served as in an outage, by its deadline, and counted once', async () => {
  const s = await t.seed({ credits: 100 })
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const h = hwid()
  const validated = await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  expect(validated.status, JSON.stringify(validated.body)).toBe(200)
  const beat = () =>
    t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: decode(validated.body.payload).sessionToken, hwid: h } })
  expect((await beat()).status).toBe(200)
  const counter = () => store.redis.get(keys.heartbeats('', licenseKey))
  const before = Number(await counter())
  const startedAt = performance.now()
  const lost = await losingReplyTo(keys.heartbeats('', licenseKey), beat)
  expect(lost.status, JSON.stringify(lost.body)).toBe(200)
  expect(performance.now() - startedAt).toBeLessThan(1500)
  await Bun.sleep(200)
  expect(Number(await counter())).toBe(before + 1)
  expect((await beat()).status).toBe(200)
  expect(Number(await counter())).toBe(before + 2)
})
