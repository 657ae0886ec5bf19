import { afterAll, describe, expect, test } from 'bun:test'
import { and, eq } from 'drizzle-orm'
import { openDb } from '../../src/db/client'
import { accounts, events, licenses } from '../../src/db/schema'
import { startDispatcher } from '../../src/delivery/dispatcher'
import { makeTestApp, MODE } from '../support/helpers'
import { withOverrides } from '../support/overrides'
import { addCredits } from '../../src/accounts/service'
import { hwid, insertLicense, nonce } from '../support/client'
import { startReceiver, testCertificate } from '../support/webhooks-receiver'
import { ownPostgres, until } from '../support/servers'

// Embedded PGlite runs in this process and cannot be stopped; test/delivery/validated-events.test.ts covers
// the same retry path there with a write that fails the way an unreachable server does.
if (MODE === 'postgres') {
  describe('PostgreSQL stopped and started again', async () => {
    const pg = await ownPostgres()
    const database = await openDb({ databaseUrl: pg.url, dataDir: null })
    const t = await makeTestApp({ database, env: { NODE_EXTRA_CA_CERTS: testCertificate().certFile } })
    const receiver = startReceiver()
    const dispatcher = startDispatcher(t.ctx, { pollMs: 50 })
    afterAll(async () => {
      await dispatcher.stop()
      await receiver.stop()
      await t.ctx.webhookPool.close()
      await database.close()
      await pg.destroy()
    })

    test('every validate that answered 200 meanwhile has its license.validated event, delivered; a seat bind fails alone and applies nothing', async () => {
      const s = await t.seed()
      const hook = await t.req('POST', `/v1/apps/${s.appId}/webhooks`, {
        apiKey: s.apiKey,
        body: { url: receiver.url('/validated'), events: ['license.validated'], enabled: true },
      })
      expect(hook.status, JSON.stringify(hook.body)).toBe(201)
      const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
      const [bound, unbound] = [hwid(), hwid()]
      const validate = (h: string) =>
        t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
      const first = await validate(bound)
      expect(first.status, JSON.stringify(first.body)).toBe(200)
      await until(async () => receiver.at('/validated').length, (n) => n === 1)

      await pg.stop()
      const during = await Promise.all(Array.from({ length: 30 }, () => validate(bound)))
      expect(during.map((r) => r.status)).toEqual(during.map(() => 200))
      // A new HWID needs the database: that request alone fails, in the public shape.
      const bind = await validate(unbound)
      expect(bind.status).toBe(500)
      expect(bind.body).toEqual({ status: 'failed', error: 'system_error' })
      expect((await validate(bound)).status).toBe(200)
      // Longer than a batch wait and several retries: the events are kept, not dropped.
      await Bun.sleep(500)

      await pg.start()
      const validatedRows = () =>
        t.ctx.database.db
          .select({ id: events.id })
          .from(events)
          .where(and(eq(events.appId, s.appId), eq(events.event, 'license.validated')))
      expect(await until(async () => (await validatedRows()).length, (n) => n >= 32)).toBe(32)
      expect(await until(async () => receiver.at('/validated').length, (n) => n >= 32)).toBe(32)
      const [row] = await t.ctx.database.db.select({ hwids: licenses.hwids }).from(licenses).where(eq(licenses.key, licenseKey))
      expect(row?.hwids).toEqual([bound])
      const rebind = await validate(unbound)
      expect(rebind.status, JSON.stringify(rebind.body)).toBe(200)
    })

    test('credits added just before PostgreSQL stops are answered with the balance committed, not as a failure the operator would repeat', async () => {
      const s = await t.seed({ credits: 10 })
      let stopAfterCommit = true
      // The add's first store call after its COMMIT: the live balance's seed.
      const store = withOverrides(t.ctx.store, {
        creditState: async (accountId: string) => {
          if (stopAfterCommit) {
            stopAfterCommit = false
            await pg.stop()
          }
          return t.ctx.store.creditState(accountId)
        },
      })
      const adding = await makeTestApp({ database, store })
      try {
        expect(await addCredits(adding.ctx, s.accountId, 100)).toEqual({ accountId: s.accountId, credits: 110 })
      } finally {
        await pg.start()
        await adding.ctx.webhookPool.close()
      }
      const [row] = await database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, s.accountId))
      expect(row?.credits).toBe(110)
    })
  })
}
