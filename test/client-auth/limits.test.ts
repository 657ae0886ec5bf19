import { describe, expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'
import { decode, hwid, insertLicense, nonce } from '../support/client'

/** A clock the test moves by hand. */
function manualClock(start: number) {
  let now = start
  return { now: () => now, advance: (ms: number) => void (now += ms), set: (ms: number) => void (now = ms) }
}

// In-process requests have no socket peer; trusting the unknown peer lets each test pick its client IP.
const env = { TRUSTED_PROXIES: '0.0.0.0' }

describe('public endpoint limits', async () => {
  const clock = manualClock(Date.parse('2031-05-04T12:00:00.000Z'))
  const t = await makeTestApp({ clock: clock.now, env: { ...env, VALIDATE_LIMIT_PER_IP: '5', SELFBAN_LIMIT_PER_LICENSE: '3' } })
  const send = (path: string, body: unknown, ip = '198.51.100.7') =>
    t.req('POST', path, { body, headers: { 'x-forwarded-for': ip } })
  const validateBody = (s: { appId: string; appSecret: string }, licenseKey: string, h = hwid()) => ({
    appId: s.appId,
    appSecret: s.appSecret,
    licenseKey,
    hwid: h,
    nonce: nonce(),
  })

  test('sandbox validate: the 21st request of an IP within a minute is limited, one token refills in 3 s', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 20; i++) expect((await send('/auth/validate', validateBody(s, key))).status).toBe(200)
    const limited = await send('/auth/validate', validateBody(s, key))
    expect(limited.status).toBe(429)
    expect(limited.body).toEqual({ status: 'failed', error: 'rate_limited' })
    expect(limited.headers.get('retry-after')).toBe('3')
    expect((await send('/auth/validate', validateBody(s, key), '198.51.100.8')).status).toBe(200)
    clock.advance(2900)
    expect((await send('/auth/validate', validateBody(s, key))).status).toBe(429)
    clock.advance(100)
    expect((await send('/auth/validate', validateBody(s, key))).status).toBe(200)
    expect((await send('/auth/validate', validateBody(s, key))).status).toBe(429)
  })

  test('sandbox validate: the 61st request for a license within a minute is limited', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 60; i++) {
      expect((await send('/auth/validate', validateBody(s, key), `203.0.113.${i}`)).status).toBe(200)
    }
    expect((await send('/auth/validate', validateBody(s, key), '203.0.113.200')).body.error).toBe('rate_limited')
    const other = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await send('/auth/validate', validateBody(s, other), '203.0.113.201')).status).toBe(200)
  })

  test('billed apps use the configured validate limit; a limited request leaves no trace (nonce, credit)', async () => {
    const s = await t.seed({ credits: 100 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 5; i++) expect((await send('/auth/validate', validateBody(s, key), '192.0.2.1')).status).toBe(200)
    const body = validateBody(s, key)
    expect((await send('/auth/validate', body, '192.0.2.1')).status).toBe(429)
    expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(95)
    expect((await send('/auth/validate', body, '192.0.2.2')).status).toBe(200)
  })

  test('an IPv6 client counts as its /64: every address of it shares one per-IP limit, another /64 has its own', async () => {
    const s = await t.seed({ credits: 100 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 1; i <= 5; i++) expect((await send('/auth/validate', validateBody(s, key), `2001:db8:7:1::${i}`)).status).toBe(200)
    expect((await send('/auth/validate', validateBody(s, key), '2001:db8:7:1:ffff:ffff:ffff:ffff')).status).toBe(429)
    expect((await send('/auth/validate', validateBody(s, key), '2001:db8:7:2::1')).status).toBe(200)
  })

  test("requests without the app secret do not spend a license's limit: its owner is never locked out by strangers", async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const stranger = { appId: s.appId, appSecret: 'not-the-secret' }
    for (let i = 0; i < 61; i++) {
      expect((await send('/auth/validate', validateBody(stranger, key), `203.0.114.${i}`)).body.error).toBe('invalid_app')
      const selfban = { appId: s.appId, appSecret: 'not-the-secret', licenseKey: key, hwid: hwid(), nonce: nonce() }
      expect((await send('/auth/selfban', selfban, `203.0.114.${i}`)).body.error).toBe('invalid_app')
    }
    expect((await send('/auth/validate', validateBody(s, key), '203.0.114.250')).status).toBe(200)
    const owner = { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }
    expect((await send('/auth/selfban', owner, '203.0.114.251')).status).toBe(200)
  })

  test('heartbeat: per-IP 20/min on the sandbox, no IP limit on billed apps', async () => {
    for (const sandbox of [true, false]) {
      const s = await t.seed({ sandbox, credits: 100 })
      const key = await insertLicense(t.ctx, s.appId)
      const h = hwid()
      const token = decode((await send('/auth/validate', validateBody(s, key, h), '192.0.2.50')).body.payload).sessionToken
      const statuses: number[] = []
      for (let i = 0; i < 21; i++) {
        statuses.push((await send('/auth/heartbeat', { appId: s.appId, sessionToken: token, hwid: h }, '192.0.2.60')).status)
      }
      expect(statuses.slice(0, 20).every((st) => st === 200)).toBe(true)
      expect(statuses[20]).toBe(sandbox ? 429 : 200)
    }
  })

  test('selfban: per-IP 20/min and per-license 30/min on the sandbox, configured values on billed apps', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId)
    const pre = (ip: string, licenseKey = key) =>
      send('/auth/selfban', { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }, ip)
    for (let i = 0; i < 20; i++) expect((await pre('192.0.2.70')).status).toBe(200)
    expect((await pre('192.0.2.70')).status).toBe(429)
    for (let i = 0; i < 10; i++) expect((await pre(`192.0.2.${100 + i}`)).status).toBe(200)
    expect((await pre('192.0.2.99')).body.error).toBe('rate_limited')

    const billed = await t.seed()
    const billedKey = await insertLicense(t.ctx, billed.appId)
    const body = () => ({ appId: billed.appId, appSecret: billed.appSecret, licenseKey: billedKey, hwid: hwid(), nonce: nonce(), blacklistIp: false })
    for (let i = 0; i < 3; i++) expect((await send('/auth/selfban', body(), `192.0.2.${150 + i}`)).status).toBe(200)
    expect((await send('/auth/selfban', body(), '192.0.2.160')).status).toBe(429)
  })
})

