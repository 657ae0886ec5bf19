import { beforeAll, describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { apps, events, licenses } from '../../src/db/schema'
import { sha256Hex } from '../../src/lib/crypto'
import { makeTestApp, type TestApp } from '../support/helpers'
import { heartbeatOn, hwid, insertLicense, nonce, validateOn } from '../support/client'

const errorBody = (error: string) => ({ error, message: expect.any(String) })
const failed = (error: string) => ({ status: 'failed', error })

let t: TestApp
/** A second instance: its own actors and caches, the same database and store. */
let other: TestApp
beforeAll(async () => {
  t = await makeTestApp()
  other = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

const appRow = async (appId: string) => (await t.ctx.database.db.select().from(apps).where(eq(apps.id, appId)))[0]!

/** A validated session on `on` (which caches the app and the license there). */

const selfban = (on: TestApp, s: Seeded, licenseKey: string) =>
  on.req('POST', '/auth/selfban', {
    body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce(), blacklistHwid: false, blacklistIp: false },
  })

const patch = (s: Seeded, body: unknown, appId = s.appId) => t.req('PATCH', `/v1/apps/${appId}`, { apiKey: s.apiKey, body })

describe('PATCH /v1/apps/:appId', () => {
  test('renames the app and answers with the app record; the listing shows it', async () => {
    const s = await t.seed()
    const res = await patch(s, { name: 'Renamed' })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body).toEqual({ appId: s.appId, name: 'Renamed', sandbox: false, disabled: false, createdAt: s.createdAt })
    const list = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    expect(list.body.apps).toEqual([res.body])
  })

  test('disabled: every client call gets 403 app_disabled at once, here and on an instance that cached the app; re-enabled: 200', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const here = await validateOn(t, s, licenseKey)
    const there = await validateOn(other, s, licenseKey)
    expect([here.res.status, there.res.status]).toEqual([200, 200])

    const res = await patch(s, { disabled: true })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body).toMatchObject({ appId: s.appId, name: 'Test app', disabled: true })
    expect((await appRow(s.appId)).disabled).toBe(true)
    for (const [on, session] of [[t, here], [other, there]] as const) {
      const again = await validateOn(on, s, licenseKey, session.device)
      expect(again.res.status).toBe(403)
      expect(again.res.body).toEqual(failed('app_disabled'))
      const beat = await heartbeatOn(on, s.appId, session)
      expect(beat.status).toBe(403)
      expect(beat.body).toEqual(failed('app_disabled'))
      const banned = await selfban(on, s, licenseKey)
      expect(banned.status).toBe(403)
      expect(banned.body).toEqual(failed('app_disabled'))
    }
    const listed = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    expect(listed.body.apps[0]).toMatchObject({ appId: s.appId, disabled: true })

    expect((await patch(s, { disabled: false })).body.disabled).toBe(false)
    for (const [on, session] of [[t, here], [other, there]] as const) {
      expect((await validateOn(on, s, licenseKey, session.device)).res.status).toBe(200)
      expect((await heartbeatOn(on, s.appId, session)).status).toBe(200)
    }
  })

  test('name and disabled together', async () => {
    const s = await t.seed()
    const res = await patch(s, { name: 'Both', disabled: true })
    expect(res.body).toMatchObject({ name: 'Both', disabled: true })
    expect(await appRow(s.appId)).toMatchObject({ name: 'Both', disabled: true })
  })

  describe.each([
    ['empty body', {}],
    ['no body', undefined],
    ['null body', null],
    ['an array', []],
    ['an unknown field', { name: 'x', sandbox: true }],
    ['empty name', { name: '' }],
    ['name of 129 characters', { name: 'n'.repeat(129) }],
    ['name not a string', { name: 7 }],
    ['name null', { name: null }],
    ['disabled as text', { disabled: 'true' }],
    ['disabled as a number', { disabled: 1 }],
    ['name with a NUL', { name: 'a\u0000b' }],
  ])('400 bad_request: %s', (_name, body) => {
    test('changes nothing', async () => {
      const s = await t.seed()
      const before = await appRow(s.appId)
      const res = await patch(s, body)
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      expect(await appRow(s.appId)).toEqual(before)
    })
  })

  test('the message of an empty body says a field is needed', async () => {
    const s = await t.seed()
    expect((await patch(s, {})).body.message).toBe('The body must hold at least one field')
  })
})

