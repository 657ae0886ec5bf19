import { afterAll, describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { licenses } from '../../src/db/schema'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_REDIS_URL } from '../support/helpers'
import { decode, hwid, insertLicense, nonce, updateLicense } from '../support/client'
import { type ServerProcess, startServer } from '../support/server-process'
import { until } from '../support/servers'
import { withOverrides } from '../support/overrides'

// Two server processes need a database both can open: PostgreSQL only (PGlite is single-process).
if (MODE === 'postgres') {
  describe('two server processes on one PostgreSQL and one Redis', async () => {
    const t = await makeTestApp()
    const env = { DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL! }
    const servers: ServerProcess[] = await Promise.all([startServer(env), startServer(env)])
    afterAll(() => Promise.all(servers.map((s) => s.stop())))
    const post = async (i: number, path: string, body: unknown) => {
      const res = await fetch(`${servers[i % 2]!.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      })
      return { status: res.status, body: (await res.json()) as any }
    }

    test('40 HWIDs racing at a 3-seat key bind exactly 3', async () => {
      const s = await t.seed({ credits: 1000 })
      const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
      const results = await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          post(i, '/auth/validate', { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }),
        ),
      )
      expect(results.filter((r) => r.status === 200)).toHaveLength(3)
      expect(results.filter((r) => r.body.error === 'hwid_mismatch')).toHaveLength(37)
      const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
      expect(row?.hwids).toHaveLength(3)
    })

    test('both instances share the limits: the 21st sandbox validate of one IP is limited', async () => {
      const s = await t.seed({ sandbox: true })
      const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
      const statuses: number[] = []
      for (let i = 0; i < 21; i++) {
        const body = { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }
        statuses.push((await post(i, '/auth/validate', body)).status)
      }
      expect(statuses.slice(0, 20).every((st) => st === 200)).toBe(true)
      expect(statuses[20]).toBe(429)
    })

    test('credits are never overspent across instances, and a nonce is used once across them', async () => {
      const s = await t.seed({ credits: 5 })
      const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
      const results = await Promise.all(
        Array.from({ length: 30 }, (_, i) =>
          post(i, '/auth/validate', { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }),
        ),
      )
      expect(results.filter((r) => r.status === 200)).toHaveLength(5)
      const s2 = await t.seed()
      const key2 = await insertLicense(t.ctx, s2.appId, { unlimitedHwidSlots: true })
      const body = { appId: s2.appId, appSecret: s2.appSecret, licenseKey: key2, hwid: hwid(), nonce: nonce() }
      const [a, b] = await Promise.all([post(0, '/auth/validate', body), post(1, '/auth/validate', body)])
      expect([a.status, b.status].sort()).toEqual([200, 401])
    })

    /** A license validated on the first instance whose session both instances' heartbeats accept. */
    const sessionOnBoth = async () => {
      const s = await t.seed()
      const licenseKey = await insertLicense(t.ctx, s.appId)
      const h = hwid()
      const v = await post(0, '/auth/validate', { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() })
      const token = decode(v.body.payload).sessionToken
      const beat = (i: number) => post(i, '/auth/heartbeat', { appId: s.appId, sessionToken: token, hwid: h })
      for (const i of [0, 1]) expect((await beat(i)).status).toBe(200)
      return { s, licenseKey, beat }
    }

    test('a revoke published by another process reaches the next heartbeat on either instance', async () => {
      const { licenseKey, beat } = await sessionOnBoth()
      await updateLicense(t.ctx, licenseKey, { status: 'revoked' })
      for (const i of [0, 1]) expect((await beat(i)).body.error).toBe('revoked')
    })

    test('a revoke made where Redis was unreachable reaches both instances within seconds, through their sweep', async () => {
      const { s, licenseKey, beat } = await sessionOnBoth()
      // A third instance whose every bump fails, as if cut off from Redis, and which never retries.
      const cutOff = await makeTestApp({ store: withOverrides(t.ctx.store, { bump: () => Promise.reject(new Error('store unreachable')) }) })
      const revoked = await cutOff.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
      expect(revoked.status, JSON.stringify(revoked.body)).toBe(200)
      for (const i of [0, 1]) expect((await until(() => beat(i), (r) => r.status !== 200, 10_000)).body.error).toBe('revoked')
    })
  })
}

test('two app instances with their own caches and mailboxes on one database bind exactly the seat count', async () => {
  const a = await makeTestApp()
  const b = await makeTestApp()
  const s = await a.seed({ credits: 1000 })
  const licenseKey = await insertLicense(a.ctx, s.appId, { maxHwidSlots: 3 })
  const results = await Promise.all(
    Array.from({ length: 40 }, (_, i) =>
      (i % 2 ? a : b).req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
      }),
    ),
  )
  expect(results.filter((r) => r.status === 200)).toHaveLength(3)
  expect(results.filter((r) => r.body.error === 'hwid_mismatch')).toHaveLength(37)
  const [row] = await a.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
  expect(row?.hwids).toHaveLength(3)
})