describe('a limit whose interval is no whole number of milliseconds', () => {
  // 60,000 ms ÷ 9 and the like: the bucket's sum of intervals is not exact (BUCKET_SLACK_MS).
  test.each([9, 14, 17, 26])('%i a minute admits a burst of exactly that many within one millisecond', async (limit) => {
    const t = await makeTestApp({ clock: () => Date.parse('2031-05-04T12:00:00.000Z'), env: { ...env, VALIDATE_LIMIT_PER_IP: String(limit) } })
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const statuses: number[] = []
    for (let i = 0; i <= limit; i++) {
      const body = { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }
      statuses.push((await t.req('POST', '/auth/validate', { body, headers: { 'x-forwarded-for': '198.51.100.77' } })).status)
    }
    expect(statuses).toEqual([...Array.from({ length: limit }, () => 200), 429])
  })
})

describe('a clock behind the one that took the last tokens', () => {
  const start = Date.parse('2031-05-04T13:00:00.000Z')
  const ip = { 'x-forwarded-for': '198.51.100.78' }

  /** An instance on a clock the test moves, 5 validates a minute per IP, and one client's validate. */
  async function clientOnManualClock() {
    const clock = manualClock(start)
    const t = await makeTestApp({ clock: clock.now, env: { ...env, VALIDATE_LIMIT_PER_IP: '5' } })
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const validate = () =>
      t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }, headers: ip })
    return { clock, validate }
  }

  test('a clock stepped back an hour does not hold the buckets for that hour: a bucket it finds that far ahead has one token left', async () => {
    const { clock, validate } = await clientOnManualClock()
    expect((await validate()).status).toBe(200)
    clock.advance(-3_600_000)
    expect((await validate()).status).toBe(200)
    // Then the bucket runs as any: empty now, a token back after 12 s (5 a minute).
    const limited = await validate()
    expect([limited.status, limited.headers.get('retry-after')]).toEqual([429, '12'])
    clock.advance(12_000)
    expect((await validate()).status).toBe(200)
  })

  test.each([61, 100])('a clock stepped back %i s: the client is let by when Retry-After says, though its other bucket held it first', async (stepSeconds) => {
    // 5 a minute per IP, emptied: read after the step as a clock stepped back. 300 a minute per license,
    // five tokens taken: its smaller lead is kept, and refuses the first request after the step.
    const { clock, validate } = await clientOnManualClock()
    for (let i = 0; i < 5; i++) expect((await validate()).status).toBe(200)
    clock.advance(-stepSeconds * 1000)
    const first = await validate()
    expect(first.status).toBe(429)
    clock.advance(Number(first.headers.get('retry-after')) * 1000)
    expect((await validate()).status).toBe(200)
  })

  test("an instance whose clock is behind another's serves the clients the other served", async () => {
    const ahead = await makeTestApp({ clock: () => start + 120_000, env: { ...env, VALIDATE_LIMIT_PER_IP: '5' } })
    const behind = await makeTestApp({ clock: () => start, env: { ...env, VALIDATE_LIMIT_PER_IP: '5' } })
    const s = await ahead.seed()
    const licenseKey = await insertLicense(ahead.ctx, s.appId, { unlimitedHwidSlots: true })
    const validateOn = (instance: typeof ahead) =>
      instance.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }, headers: ip })
    expect((await validateOn(ahead)).status).toBe(200)
    expect((await validateOn(behind)).status).toBe(200)
  })

  test('two instances whose clocks are 250 ms apart share one limit: a load balanced over both gets no more than it', async () => {
    // 300 a minute: a token each 200 ms, less than the lead. Read as a clock step by the instance
    // behind, the lead gave it a token on every call and the instance ahead the lead's worth back.
    const clock = manualClock(start)
    const limits = { ...env, VALIDATE_LIMIT_PER_IP: '300' }
    const ahead = await makeTestApp({ clock: () => clock.now() + 250, env: limits })
    const behind = await makeTestApp({ clock: clock.now, env: limits })
    const s = await ahead.seed()
    const licenseKey = await insertLicense(ahead.ctx, s.appId, { unlimitedHwidSlots: true })
    const headers = { 'x-forwarded-for': '198.51.100.79' }
    let admitted = 0
    for (let i = 0; i < 600; i++) {
      const instance = i % 2 === 0 ? ahead : behind
      const body = { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() }
      if ((await instance.req('POST', '/auth/validate', { body, headers })).status === 200) admitted++
      clock.advance(1)
    }
    // The burst, and what 600 ms refill: 3 tokens.
    expect(admitted).toBeGreaterThanOrEqual(300)
    expect(admitted).toBeLessThanOrEqual(304)
  })
})

