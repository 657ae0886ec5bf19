import { beforeAll, describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { events, licenses } from '../../src/db/schema'
import { makeTestApp, type TestApp } from '../support/helpers'
import { decode, hwid, insertLicense, nonce } from '../support/client'

const errorBody = (error: string) => ({ error, message: expect.any(String) })

let t: TestApp
/** A second instance: its own actors and caches, the same database and store. */
let other: TestApp
beforeAll(async () => {
  t = await makeTestApp()
  other = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

const licenseRow = async (key: string) => (await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, key)))[0]!
const eventsOf = async (appId: string) =>
  (await t.ctx.database.db.select({ event: events.event }).from(events).where(eq(events.appId, appId))).map((e) => e.event)

async function login(on: TestApp, s: Seeded, licenseKey: string, device = hwid()) {
  const res = await on.req('POST', '/auth/validate', {
    body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: device, nonce: nonce() },
  })
  return { res, device, token: res.status === 200 ? (decode(res.body.payload).sessionToken as string) : '' }
}

const heartbeat = (on: TestApp, appId: string, session: { token: string; device: string }) =>
  on.req('POST', '/auth/heartbeat', { body: { appId, sessionToken: session.token, hwid: session.device } })

const release = (s: Seeded, licenseKey: string, device: string) =>
  t.req('DELETE', `/v1/licenses/${licenseKey}/hwids/${encodeURIComponent(device)}`, { apiKey: s.apiKey })

describe('DELETE /v1/licenses/:licenseKey/hwids/:hwid', () => {
  test("frees that device's seat: its heartbeat (on either instance) is session_expired, the others' are 200, and it validates back into the seat", async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const a = await login(t, s, licenseKey)
    const b = await login(other, s, licenseKey)
    expect([a.res.status, b.res.status]).toEqual([200, 200])
    // Both instances hold the license with both HWIDs bound.
    for (const on of [t, other]) for (const session of [a, b]) expect((await heartbeat(on, s.appId, session)).status).toBe(200)
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
      const beat = await heartbeat(on, s.appId, a)
      expect(beat.status).toBe(401)
      expect(beat.body).toEqual({ status: 'failed', error: 'session_expired' })
      expect((await heartbeat(on, s.appId, b)).status).toBe(200)
    }

    // The seat is free again: a third device could take it, and so can the released one.
    const back = await login(other, s, licenseKey, a.device)
    expect(back.res.status).toBe(200)
    expect((await licenseRow(licenseKey)).hwids).toEqual([b.device, a.device])
    expect((await heartbeat(t, s.appId, back)).status).toBe(200)
  })

  test('an HWID with URL-special characters is released by its encoded path', async () => {
    const s = await t.seed()
    const device = 'dev/1 ä?#%'
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: [device, 'other'], maxHwidSlots: 2 })
    const res = await release(s, licenseKey, device)
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect((await licenseRow(licenseKey)).hwids).toEqual(['other'])
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
