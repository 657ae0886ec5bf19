/**
 * PostgreSQL answers with a message the driver cannot take: a compromised or impostor server, or
 * someone on the path of a connection without TLS. The query it answered fails and so does its
 * connection (a validate that binds a seat gets system_error; one served from the cache and the store
 * does not notice), the process goes on, and once the messages are sound again the pool serves as
 * before. postgres.js 3.4.9 unpatched (patches/postgres+3.4.9.patch) fails each case:
 * - a copy response to a plain query gave the query a stream with no listener: its error, when the
 *   connection closed, was an uncaught one, which ends the server process;
 * - a column name without its NUL was searched for past the message for ever, blocking the process;
 * - a message shorter than it says failed its query but left the connection waiting for the rest of a
 *   reply it would never see, out of the pool for good;
 * - the authentication handlers are async, and the promise of one that threw (a short request, a SCRAM
 *   challenge without its salt) was dropped: an unhandled rejection, which ends the server process.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { openDb } from '../../src/db/client'
import { hwid, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'
import { until } from '../support/servers'
import { TamperingProxy } from '../support/tampering-proxy'
import { collectUncaught } from '../support/uncaught'

/** A backend message: its type, its length (itself included), its body. */
function message(type: string, ...parts: (Buffer | string)[]): Buffer {
  const body = Buffer.concat(parts.map((part) => (typeof part === 'string' ? Buffer.from(part) : part)))
  const head = Buffer.alloc(5)
  head.write(type, 0)
  head.writeUInt32BE(body.length + 4, 1)
  return Buffer.concat([head, body])
}

const int16 = (n: number) => Buffer.from([n >> 8, n & 0xff])
const int32 = (n: number) => {
  const b = Buffer.alloc(4)
  b.writeInt32BE(n)
  return b
}

/** In place of every reply of the server, on connections already open. */
const MID_SESSION = {
  'a copy stream no query asked for': message('W', Buffer.from([0]), int16(0)),
  'a row description whose column name never ends': message('T', int16(1), 'licenses'),
  'a data row shorter than it says': message('D', int16(1), int32(1000), 'x'),
}

/** The startup exchange of every new connection, the server never reached. */
const AT_CONNECT = {
  'an authentication request cut short': [message('R')],
  'a SCRAM challenge without its salt': [message('R', int32(10), 'SCRAM-SHA-256\0\0'), message('R', int32(11), 'r=abc')],
}

if (MODE === 'postgres') {
  describe('PostgreSQL sends what the driver cannot take', async () => {
    // Unpatched, the column name's case blocks this process for ever: fail before it instead.
    const driver = readFileSync(join(import.meta.dir, '..', '..', 'node_modules', 'postgres', 'src', 'connection.js'), 'utf8')
    if (!driver.includes('function nameEnd(')) throw new Error('postgres.js is not patched (npm install applies patches/): this test would hang')

    const target = new URL(TEST_DATABASE_URL!)
    const proxy = new TamperingProxy(Number(target.port || 5432))
    const url = new URL(target)
    url.port = String(await proxy.listen())
    // One connection: one left waiting for a reply it will not see would be the whole pool.
    const database = await openDb({ databaseUrl: url.toString(), dataDir: null, poolSize: 1 })
    const t = await makeTestApp({ database })
    const uncaught = collectUncaught()
    afterAll(async () => {
      await database.close()
      proxy.close()
    })

    const account = await t.seed({ credits: 1000 })
    const created = await t.req('POST', '/v1/licenses', { apiKey: account.apiKey, body: { appId: account.appId, maxHwidSlots: 16 } })
    expect(created.status, JSON.stringify(created.body)).toBe(201)
    const licenseKey: string = created.body.licenses[0].licenseKey
    const validate = (h: string) =>
      t.req('POST', '/auth/validate', { body: { appId: account.appId, appSecret: account.appSecret, licenseKey, hwid: h, nonce: nonce() } })
    const bound = hwid()
    expect((await validate(bound)).status).toBe(200)

    /** While the proxy tampers (`tampered` runs the checks under it) a new seat fails and a bound one is served; after it, both are. */
    async function failsAloneThenRecovers(tampered: (checks: () => Promise<void>) => Promise<void>) {
      await tampered(async () => {
        // A new HWID is a seat bind: a write to PostgreSQL.
        const refused = await validate(hwid())
        expect(refused.body).toEqual({ status: 'failed', error: 'system_error' })
        expect(refused.status).toBe(500)
        const served = await validate(bound)
        expect(served.status, JSON.stringify(served.body)).toBe(200)
      })
      // A stream's error or a dropped promise surfaces a turn or two after the failure.
      await Bun.sleep(50)
      expect(uncaught).toEqual([])
      const back = await until(() => validate(hwid()), (res) => res.status === 200)
      expect(back.status, JSON.stringify(back.body)).toBe(200)
      expect(await database.ping()).toBe(true)
    }

    for (const [name, reply] of Object.entries(MID_SESSION)) {
      test(`${name}: the query and its connection fail, the process goes on, the pool comes back`, () =>
        failsAloneThenRecovers((checks) => proxy.replying(reply, checks)))
    }

    for (const [name, script] of Object.entries(AT_CONNECT)) {
      test(`${name}: the connection fails, the process goes on, the pool comes back`, () =>
        failsAloneThenRecovers((checks) => proxy.impersonating((_, n) => script[n], checks)))
    }
  })
}