describe('sandbox daily ceiling', async () => {
  const clock = manualClock(Date.parse('2031-05-04T23:59:58.000Z'))
  const t = await makeTestApp({ clock: clock.now, env: { ...env, SANDBOX_DAILY_CEILING: '5' } })

  test('counts every request naming the app, accepted or not, and resets at 00:00 UTC', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId)
    const h = hwid()
    const ok = await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: h, nonce: nonce() } })
    expect(ok.status).toBe(200)
    const token = decode(ok.body.payload).sessionToken
    expect((await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: 'wrong', licenseKey: key, hwid: h, nonce: nonce() } })).status).toBe(401)
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })).status).toBe(200)
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: 'bad.token', hwid: h } })).status).toBe(401)
    const sb = { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }
    expect((await t.req('POST', '/auth/selfban', { body: sb })).status).toBe(200)
    const over = await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
    expect(over.status).toBe(429)
    expect(over.body).toEqual({ status: 'failed', error: 'demo_quota_exceeded' })
    clock.set(Date.parse('2031-05-04T23:59:59.999Z'))
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })).body.error).toBe('demo_quota_exceeded')
    clock.set(Date.parse('2031-05-05T00:00:00.000Z'))
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })).status).toBe(200)
  })
})

describe('sandbox daily ceiling and the per-IP limit', async () => {
  const clock = manualClock(Date.parse('2031-05-04T12:00:00.000Z'))
  const t = await makeTestApp({ clock: clock.now, env: { ...env, SANDBOX_DAILY_CEILING: '30' } })

  test('a request whose license lookup its IP limit refuses still counts against the ceiling, before the limit', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const validate = (licenseKey: string, ip: string) =>
      t.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() },
        headers: { 'x-forwarded-for': ip },
      })
    // Keys no process holds: each lookup takes a token of the IP's 20 a minute, the 21st is refused one.
    for (let i = 0; i < 20; i++) expect((await validate(`UNKN-OWNK-EY00-${String(i).padStart(4, '0')}`, '198.51.100.20')).body.error).toBe('invalid_key')
    expect((await validate('UNKN-OWNK-EY00-9999', '198.51.100.20')).body.error).toBe('rate_limited')
    // 21 of the day's 30 are spent.
    const answers: string[] = []
    for (let i = 0; i < 10; i++) answers.push((await validate(key, `198.51.100.${30 + i}`)).body.error ?? 'ok')
    expect(answers).toEqual([...Array(9).fill('ok'), 'demo_quota_exceeded'])
    // Past the ceiling a made-up key is refused as over it, whatever its IP's tokens.
    expect((await validate('UNKN-OWNK-EY00-8888', '198.51.100.20')).body.error).toBe('demo_quota_exceeded')
  })
})

