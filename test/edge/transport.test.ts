import { describe, expect, test } from 'bun:test'
import { API_BURST } from '../../src/http/rate-limit'
import { makeTestApp } from '../support/helpers'
import { startServer } from '../support/server-process'

const chunked = (text: string) =>
  new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode(text))
      controller.close()
    },
  })

describe('bodies over 2 MiB, on the real server', () => {
  test('get the JSON 413 in the shape of the route, declared or chunked', async () => {
    const server = await startServer({ DATABASE_URL: '', REDIS_URL: '' })
    try {
      const big = JSON.stringify({ pad: 'x'.repeat(3 * 1024 * 1024) })
      const expected = {
        '/v1/licenses': { error: 'bad_request', message: 'Request body is too large' },
        '/auth/validate': { status: 'failed', error: 'bad_request' },
      }
      for (const [path, body] of Object.entries(expected)) {
        for (const sent of [big, chunked(big)]) {
          const res = await fetch(`${server.url}${path}`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: sent,
          })
          expect(res.status).toBe(413)
          expect(await res.json()).toEqual(body)
        }
      }
    } finally {
      await server.stop()
    }
  })
})

describe('Authorization scheme', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  test('the scheme is case-insensitive; another scheme, or the key in other case, is not the key', async () => {
    for (const scheme of ['bearer', 'BEARER', 'BeArEr']) {
      const res = await t.req('GET', '/v1/account', { headers: { authorization: `${scheme} ${s.apiKey}` } })
      expect(res.status, `${scheme}: ${JSON.stringify(res.body)}`).toBe(200)
    }
    for (const authorization of [`Basic ${s.apiKey}`, `Bearer ${s.apiKey.toUpperCase()}`]) {
      expect((await t.req('GET', '/v1/account', { headers: { authorization } })).status).toBe(401)
    }
  })
})

test('unknown /auth paths answer 404 in the public failure shape', async () => {
  const t = await makeTestApp()
  const paths = [
    ['GET', '/auth'],
    ['POST', '/auth'],
    ['GET', '/auth/'],
    ['POST', '/auth/unknown'],
    ['GET', '/auth/validate'],
    ['DELETE', '/auth/heartbeat'],
  ] as const
  for (const [method, path] of paths) {
    const res = await t.req(method, path)
    expect(res.status, `${method} ${path}`).toBe(404)
    expect(res.body, `${method} ${path}`).toEqual({ status: 'failed', error: 'not_found' })
  }
})

describe('a burst over a socket', () => {
  // The in-process store used to answer within the request's own microtasks, so each request ran its
  // (thread-holding) PGlite queries before the next one took a token and the burst passed under refill.
  test('160 concurrent Developer API requests with one key: the burst passes, the rest get 429', async () => {
    const t = await makeTestApp()
    const s = await t.seed()
    t.app.listen({ hostname: '127.0.0.1', port: 0 })
    try {
      // Creating licenses is a transaction of some weight: what let the most of a burst through.
      const url = `http://127.0.0.1:${t.app.server?.port}/v1/licenses`
      const statuses = await Promise.all(
        Array.from({ length: 160 }, () =>
          fetch(url, {
            method: 'POST',
            headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' },
            body: JSON.stringify({ appId: s.appId, quantity: 20 }),
          }).then(async (r) => {
            await r.arrayBuffer()
            return r.status
          }),
        ),
      )
      const passed = statuses.filter((x) => x === 201).length
      expect(statuses.filter((x) => x !== 201 && x !== 429)).toEqual([])
      // A few tokens may refill while the burst is read (50 a second): never the 60 over the burst.
      expect(passed).toBeGreaterThanOrEqual(API_BURST)
      expect(passed).toBeLessThanOrEqual(API_BURST + 5)
    } finally {
      await t.app.stop(true)
    }
  })
})
