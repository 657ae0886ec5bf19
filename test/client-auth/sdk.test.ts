import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { eq } from 'drizzle-orm'
import { apps } from '../../src/db/schema'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_REDIS_URL } from '../support/helpers'
import { appEpochKey, hwid, insertLicense } from '../support/client'
import { SdkLikeClient } from '../support/sdk-client'
import { startServer } from '../support/server-process'

// A self-signed certificate for localhost, made for this run.
const dir = mkdtempSync(join(tmpdir(), 'ls-tls-'))
const certFile = join(dir, 'cert.pem')
const keyFile = join(dir, 'key.pem')
const openssl = Bun.spawnSync([
  'openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
  '-keyout', keyFile, '-out', certFile, '-days', '1', '-subj', '/CN=localhost',
  '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
])
if (openssl.exitCode !== 0) throw new Error(`openssl failed: ${openssl.stderr.toString()}`)
const ca = readFileSync(certFile, 'utf8')

const t = await makeTestApp()
// PostgreSQL mode runs the real entry point with TLS_CERT_FILE/TLS_KEY_FILE; the embedded database
// cannot be shared with a second process, so there the same app listens with the same tls option.
let baseUrl: string
let stop: () => Promise<void>
if (MODE === 'postgres') {
  const server = await startServer({
    DATABASE_URL: TEST_DATABASE_URL!,
    REDIS_URL: TEST_REDIS_URL!,
    TLS_CERT_FILE: certFile,
    TLS_KEY_FILE: keyFile,
  })
  baseUrl = server.url.replace('127.0.0.1', 'localhost')
  stop = async () => void (await server.stop())
} else {
  t.app.listen({ hostname: '127.0.0.1', port: 0, tls: { cert: ca, key: readFileSync(keyFile, 'utf8') } })
  baseUrl = `https://localhost:${t.app.server!.port}`
  stop = async () => void (await t.app.stop())
}
afterAll(() => stop())

test('an SDK-style client logs in over HTTPS, reads variables, heartbeats and self-bans', async () => {
  expect(baseUrl.startsWith('https://')).toBe(true)
  const s = await t.seed()
  await t.ctx.database.db.update(apps).set({ variables: { motd: 'hello', beta: true } }).where(eq(apps.id, s.appId))
  await t.ctx.store.bump([await appEpochKey(t.ctx, s.appId)])
  const licenseKey = await insertLicense(t.ctx, s.appId, { variables: { seats: 3 } })
  const client = new SdkLikeClient({ baseUrl, appId: s.appId, appSecret: s.appSecret, publicKey: s.publicKey, hwid: hwid(), ca })

  await client.login(licenseKey)
  expect(client.appVariables).toEqual({ motd: 'hello', beta: true })
  expect(client.licenseVariables).toEqual({ seats: 3 })
  expect(client.sessionExpiresIn! - Math.floor(Date.now() / 1000)).toBeWithin(86_390, 86_401)
  const firstToken = client.sessionToken
  await client.heartbeat()
  expect(client.sessionToken).not.toBe(firstToken)

  const banned = await client.selfban({ blacklistIp: false })
  expect(banned).toEqual({
    status: 'success',
    mode: 'post_session',
    performed: { revokeLicense: true, blacklistHwid: true, blacklistIp: false },
  })
  await expect(client.heartbeat()).rejects.toThrow('blocked')
  await expect(client.login(licenseKey)).rejects.toThrow('blocked')
})
