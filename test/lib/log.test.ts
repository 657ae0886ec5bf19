import { afterEach, describe, expect, setSystemTime, test } from 'bun:test'
import { log, logEvery, logs, setLogLevel } from '../../src/lib/log'
import { loggedBy } from '../support/log-capture'

afterEach(() => setLogLevel('error'))

describe('log lines', () => {
  test('one JSON line each: ISO time, level name, message, fields', async () => {
    setLogLevel('info')
    const [entry, ...rest] = await loggedBy(() => log.info('started', { port: 3000 }))
    expect(rest).toEqual([])
    expect(entry).toEqual({ time: expect.any(String), level: 'info', port: 3000, msg: 'started' })
    expect(new Date(entry!.time).toISOString()).toBe(entry!.time)
  })

  test('the level set decides what is written, and logs() says so before any field is built', async () => {
    setLogLevel('warn')
    expect([logs('debug'), logs('info'), logs('warn'), logs('error')]).toEqual([false, false, true, true])
    const entries = await loggedBy(() => {
      log.debug('d')
      log.info('i')
      log.warn('w')
      log.error('e')
    })
    expect(entries.map((e) => e.level)).toEqual(['warn', 'error'])
  })

  test('a field named like a secret prints [Redacted], at the top level and nested, headers too', async () => {
    const secrets = {
      apiKey: 'svc_live_abcdef',
      appSecret: 'app-secret-value',
      licenseKey: 'ABCD-EFGH-IJKL-MNOP',
      hwid: 'hwid-7f3a9c2e',
      sessionToken: 'token-value',
      masterKey: 'ab'.repeat(32),
      password: 'hunter2',
    }
    const [entry] = await loggedBy(() =>
      log.error('failed', {
        ...secrets,
        request: { headers: { authorization: 'Bearer svc_live_xyz', 'x-api-key': 'svc_live_q', cookie: 'sid=1' } },
        cause: { secret: 'whsec_123', hwids: ['hw-a', 'hw-b'] },
        batch: [{ licenseKey: 'WXYZ-WXYZ-WXYZ-WXYZ' }],
        count: 2,
      }),
    )
    for (const name of Object.keys(secrets)) expect(entry![name]).toBe('[Redacted]')
    expect(entry!.request.headers).toEqual({ authorization: '[Redacted]', 'x-api-key': '[Redacted]', cookie: '[Redacted]' })
    expect(entry!.cause).toEqual({ secret: '[Redacted]', hwids: '[Redacted]' })
    expect(entry!.batch).toEqual([{ licenseKey: '[Redacted]' }])
    expect(entry!.count).toBe(2)
    const line = JSON.stringify(entry)
    for (const value of [...Object.values(secrets), 'svc_live_xyz', 'svc_live_q', 'whsec_123', 'hw-a', 'WXYZ-WXYZ-WXYZ-WXYZ']) {
      expect(line).not.toContain(value)
    }
  })

  test("redaction leaves the caller's objects as they were", async () => {
    const fields = { cause: { token: 't-1' }, rows: [{ hwid: 'h-1' }], appId: 'app' }
    const [entry] = await loggedBy(() => log.error('failed', fields))
    expect(entry).toMatchObject({ cause: { token: '[Redacted]' }, rows: [{ hwid: '[Redacted]' }], appId: 'app' })
    expect(fields).toEqual({ cause: { token: 't-1' }, rows: [{ hwid: 'h-1' }], appId: 'app' })
  })
})

test('a repeating warning is held back 10 s, and a clock stepped back does not silence it for the step', async () => {
  setLogLevel('warn')
  try {
    const start = Date.UTC(2031, 0, 1, 12)
    const lines = await loggedBy(async () => {
      setSystemTime(new Date(start))
      logEvery('warn', 'a warning that repeats, stepped back')
      logEvery('warn', 'a warning that repeats, stepped back')
      setSystemTime(new Date(start - 3_600_000))
      logEvery('warn', 'a warning that repeats, stepped back')
    })
    expect(lines.filter((l) => l.msg === 'a warning that repeats, stepped back')).toHaveLength(2)
  } finally {
    setSystemTime()
    setLogLevel('error')
  }
})