describe('POST /v1/apps/:appId/secret', () => {
  test('a new secret works, the old one is invalid_app at once (also on an instance that cached the app), and only its hash is stored', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const session = await validateOn(t, s, licenseKey)
    expect((await validateOn(other, s, licenseKey)).res.status).toBe(200)

    const res = await t.req('POST', `/v1/apps/${s.appId}/secret`, { apiKey: s.apiKey })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body).toEqual({ appSecret: expect.any(String) })
    const { appSecret } = res.body
    expect(appSecret).not.toBe(s.appSecret)
    expect(Buffer.from(appSecret, 'base64url').length).toBeGreaterThanOrEqual(16)

    const row = await appRow(s.appId)
    expect(row.secretHash).toBe(sha256Hex(appSecret))
    expect(JSON.stringify(row)).not.toContain(appSecret)

    for (const on of [t, other]) {
      const old = await validateOn(on, s, licenseKey)
      expect(old.res.status).toBe(401)
      expect(old.res.body).toEqual(failed('invalid_app'))
      expect((await validateOn(on, { appId: s.appId, appSecret }, licenseKey)).res.status).toBe(200)
    }
    // A session issued under the old secret is not a secret: it lives on.
    expect((await heartbeatOn(t, s.appId, session)).status).toBe(200)
    const listed = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    expect(JSON.stringify(listed.body)).not.toContain(appSecret)
  })

  test('a body with a field is 400 naming it, and the secret is not rotated; an empty object rotates it', async () => {
    const s = await t.seed()
    const before = await appRow(s.appId)
    // 'null' and '""': JSON values that are no object, not the empty body they once passed for.
    for (const body of [{ appSecret: 'mine' }, [1], 'text', 'null', '""']) {
      const res = await t.req('POST', `/v1/apps/${s.appId}/secret`, { apiKey: s.apiKey, body })
      expect(res.status).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
    }
    const named = await t.req('POST', `/v1/apps/${s.appId}/secret`, { apiKey: s.apiKey, body: { appSecret: 'mine' } })
    expect(named.body.message).toContain('"appSecret"')
    expect(await appRow(s.appId)).toEqual(before)
    const res = await t.req('POST', `/v1/apps/${s.appId}/secret`, { apiKey: s.apiKey, body: {} })
    expect(res.status).toBe(201)
    const { secretHash: _after, ...rest } = await appRow(s.appId)
    const { secretHash: _before, ...restBefore } = before
    expect(rest).toEqual(restBefore)
  })
})

test.each([
  ["another account's app", (o: Seeded) => o.appId],
  ['an absent app', () => '00000000-0000-4000-8000-000000000000'],
  ['an appId that is not a UUID', () => 'x'],
])('403 forbidden on PATCH and secret rotation for %s, and nothing changes', async (_name, appIdOf) => {
  const s = await t.seed()
  const o = await t.seed()
  const before = await appRow(o.appId)
  const renamed = await patch(s, { name: 'Mine now', disabled: true }, appIdOf(o))
  expect(renamed.status).toBe(403)
  expect(renamed.body).toEqual(errorBody('forbidden'))
  const rotated = await t.req('POST', `/v1/apps/${appIdOf(o)}/secret`, { apiKey: s.apiKey })
  expect(rotated.status).toBe(403)
  expect(rotated.body).toEqual(errorBody('forbidden'))
  expect(await appRow(o.appId)).toEqual(before)
})

test('401 invalid_api_key on the new app routes', async () => {
  const s = await t.seed()
  const before = await appRow(s.appId)
  expect((await t.req('PATCH', `/v1/apps/${s.appId}`, { body: { disabled: true } })).status).toBe(401)
  expect((await t.req('POST', `/v1/apps/${s.appId}/secret`)).status).toBe(401)
  expect(await appRow(s.appId)).toEqual(before)
})

const licenseRow = async (key: string) => (await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, key)))[0]!
const eventsOf = async (appId: string) =>
  (await t.ctx.database.db.select({ event: events.event }).from(events).where(eq(events.appId, appId))).map((e) => e.event)


const release = (s: Seeded, licenseKey: string, device: string) =>
  t.req('DELETE', `/v1/licenses/${licenseKey}/hwids/${encodeURIComponent(device)}`, { apiKey: s.apiKey })

