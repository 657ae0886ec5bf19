/** The yardstick: a bare Elysia POST route with a t.Object body returning JSON, nothing else. */
import { Elysia, t } from 'elysia'

const app = new Elysia()
  .post('/echo', ({ body }) => ({ ok: true, name: body.name, n: body.n }), {
    body: t.Object({ name: t.String(), n: t.Number() }),
  })
  .listen({ hostname: '127.0.0.1', port: Number(process.env.PORT ?? 0) })
process.stderr.write(`${JSON.stringify({ msg: 'listening', url: `http://127.0.0.1:${app.server?.port}` })}\n`)
