#!/usr/bin/env node
// A webhook receiver for the license service: HTTPS, checks every delivery's signature and age before
// trusting it, prints each accepted event as one JSON line on stdout. Node 18+, no dependencies.
//
//   WEBHOOK_SECRET=whsec_… TLS_CERT_FILE=cert.pem TLS_KEY_FILE=key.pem PORT=8443 node webhook-receiver.mjs
import { createHmac, timingSafeEqual } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:https'

const MAX_AGE_MS = 5 * 60 * 1000
const MAX_BODY_BYTES = 1024 * 1024

/**
 * The delivery's event when it is genuine, else why not. `rawBody` must be the bytes as received:
 * the signature covers them, not a re-serialized object.
 */
export function verifyDelivery(rawBody, headers, secret, now = Date.now()) {
  const expected = Buffer.from(`sha256=${createHmac('sha256', secret).update(rawBody).digest('hex')}`)
  const given = Buffer.from(String(headers['x-service-signature'] ?? ''))
  // Constant time, so the comparison leaks nothing about how much of a forgery matched.
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { ok: false, reason: 'bad signature' }
  const event = JSON.parse(rawBody.toString('utf8'))
  // The body's timestamp is covered by the signature (the header's copy is not): an old delivery
  // replayed later is refused by it.
  const age = Math.abs(now - Date.parse(event.timestamp))
  if (!(age <= MAX_AGE_MS)) return { ok: false, reason: 'timestamp more than 5 minutes away' }
  return { ok: true, event }
}

const settings = {
  secret: process.env.WEBHOOK_SECRET ?? '',
  certFile: process.env.TLS_CERT_FILE ?? '',
  keyFile: process.env.TLS_KEY_FILE ?? '',
  host: process.env.HOST ?? '127.0.0.1',
  port: Number(process.env.PORT ?? 8443),
}
const missing = ['WEBHOOK_SECRET', 'TLS_CERT_FILE', 'TLS_KEY_FILE'].filter((name) => !process.env[name])
if (missing.length > 0) {
  console.error(`webhook receiver: set ${missing.join(', ')}`)
  process.exit(2)
}

const server = createServer(
  { cert: readFileSync(settings.certFile), key: readFileSync(settings.keyFile) },
  (req, res) => {
    const chunks = []
    let size = 0
    req.on('data', (chunk) => {
      size += chunk.length
      if (size > MAX_BODY_BYTES) req.destroy()
      else chunks.push(chunk)
    })
    req.on('end', () => {
      const verdict = req.method === 'POST' ? verifyDelivery(Buffer.concat(chunks), req.headers, settings.secret) : null
      if (!verdict?.ok) {
        console.error(`rejected ${req.method} ${req.url}: ${verdict?.reason ?? 'not a POST'}`)
        res.writeHead(verdict ? 401 : 405).end()
        return
      }
      console.log(JSON.stringify(verdict.event))
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok')
    })
  },
)
server.listen(settings.port, settings.host, () => {
  const { port } = server.address()
  console.error(`webhook receiver listening on https://${settings.host}:${port}`)
})
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => server.close(() => process.exit(0)))
