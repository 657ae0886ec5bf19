import { afterAll, expect, test } from 'bun:test'
import { createServer } from 'node:net'
import { RedisStore } from '../src/store/redis'
import { makeTestApp } from './helpers'
import { decode, hwid, insertLicense, nonce } from './client-helpers'

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port
      srv.close(() => resolve(port))
    })
  })
}

function startRedis(port: number) {
  return Bun.spawn(['redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdout: 'ignore',
    stderr: 'ignore',
  })
}

async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await fn()
    if (ok(v) || Date.now() > deadline) return v
    await Bun.sleep(100)
  }
}

const port = await freePort()
let redis = startRedis(port)
const store = new RedisStore(`redis://127.0.0.1:${port}`)
afterAll(async () => {
  await store.close()
  redis.kill()
})

const t = await makeTestApp({ store })

test('Redis unreachable: validate fails closed, heartbeat fails open, /readyz is 503, all recover when it returns', async () => {
  await until(() => store.ping(), (up) => up)
  const s = await t.seed()
  const licenseKey = await insertLicense(t.deps, s.appId)
  const h = hwid()
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const first = await validate()
  expect(first.status, JSON.stringify(first.body)).toBe(200)
  const token = decode(first.body.payload).sessionToken
  const beat = () => t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })

  redis.kill()
  await redis.exited
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

  redis = startRedis(port)
  const back = await until(validate, (r) => r.status === 200)
  expect(back.status).toBe(200)
  expect((await beat()).status).toBe(200)
  expect((await t.req('GET', '/readyz')).status).toBe(200)
})
