/**
 * The README's local webhook recipe, followed step by step: a self-signed certificate made with the
 * README's openssl command, a server started with WEBHOOK_ALLOW_PRIVATE_TARGETS=true and
 * NODE_EXTRA_CA_CERTS naming it, and examples/node/webhook-receiver.mjs (the README's verification
 * snippet) receiving real deliveries, accepting them, and refusing forged or stale ones.
 */
import { afterAll, expect, test } from 'bun:test'
import { createHmac } from 'node:crypto'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort, until } from '../support/servers'
import { REPO_ROOT, startExampleServer } from './harness'

const dir = mkdtempSync(join(tmpdir(), 'ls-receiver-'))
const certFile = join(dir, 'receiver-cert.pem')
const keyFile = join(dir, 'receiver-key.pem')
// The README's command, as written there.
const openssl = Bun.spawnSync(
  ['openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '30',
    '-keyout', keyFile, '-out', certFile, '-subj', '/CN=localhost',
    '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'],
)
if (openssl.exitCode !== 0) throw new Error(`openssl failed: ${openssl.stderr.toString()}`)

const running = await startExampleServer({ WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true', NODE_EXTRA_CA_CERTS: certFile })
const vendor = await running.provision('Webhook Vendor')
const port = await freePort()
const webhook = await running.api(vendor.apiKey, 'POST', `/v1/apps/${vendor.appId}/webhooks`, {
  url: `https://127.0.0.1:${port}/hook`,
  events: ['license.created'],
})

const receiver = Bun.spawn(['node', join(REPO_ROOT, 'examples', 'node', 'webhook-receiver.mjs')], {
  env: { PATH: process.env.PATH ?? '', WEBHOOK_SECRET: webhook.secret, TLS_CERT_FILE: certFile, TLS_KEY_FILE: keyFile, PORT: String(port) },
  stdout: 'pipe',
  stderr: 'pipe',
})
afterAll(async () => {
  receiver.kill('SIGTERM')
  await receiver.exited
  await running.server.stop()
})

/** Everything a stream has printed so far, kept up to date in the background. */
function collect(stream: ReadableStream<Uint8Array>) {
  const seen = { text: '' }
  void (async () => {
    const decoder = new TextDecoder()
    for await (const chunk of stream) seen.text += decoder.decode(chunk)
  })()
  return seen
}
const out = collect(receiver.stdout)
const err = collect(receiver.stderr)
await until(async () => err.text, (text) => text.includes('listening'))
if (!err.text.includes('listening')) throw new Error(`the receiver did not start: ${err.text}`)

const accepted = () =>
  out.text
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { event: string; timestamp: string; data: Record<string, unknown> })

/** A POST straight to the receiver, trusting its certificate as the server does. */
function deliver(body: string, signature: string) {
  return fetch(`https://127.0.0.1:${port}/hook`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-service-signature': signature },
    body,
    tls: { ca: readFileSync(certFile, 'utf8') },
  })
}
const sign = (body: string) => `sha256=${createHmac('sha256', webhook.secret).update(body).digest('hex')}`

test('a test ping reaches the receiver over HTTPS, and its signature verifies', async () => {
  const ping = await running.api(vendor.apiKey, 'POST', `/v1/apps/${vendor.appId}/webhooks/${webhook.webhookId}/test`)
  expect(ping).toEqual({ ok: true, status: 200 })
  expect(accepted()).toContainEqual(
    expect.objectContaining({ event: 'test.ping', data: expect.objectContaining({ appId: vendor.appId, test: true }) }),
  )
})

test('a real event is delivered and accepted', async () => {
  const { licenses } = await running.api(vendor.apiKey, 'POST', '/v1/licenses', { appId: vendor.appId })
  const licenseKey = licenses[0].licenseKey
  const events = await until(async () => accepted(), (list) => list.some((e) => e.data.licenseKey === licenseKey))
  expect(events).toContainEqual(
    expect.objectContaining({ event: 'license.created', data: expect.objectContaining({ licenseKey, appId: vendor.appId }) }),
  )
})

test('a forged signature and a stale timestamp are refused with 401', async () => {
  const fresh = JSON.stringify({ event: 'license.revoked', timestamp: new Date().toISOString(), data: { licenseKey: 'FAKE-FAKE-FAKE-FAKE' } })
  const forged = await deliver(fresh, `sha256=${'0'.repeat(64)}`)
  expect(forged.status).toBe(401)
  const otherSecret = await deliver(fresh, `sha256=${createHmac('sha256', 'whsec_guess').update(fresh).digest('hex')}`)
  expect(otherSecret.status).toBe(401)

  // Signed with the right secret, but ten minutes old: a replay of a captured delivery.
  const stale = JSON.stringify({ event: 'license.revoked', timestamp: new Date(Date.now() - 600_000).toISOString(), data: {} })
  expect((await deliver(stale, sign(stale))).status).toBe(401)
  // The control: the same body, fresh and rightly signed, is accepted, so the refusals above are the checks'.
  expect((await deliver(fresh, sign(fresh))).status).toBe(200)

  await until(async () => err.text, (text) => text.includes('timestamp'))
  expect(err.text).toContain('bad signature')
  expect(err.text).toContain('timestamp more than 5 minutes away')
  // The receiver prints what it accepted on stdout, read here a little after its 200.
  const revoked = await until(async () => accepted().filter((e) => e.event === 'license.revoked'), (list) => list.length > 0)
  expect(revoked).toHaveLength(1)
})