describe('DELETE /v1/licenses/:licenseKey/hwids/:hwid', () => {
  test("frees that device's seat: its heartbeat (on either instance) is session_expired, the others' are 200, and it validates back into the seat", async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const a = await validateOn(t, s, licenseKey)
    const b = await validateOn(other, s, licenseKey)
    expect([a.res.status, b.res.status]).toEqual([200, 200])
    // Both instances hold the license with both HWIDs bound.
    for (const on of [t, other]) for (const session of [a, b]) expect((await heartbeatOn(on, s.appId, session)).status).toBe(200)
    const eventsBefore = await eventsOf(s.appId)

    const res = await release(s, licenseKey, a.device)
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    const view = await t.req('GET', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey })
    expect(res.body).toEqual(view.body)
    expect(res.body).toMatchObject({ licenseKey, hwidList: [b.device], hwid: b.device })
    expect((await licenseRow(licenseKey)).hwids).toEqual([b.device])
    // No event: the spec's list has none for one released seat.
    expect(await eventsOf(s.appId)).toEqual(eventsBefore)

    for (const on of [t, other]) {
      const beat = await heartbeatOn(on, s.appId, a)
      expect(beat.status).toBe(401)
      expect(beat.body).toEqual({ status: 'failed', error: 'session_expired' })
      expect((await heartbeatOn(on, s.appId, b)).status).toBe(200)
    }

    // The seat is free again: a third device could take it, and so can the released one.
    const back = await validateOn(other, s, licenseKey, a.device)
    expect(back.res.status).toBe(200)
    expect((await licenseRow(licenseKey)).hwids).toEqual([b.device, a.device])
    expect((await heartbeatOn(t, s.appId, back)).status).toBe(200)
  })

  test('an HWID with URL-special characters is released by its encoded path', async () => {
    const s = await t.seed()
    const device = 'dev/1 ä?#%'
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: [device, 'other'], maxHwidSlots: 2 })
    const res = await release(s, licenseKey, device)
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect((await licenseRow(licenseKey)).hwids).toEqual(['other'])
  })

  test('an HWID of `..` or `.` is never released through its parent path: strict paths make it a 404, the license stays', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['..', '.', 'keep'], maxHwidSlots: 3 })
    for (const device of ['..', '.']) {
      // The URL parser collapses the segment: this is DELETE /v1/licenses/<key>/ on the wire.
      const res = await release(s, licenseKey, device)
      expect(res.status, device).toBe(404)
    }
    const slash = await t.req('DELETE', `/v1/licenses/${licenseKey}/`, { apiKey: s.apiKey })
    expect(slash.status).toBe(404)
    expect((await licenseRow(licenseKey)).hwids).toEqual(['..', '.', 'keep'])
  })

  test('a DELETE with a body field is 400 naming it, and nothing is released or deleted', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['bound'] })
    const released = await t.req('DELETE', `/v1/licenses/${licenseKey}/hwids/bound`, { apiKey: s.apiKey, body: { all: true } })
    expect(released.status).toBe(400)
    expect(released.body.message).toContain('"all"')
    const deleted = await t.req('DELETE', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { force: true } })
    expect(deleted.status).toBe(400)
    expect((await licenseRow(licenseKey)).hwids).toEqual(['bound'])
  })

  test('404 not_found for an HWID that is not bound, and nothing changes', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['bound'], maxHwidSlots: 2 })
    const before = await licenseRow(licenseKey)
    for (const device of ['unbound', 'BOUND', 'boun']) {
      const res = await release(s, licenseKey, device)
      expect(res.status, device).toBe(404)
      expect(res.body).toEqual(errorBody('not_found'))
    }
    expect(await licenseRow(licenseKey)).toEqual(before)
  })

  test('400 for an HWID longer than 128 characters; 128 is a plain 404 when not bound', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['bound'] })
    const long = await release(s, licenseKey, 'h'.repeat(129))
    expect(long.status).toBe(400)
    expect(long.body).toEqual(errorBody('bad_request'))
    expect((await release(s, licenseKey, 'h'.repeat(128))).status).toBe(404)
    expect((await licenseRow(licenseKey)).hwids).toEqual(['bound'])
  })

  test("404 for an absent key, 403 for another account's license, 401 without a key; nothing changes", async () => {
    const s = await t.seed()
    const o = await t.seed()
    const theirs = await insertLicense(t.ctx, o.appId, { hwids: ['bound'] })
    const absent = await release(s, 'AAAA-BBBB-CCCC-DDDD', 'bound')
    expect(absent.status).toBe(404)
    expect(absent.body).toEqual(errorBody('not_found'))
    expect((await release(s, 'not-a-key', 'bound')).status).toBe(404)
    const foreign = await release(s, theirs, 'bound')
    expect(foreign.status).toBe(403)
    expect(foreign.body).toEqual(errorBody('forbidden'))
    const anonymous = await t.req('DELETE', `/v1/licenses/${theirs}/hwids/bound`)
    expect(anonymous.status).toBe(401)
    expect((await licenseRow(theirs)).hwids).toEqual(['bound'])
  })
})