describe('sandbox daily ceiling and requests refused as malformed', async () => {
  const t = await makeTestApp({ clock: () => Date.parse('2031-05-04T12:00:00.000Z'), env: { ...env, SANDBOX_DAILY_CEILING: '4' } })

  test('each counts against the app it names, and is still answered 400', async () => {
    const s = await t.seed({ sandbox: true })
    const key = await insertLicense(t.ctx, s.appId)
    const refused = [
      t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: 'x'.repeat(129), nonce: nonce() } }),
      t.req('POST', '/auth/heartbeat', { body: { appId: s.appId.toUpperCase(), sessionToken: 'x.y', hwid: '' } }),
      // Neither a secret nor a session: refused by the endpoint, not the schema.
      t.req('POST', '/auth/selfban', { body: { appId: s.appId, hwid: 'h' } }),
      // Refused as it is parsed, before the schema.
      t.req('POST', '/auth/validate', { body: `{"appId":"${s.appId}","hwid":"h","__proto__":{}}` }),
    ]
    for (const r of await Promise.all(refused)) expect([r.status, r.body]).toEqual([400, { status: 'failed', error: 'bad_request' }])
    const fourth = await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() } })
    expect([fourth.status, fourth.body]).toEqual([429, { status: 'failed', error: 'demo_quota_exceeded' }])
    // Past the ceiling, a malformed request is still refused for what it is.
    const malformed = await t.req('POST', '/auth/validate', { body: { appId: s.appId, hwid: 'h' } })
    expect([malformed.status, malformed.body]).toEqual([400, { status: 'failed', error: 'bad_request' }])
  })

  test('one naming an app that does not exist, or no app, is answered 400 as before', async () => {
    for (const appId of ['00000000-0000-4000-8000-000000000000', 'not-an-app', 7, 'a'.repeat(65)]) {
      const r = await t.req('POST', '/auth/validate', { body: { appId, hwid: 'h' } })
      expect([r.status, r.body]).toEqual([400, { status: 'failed', error: 'bad_request' }])
    }
  })
})
