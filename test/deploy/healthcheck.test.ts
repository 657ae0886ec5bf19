/**
 * src/healthcheck.ts, the image's health probe: it must find the server where the settings put it
 * (scheme included) and report anything else as unhealthy, with one line saying why. A listener of the
 * test's own stands for the server (test/deploy/image.test.ts probes the real one), so the answer can
 * be made to fail.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { runToExit } from '../support/server-process'
import { freePort } from '../support/servers'

const dir = mkdtempSync(join(tmpdir(), 'ls-probe-'))
const tls = { TLS_CERT_FILE: join(dir, 'cert.pem'), TLS_KEY_FILE: join(dir, 'key.pem') }
const made = Bun.spawnSync(
  ['openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1'].concat(
    ['-keyout', tls.TLS_KEY_FILE, '-out', tls.TLS_CERT_FILE, '-subj', '/CN=licenses.example.com'],
  ),
  { stderr: 'pipe' },
)
if (made.exitCode !== 0) throw new Error(`openssl failed: ${made.stderr.toString()}`)

let healthStatus = 200
const listener = Bun.serve({
  hostname: '127.0.0.1',
  port: 0,
  tls: { cert: readFileSync(tls.TLS_CERT_FILE, 'utf8'), key: readFileSync(tls.TLS_KEY_FILE, 'utf8') },
  fetch: (request) => new Response(null, { status: new URL(request.url).pathname === '/healthz' ? healthStatus : 404 }),
})
const port = String(listener.port)
afterAll(() => listener.stop(true))

// What the image's environment gives the probe: the server's own settings.
const probe = (env: Record<string, string>) =>
  runToExit(['src/healthcheck.ts'], { DATABASE_URL: '', REDIS_URL: '', TLS_CERT_FILE: '', TLS_KEY_FILE: '', ...env })

describe('the health probe', () => {
  test('answers healthy over HTTPS when TLS_CERT_FILE is set, though the certificate names another host', async () => {
    const { code, stderr } = await probe({ HOST: '0.0.0.0', PORT: port, ...tls })
    expect({ code, stderr }).toEqual({ code: 0, stderr: '' })
  })

  test('fails when /healthz answers other than 200', async () => {
    healthStatus = 503
    try {
      const { code, stderr } = await probe({ HOST: '127.0.0.1', PORT: port, ...tls })
      expect({ code, stderr }).toEqual({ code: 1, stderr: 'unhealthy: /healthz answered 503\n' })
    } finally {
      healthStatus = 200
    }
  })

  test('fails when it would speak HTTP to the HTTPS listener', async () => {
    const { code, stderr } = await probe({ HOST: '127.0.0.1', PORT: port })
    expect(code).toBe(1)
    expect(stderr).toMatch(/^unhealthy: .+\n$/)
  })

  test('fails when nothing listens on PORT', async () => {
    const { code, stderr } = await probe({ HOST: '127.0.0.1', PORT: String(await freePort()) })
    expect(code).toBe(1)
    expect(stderr).toMatch(/^unhealthy: .+\n$/)
  })

  test('names a bad setting in one line', async () => {
    const { code, stderr } = await probe({ PORT: 'eighty' })
    expect({ code, stderr }).toEqual({ code: 1, stderr: 'unhealthy: configuration error: PORT must be a whole number, got "eighty"\n' })
  })
})
