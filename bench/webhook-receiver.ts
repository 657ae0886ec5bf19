/**
 * The benchmark's webhook receiver, in a process of its own so it keeps answering while wrk runs:
 * HTTPS on a free port (prints it). Every POST's X-Service-Signature is checked the way the spec asks
 * (HMAC-SHA256 of the raw body with the webhook secret, constant-time compare): 204 and counted when
 * it matches, 401 and counted apart when not. PUT /secret sets the secret (before the webhook is
 * enabled); GET answers { received, rejected }.
 *   bun bench/webhook-receiver.ts <cert.pem> <key.pem>
 *
 * It shares the machine's CPU with the server under test, so it does as little as it can per request:
 * one body read, one HMAC, no JSON parsing, no per-request allocations beyond those.
 */
import { timingSafeEqual } from 'node:crypto'

const [certFile, keyFile] = process.argv.slice(2)
if (!certFile || !keyFile) throw new Error('usage: webhook-receiver.ts <cert.pem> <key.pem>')
const PREFIX = 'sha256='
let secret: string | null = null
let received = 0
let rejected = 0
const noContent = { status: 204 }
const unauthorized = { status: 401 }

function signatureMatches(header: string | null, body: ArrayBuffer): boolean {
  if (secret === null || header === null || !header.startsWith(PREFIX)) return false
  const want = new Bun.CryptoHasher('sha256', secret).update(body).digest()
  const got = Buffer.from(header.slice(PREFIX.length), 'hex')
  return got.length === want.length && timingSafeEqual(got, want)
}

const server = Bun.serve({
  port: 0,
  hostname: '127.0.0.1',
  tls: { cert: await Bun.file(certFile).text(), key: await Bun.file(keyFile).text() },
  async fetch(req) {
    if (req.method === 'GET') return Response.json({ received, rejected })
    if (req.method === 'PUT') {
      secret = await req.text()
      return new Response(null, noContent)
    }
    const body = await req.arrayBuffer()
    if (!signatureMatches(req.headers.get('x-service-signature'), body)) {
      rejected++
      return new Response(null, unauthorized)
    }
    received++
    return new Response(null, noContent)
  },
})
console.log(server.port)
