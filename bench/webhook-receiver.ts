/**
 * The benchmark's webhook receiver, in a process of its own so it keeps answering while wrk runs:
 * HTTPS on a free port (prints it), 204 to every POST, GET /count answers how many POSTs came in.
 *   bun bench/webhook-receiver.ts <cert.pem> <key.pem>
 */
const [certFile, keyFile] = process.argv.slice(2)
if (!certFile || !keyFile) throw new Error('usage: webhook-receiver.ts <cert.pem> <key.pem>')
let received = 0
const server = Bun.serve({
  port: 0,
  hostname: '127.0.0.1',
  tls: { cert: await Bun.file(certFile).text(), key: await Bun.file(keyFile).text() },
  async fetch(req) {
    if (req.method === 'GET') return Response.json({ received })
    await req.arrayBuffer()
    received++
    return new Response(null, { status: 204 })
  },
})
console.log(server.port)
