/**
 * Redis answers with a reply the client cannot take: a compromised or impostor server, or someone on the
 * path of a connection without TLS. The calls on that connection fail as in an outage (a validate with
 * system_error, a heartbeat served from PostgreSQL), the process goes on, and once the replies are sound
 * again the store reconnects and serves as before. Unpatched, the client's parser threw such a reply's
 * RangeError out of the socket's 'data' listener: an uncaught error, which ends the server process.
 */
import { expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { accounts } from '../../src/db/schema'
import { decode, hwid, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { until } from '../support/servers'
import { storeBehindProxy } from '../support/tampering-proxy'

const { proxy, store } = await storeBehindProxy()

const t = await makeTestApp({ store })
const account = await t.seed({ credits: 1000 })
const created = await t.req('POST', '/v1/licenses', { apiKey: account.apiKey, body: { appId: account.appId } })
expect(created.status, JSON.stringify(created.body)).toBe(201)
const licenseKey: string = created.body.licenses[0].licenseKey
const h = hwid()

const validate = () =>
  t.req('POST', '/auth/validate', { body: { appId: account.appId, appSecret: account.appSecret, licenseKey, hwid: h, nonce: nonce() } })
const heartbeat = (sessionToken: string) => t.req('POST', '/auth/heartbeat', { body: { appId: account.appId, sessionToken, hwid: h } })

const first = await validate()
expect(first.status, JSON.stringify(first.body)).toBe(200)
const sessionToken: string = decode(first.body.payload).sessionToken

const DEEP = `${'*1\r\n'.repeat(200_000)}:1\r\n`
const HOSTILE = {
  'arrays nested 200,000 deep, in one read': { reply: DEEP, pieceBytes: Number.POSITIVE_INFINITY },
  'arrays nested 200,000 deep, in 64 KiB pieces': { reply: DEEP, pieceBytes: 65_536 },
  'an array length no array can have': { reply: '*99999999999\r\n:1\r\n', pieceBytes: Number.POSITIVE_INFINITY },
}

for (const [name, { reply, pieceBytes }] of Object.entries(HOSTILE)) {
  test(`${name}: the calls fail as in an outage, the process goes on, the store comes back`, async () => {
    await proxy.replying(
      reply,
      async () => {
        const refused = await validate()
        expect(refused.body).toEqual({ status: 'failed', error: 'system_error' })
        expect(refused.status).toBe(500)
        // A heartbeat needs no nonce: without the store it is served from PostgreSQL.
        const beat = await heartbeat(sessionToken)
        expect(beat.status, JSON.stringify(beat.body)).toBe(200)
      },
      pieceBytes,
    )
    const back = await until(validate, (res) => res.status === 200)
    expect(back.status, JSON.stringify(back.body)).toBe(200)
  })
}

// Sound RESP of another shape than the limit script's answer: read as "limited", it refused the request
// with 429 and a Retry-After of NaN. It is the store failing: the Developer API is let through, as in an
// outage, without limit headers.
for (const reply of ['$3\r\nabc\r\n', '*0\r\n', ':1\r\n', '*3\r\n:2\r\n:0\r\n:0\r\n']) {
  test(`the API limit answered with ${JSON.stringify(reply)}: the request is let through as in an outage`, async () => {
    const res = await proxy.replying(reply, () => t.req('GET', '/v1/apps', { apiKey: account.apiKey }))
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.headers.get('ratelimit-remaining')).toBeNull()
    const back = await until(() => t.req('GET', '/v1/apps', { apiKey: account.apiKey }), (res) => res.headers.get('ratelimit-remaining') !== null)
    expect(back.status).toBe(200)
  })
}

// The credit counts the scripts keep as text: read as NaN, a flush would take NaN credits to PostgreSQL.
test('a flush amount, a credit sequence or a credit epoch that is no count, or a flush reply of another shape, is the store failing', async () => {
  for (const [reply, call, what] of [
    ['*2\r\n$6\r\nid:abc\r\n:1\r\n', () => store.beginFlush(account.accountId, 'id'), 'flush amount'],
    ['*2\r\n$4\r\nid:1\r\n$3\r\nabc\r\n', () => store.beginFlush(account.accountId, 'id'), 'credit sequence'],
    ['*2\r\n$2\r\nid\r\n:1\r\n', () => store.beginFlush(account.accountId, 'id'), 'flush record'],
    ['$6\r\nid:abc\r\n', () => store.beginFlush(account.accountId, 'id'), 'flush reply'],
    ['$3\r\nabc\r\n', () => store.creditsChanging(account.accountId), 'credit sequence'],
    ['*2\r\n$3\r\nabc\r\n$-1\r\n', () => store.creditState(account.accountId), 'credit epoch'],
  ] as const) {
    await proxy.replying(reply, async () => {
      await expect(call()).rejects.toThrow(`unexpected ${what} in the store`)
    })
  }
})

test('a balance the store holds as text that is no count: the account is answered from PostgreSQL', async () => {
  const reconciled = await t.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, account.accountId))
  const res = await proxy.replying('$3\r\nabc\r\n', () => t.req('GET', '/v1/account', { apiKey: account.apiKey }))
  expect(res.status, JSON.stringify(res.body)).toBe(200)
  expect(res.body.credits).toBe(reconciled[0]!.credits)
})
