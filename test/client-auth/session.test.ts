import { describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { apps, licenses } from '../../src/db/schema'
import { makeTestApp } from '../support/helpers'
import { appEpochKey, decode, hwid, insertLicense, licenseEpochKey, nonce, tokenExp, updateLicense, verifySigned } from '../support/client'

describe('POST /auth/heartbeat and /auth/selfban', async () => {
  const t = await makeTestApp()
  const s = await t.seed()

  async function login(opts: Partial<typeof licenses.$inferInsert> = {}, ttlSeconds?: number) {
    const licenseKey = await insertLicense(t.ctx, s.appId, opts)
    const h = hwid()
    const res = await t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce(), ttlSeconds },
    })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    return { licenseKey, hwid: h, token: decode(res.body.payload).sessionToken as string }
  }
  const beat = (token: string, h: string, extra: Record<string, unknown> = {}) =>
    t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h, ...extra } })

  test('returns a signed payload with a fresh token of the same lifetime and echoes the nonce', async () => {
    const session = await login({}, 7200)
    const n = nonce()
    const res = await beat(session.token, session.hwid, { nonce: n })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(verifySigned(res.body, s.publicKey)).toBe(true)
    const p = decode(res.body.payload)
    expect(p.nonce).toBe(n)
    expect(p.sessionToken).not.toBe('')
    expect(tokenExp(p.sessionToken) - Math.floor(Date.now() / 1000)).toBeWithin(7199, 7202)
    const next = await beat(p.sessionToken, session.hwid)
    expect(next.status).toBe(200)
    expect(decode(next.body.payload).nonce).toBeUndefined()
  })

  test("a session ends no later than its license, however long its lifetime; the lifetime is kept for the heartbeats after an extension", async () => {
    // An SDK heartbeating locally reads exp alone: a 7-day session of a license ending in 10 minutes
    // would run on for 7 days without asking again.
    const endsAt = new Date(Date.now() + 600_000)
    const session = await login({ expiresAt: endsAt }, 604_800)
    const ends = Math.ceil(endsAt.getTime() / 1000)
    const first = await t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey: session.licenseKey, hwid: session.hwid, nonce: nonce(), ttlSeconds: 604_800 },
    })
    const validated = decode(first.body.payload)
    expect([validated.expiresIn, tokenExp(validated.sessionToken)]).toEqual([ends, ends])
    expect(validated.sessionExpiresAt).toBe(new Date(ends * 1000).toISOString())
    const beaten = decode((await beat(session.token, session.hwid)).body.payload)
    expect([beaten.expiresIn, tokenExp(beaten.sessionToken)]).toEqual([ends, ends])
    // Extended: the next heartbeat's session has its full lifetime again.
    await updateLicense(t.ctx, session.licenseKey, { expiresAt: new Date(Date.now() + 30 * 86_400_000) })
    const extended = decode((await beat(beaten.sessionToken, session.hwid)).body.payload)
    expect(extended.expiresIn - Math.floor(Date.now() / 1000)).toBeWithin(604_799, 604_802)
  })

  test('a token bound to another HWID or app, tampered or expired, is session_expired', async () => {
    const session = await login()
    expect((await beat(session.token, hwid())).body.error).toBe('session_expired')
    const other = await t.seed()
    const foreign = await t.req('POST', '/auth/heartbeat', {
      body: { appId: other.appId, sessionToken: session.token, hwid: session.hwid },
    })
    expect(foreign.body.error).toBe('session_expired')
    const [body, mac] = session.token.split('.')
    const claims = JSON.parse(Buffer.from(body!, 'base64url').toString())
    claims.exp += 10_000
    const forged = `${Buffer.from(JSON.stringify(claims)).toString('base64url')}.${mac}`
    const res = await beat(forged, session.hwid)
    expect(res.status).toBe(401)
    expect(res.body.error).toBe('session_expired')

    const later = await makeTestApp({ clock: () => Date.now() + 86_401_000 })
    const expired = await later.req('POST', '/auth/heartbeat', {
      body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid },
    })
    expect(expired.body.error).toBe('session_expired')
  })

  test('a session that ended with its license is answered expired (410), as a heartbeat before the end would be', async () => {
    const session = await login({ expiresAt: new Date(Date.now() + 60_000) }, 7200)
    const later = await makeTestApp({ clock: () => Date.now() + 61_000 })
    const res = await later.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid } })
    expect(res.status).toBe(410)
    expect(res.body).toEqual({ status: 'failed', error: 'expired' })
    // Extended since: the session still ended, and its client logs in again.
    await updateLicense(t.ctx, session.licenseKey, { expiresAt: new Date(Date.now() + 86_400_000) })
    const extended = await later.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid } })
    expect(extended.body).toEqual({ status: 'failed', error: 'session_expired' })
    // Only a token of ours, for that app and HWID, is read past its end.
    const other = await later.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: session.token, hwid: hwid() } })
    expect(other.body).toEqual({ status: 'failed', error: 'session_expired' })
  })

  test('a session that ended with its license is answered for its app and lists first, as a live one is', async () => {
    const session = await login({ expiresAt: new Date(Date.now() + 60_000) }, 7200)
    const later = await makeTestApp({ clock: () => Date.now() + 61_000 })
    const setApp = async (set: Partial<typeof apps.$inferInsert>) => {
      await t.ctx.database.db.update(apps).set(set).where(eq(apps.id, s.appId))
      await t.ctx.store.bump([await appEpochKey(t.ctx, s.appId)])
    }
    const ended = () => later.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid } })
    try {
      await setApp({ disabled: true })
      expect([(await ended()).status, (await ended()).body]).toEqual([403, { status: 'failed', error: 'app_disabled' }])
      await setApp({ disabled: false, hwidBlacklist: [session.hwid] })
      expect([(await ended()).status, (await ended()).body]).toEqual([403, { status: 'failed', error: 'blocked' }])
    } finally {
      await setApp({ disabled: false, hwidBlacklist: [] })
    }
    expect((await ended()).body).toEqual({ status: 'failed', error: 'expired' })
  })

  test('revoke, expiry, delete and HWID reset fail at the very next heartbeat', async () => {
    const a = await login()
    await updateLicense(t.ctx, a.licenseKey, { status: 'revoked' })
    expect((await beat(a.token, a.hwid)).body).toEqual({ status: 'failed', error: 'revoked' })

    const b = await login()
    await updateLicense(t.ctx, b.licenseKey, { expiresAt: new Date(Date.now() - 1) })
    expect((await beat(b.token, b.hwid)).status).toBe(410)

    const c = await login()
    await updateLicense(t.ctx, c.licenseKey, { hwids: [] })
    expect((await beat(c.token, c.hwid)).body.error).toBe('session_expired')

    const d = await login()
    await t.ctx.database.db.delete(licenses).where(eq(licenses.key, d.licenseKey))
    await t.ctx.store.bump([await licenseEpochKey(t.ctx, s.appId, d.licenseKey)])
    expect((await beat(d.token, d.hwid)).body.error).toBe('invalid_key')
  })

  test('a session survives a restart: another instance with the same master key accepts it', async () => {
    const session = await login()
    const restarted = await makeTestApp()
    const res = await restarted.req('POST', '/auth/heartbeat', {
      body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid },
    })
    expect(res.status).toBe(200)
  })

  test('lists are applied in the spec order, on heartbeat as well', async () => {
    const session = await login()
    const setLists = async (set: Partial<typeof apps.$inferInsert>) => {
      await t.ctx.database.db.update(apps).set(set).where(eq(apps.id, s.appId))
      await t.ctx.store.bump([await appEpochKey(t.ctx, s.appId)])
    }
    // In-process requests have no socket peer: the client IP is the unknown address 0.0.0.0.
    await setLists({ hwidBlacklist: [session.hwid] })
    expect((await beat(session.token, session.hwid)).body).toEqual({ status: 'failed', error: 'blocked' })
    await setLists({ hwidBlacklist: [], hwidWhitelist: [session.hwid], ipWhitelist: ['10.0.0.1'] })
    expect((await beat(session.token, session.hwid)).status).toBe(403)
    await setLists({ ipWhitelist: ['0.0.0.0'] })
    expect((await beat(session.token, session.hwid)).status).toBe(200)
    await setLists({ ipBlacklist: ['0.0.0.0'] })
    expect((await beat(session.token, session.hwid)).body.error).toBe('blocked')
    await setLists({ ipBlacklist: [], ipWhitelist: [], hwidWhitelist: [] })
    expect((await beat(session.token, session.hwid)).status).toBe(200)
  })

  test('pre-session selfban blacklists by default and refuses revokeLicense', async () => {
    const app = await t.seed()
    const licenseKey = await insertLicense(t.ctx, app.appId)
    const h = hwid()
    const pre = (extra: Record<string, unknown> = {}) =>
      t.req('POST', '/auth/selfban', {
        body: { appId: app.appId, appSecret: app.appSecret, licenseKey, hwid: h, nonce: nonce(), ...extra },
      })
    const refused = await pre({ revokeLicense: true })
    expect(refused.status).toBe(403)
    expect(refused.body.error).toBe('revoke_requires_session')
    const res = await pre({ blacklistIp: false })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body).toEqual({
      status: 'success',
      mode: 'pre_session',
      performed: { revokeLicense: false, blacklistHwid: true, blacklistIp: false },
    })
    const [row] = await t.ctx.database.db.select().from(apps).where(eq(apps.id, app.appId))
    expect(row?.hwidBlacklist).toEqual([h])
    expect(row?.ipBlacklist).toEqual([])
    const [lic] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
    expect(lic?.status).toBe('active')
    expect((await pre()).body.performed).toEqual({ revokeLicense: false, blacklistHwid: false, blacklistIp: true })
    expect((await pre({ appSecret: 'wrong-secret' })).body.error).toBe('invalid_app')
    expect((await pre({ nonce: undefined })).body.error).toBe('bad_request')
  })

  test('post-session selfban revokes by default and the next heartbeat fails', async () => {
    const session = await login()
    const res = await t.req('POST', '/auth/selfban', {
      body: { appId: s.appId, sessionToken: session.token, hwid: session.hwid, blacklistHwid: false, blacklistIp: false },
    })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body).toEqual({
      status: 'success',
      mode: 'post_session',
      performed: { revokeLicense: true, blacklistHwid: false, blacklistIp: false },
    })
    expect((await beat(session.token, session.hwid)).body.error).toBe('revoked')
    const bad = await t.req('POST', '/auth/selfban', { body: { appId: s.appId, sessionToken: 'x.y', hwid: session.hwid } })
    expect(bad.body.error).toBe('session_expired')
  })

  test("a session whose seat was released or reset can no longer selfban: the seat may be another device's by now", async () => {
    for (const freeSeat of [
      (key: string, h: string) => t.req('DELETE', `/v1/licenses/${key}/hwids/${h}`, { apiKey: s.apiKey }),
      (key: string) => t.req('PUT', `/v1/licenses/${key}`, { apiKey: s.apiKey, body: { action: 'reset-hwid' } }),
    ]) {
      const old = await login({ maxHwidSlots: 1 })
      expect((await freeSeat(old.licenseKey, old.hwid)).status).toBe(200)
      // Another device takes the seat.
      const taken = await t.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey: old.licenseKey, hwid: hwid(), nonce: nonce() },
      })
      expect(taken.status, JSON.stringify(taken.body)).toBe(200)
      const [before] = await t.ctx.database.db.select({ hwidBlacklist: apps.hwidBlacklist }).from(apps).where(eq(apps.id, s.appId))
      const res = await t.req('POST', '/auth/selfban', { body: { appId: s.appId, sessionToken: old.token, hwid: old.hwid } })
      expect(res.body).toEqual({ status: 'failed', error: 'session_expired' })
      const [row] = await t.ctx.database.db.select({ status: licenses.status }).from(licenses).where(eq(licenses.key, old.licenseKey))
      expect(row?.status).toBe('active')
      const [after] = await t.ctx.database.db.select({ hwidBlacklist: apps.hwidBlacklist }).from(apps).where(eq(apps.id, s.appId))
      expect(after?.hwidBlacklist).toEqual(before?.hwidBlacklist ?? [])
    }
  })

  test('selfban on the sandbox app succeeds and changes nothing', async () => {
    const sandbox = await t.seed({ sandbox: true })
    const licenseKey = await insertLicense(t.ctx, sandbox.appId)
    const h = hwid()
    const v = await t.req('POST', '/auth/validate', {
      body: { appId: sandbox.appId, appSecret: sandbox.appSecret, licenseKey, hwid: h, nonce: nonce() },
    })
    const token = decode(v.body.payload).sessionToken
    for (const body of [
      { appId: sandbox.appId, appSecret: sandbox.appSecret, licenseKey, hwid: h, nonce: nonce() },
      { appId: sandbox.appId, sessionToken: token, hwid: h },
    ]) {
      const res = await t.req('POST', '/auth/selfban', { body })
      expect(res.status).toBe(200)
      expect(res.body.performed).toEqual({ revokeLicense: false, blacklistHwid: false, blacklistIp: false })
    }
    const [row] = await t.ctx.database.db.select().from(apps).where(eq(apps.id, sandbox.appId))
    expect(row?.hwidBlacklist).toEqual([])
    const [lic] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
    expect(lic?.status).toBe('active')
  })
})
