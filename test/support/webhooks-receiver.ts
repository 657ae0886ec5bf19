import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createHmac, timingSafeEqual } from 'node:crypto'

/** A self-signed certificate for localhost and 127.0.0.1, made once per test process. */
let cert: { certFile: string; cert: string; key: string } | undefined
export function testCertificate() {
  if (cert) return cert
  const dir = mkdtempSync(join(tmpdir(), 'ls-whcert-'))
  const certFile = join(dir, 'cert.pem')
  const keyFile = join(dir, 'key.pem')
  const made = spawnSync('openssl', [
    'req', '-x509', '-newkey', 'ed25519', '-nodes', '-days', '2',
    '-keyout', keyFile, '-out', certFile,
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
  ])
  if (made.status !== 0) throw new Error(`openssl failed: ${made.stderr}`)
  cert = { certFile, cert: readFileSync(certFile, 'utf8'), key: readFileSync(keyFile, 'utf8') }
  return cert
}

export interface Received {
  path: string
  headers: Record<string, string>
  raw: string
  body: { event: string; timestamp: string; data: Record<string, any> }
}

/** What the receiver answers: a status, or never (until the client gives up), or 200 after a while. */
export type Reply = number | 'hang' | { redirect: string } | { delayMs: number }

/** Checks X-Service-Signature the way a receiver should: HMAC of the raw body, constant-time compare. */
export function signatureValid(r: Received, secret: string): boolean {
  const want = Buffer.from(`sha256=${createHmac('sha256', secret).update(r.raw).digest('hex')}`)
  const got = Buffer.from(r.headers['x-service-signature'] ?? '')
  return got.length === want.length && timingSafeEqual(got, want)
}

/** An HTTPS webhook receiver on localhost, port 0. `reply` decides the answer per path. */
export function startReceiver(reply: (path: string) => Reply = () => 200) {
  const { cert: c, key } = testCertificate()
  const received: Received[] = []
  const hanging = new Set<() => void>()
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    tls: { cert: c, key },
    async fetch(req) {
      const path = new URL(req.url).pathname
      const raw = await req.text()
      received.push({ path, headers: Object.fromEntries(req.headers), raw, body: JSON.parse(raw) })
      const answer = reply(path)
      if (answer === 'hang') {
        await new Promise<void>((resolve) => hanging.add(resolve))
        return new Response('late', { status: 504 })
      }
      if (typeof answer === 'object' && 'delayMs' in answer) {
        await Bun.sleep(answer.delayMs)
        return new Response('ok', { status: 200 })
      }
      if (typeof answer === 'object') return new Response(null, { status: 302, headers: { location: answer.redirect } })
      return new Response('ok', { status: answer })
    },
  })
  const base = `https://127.0.0.1:${server.port}`
  return {
    base,
    url: (path = '/hook') => `${base}${path}`,
    received,
    /** Deliveries for one path. */
    at: (path: string) => received.filter((r) => r.path === path),
    async stop() {
      for (const resolve of hanging) resolve()
      server.stop(true)
    },
    [Symbol.asyncDispose]() {
      return this.stop()
    },
  }
}

export type Receiver = ReturnType<typeof startReceiver>

/** Polls until `check` holds; the suite's per-test timeout bounds it. */
export async function until(check: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000) {
  // The monotonic clock: a wall clock stepped forward (a VM resumed from a pause) would end the wait at once.
  const deadline = performance.now() + timeoutMs
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await Bun.sleep(20)
  }
}
