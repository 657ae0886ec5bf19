import { expect, test } from 'bun:test'
import { and, eq, sql } from 'drizzle-orm'
import { events, webhooks } from '../../src/db/schema'
import { makeTestApp } from '../support/helpers'
import { appEpochKey, hwid, insertLicense, nonce } from '../support/client'

test('validate emits license.hwid_bound for a new HWID, and license.validated only for a subscribed app', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const h = hwid()
  const login = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  const of = async (name: string) => {
    await t.ctx.validatedEvents.flush()
    return t.ctx.database.db
      .select()
      .from(events)
      .where(and(eq(events.appId, s.appId), eq(events.event, name), sql`${events.data}->>'licenseKey' = ${licenseKey}`))
  }

  expect((await login()).status).toBe(200)
  expect((await login()).status).toBe(200)
  const bound = await of('license.hwid_bound')
  expect(bound).toHaveLength(1)
  expect(bound[0]?.data).toEqual({ licenseKey, appId: s.appId, hwid: h })
  expect(await of('license.validated')).toHaveLength(0)

  await t.ctx.database.db.insert(webhooks).values({
    id: `wh_test${Date.now()}`,
    appId: s.appId,
    url: 'https://127.0.0.1:9/hook',
    events: ['license.validated'],
    secretEnc: t.ctx.sealer.seal('whsec_test'),
  })
  await t.ctx.store.bump([await appEpochKey(t.ctx, s.appId)])
  expect((await login()).status).toBe(200)
  const validated = await of('license.validated')
  expect(validated).toHaveLength(1)
  expect(validated[0]?.data).toEqual({ licenseKey, appId: s.appId, status: 'active', hwid: h })
})
