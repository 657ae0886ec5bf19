/**
 * PostgreSQL finds an app under any spelling of its UUID; the client endpoints and the Developer API
 * must all reach the one actor the app has, or a spelling would escape the app's changes and nonces.
 */
import { expect, test } from 'bun:test'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'

const t = await makeTestApp()

test('an upper-case app id sees a ban made after it was cached, and reaches the same actor', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 5 })
  const device = hwid()
  const upper = s.appId.toUpperCase()
  const validate = (appId: string) =>
    t.req('POST', '/auth/validate', { body: { appId, appSecret: s.appSecret, licenseKey, hwid: device, nonce: nonce() } })
  expect((await validate(upper)).status).toBe(200)
  expect(t.ctx.actors.existing(upper)).toBeUndefined()
  expect(t.ctx.actors.existing(s.appId)?.app?.value?.id).toBe(s.appId)
  const ban = await t.req('POST', `/v1/apps/${s.appId}/security/blacklist`, { apiKey: s.apiKey, body: { type: 'hwid', value: device } })
  expect(ban.status).toBe(200)
  const after = await validate(upper)
  expect(after.status, JSON.stringify(after.body)).toBe(403)
  expect(after.body.error).toBe('blocked')
})

test('a nonce used under one spelling of the app id is a replay under another', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const sent = { appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }
  expect((await t.req('POST', '/auth/validate', { body: { ...sent, appId: s.appId } })).status).toBe(200)
  const replay = await t.req('POST', '/auth/validate', { body: { ...sent, appId: s.appId.toUpperCase() } })
  expect(replay.status).toBe(401)
  expect(replay.body.error).toBe('replay_detected')
})

test('a webhook created under an upper-case path reaches the cached app: license.validated events start at once', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const device = hwid()
  const validate = () =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: device, nonce: nonce() } })
  expect((await validate()).status).toBe(200)
  const created = await t.req('POST', `/v1/apps/${s.appId.toUpperCase()}/webhooks`, {
    apiKey: s.apiKey,
    body: { url: 'https://127.0.0.1:9/hook', events: ['license.validated'] },
  })
  expect(created.status, JSON.stringify(created.body)).toBe(201)
  expect(created.body.appId).toBe(s.appId)
  await t.ctx.validatedEvents.flush()
  const before = t.ctx.validatedEvents.kept
  expect((await validate()).status).toBe(200)
  expect(t.ctx.validatedEvents.kept - before).toBe(1)
})
