import { describe, expect, test } from 'bun:test'
import { Elysia } from 'elysia'
import type { Database } from '../../src/db/client'
import { MemoryStore } from '../../src/store/memory'
import { makeTestApp, sharedInfra } from '../support/helpers'

/** Waits for a condition (metrics are recorded after the response is sent). */
async function until<T>(fn: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < 200; i++) {
    const v = await fn()
    if (v !== undefined) return v
    await Bun.sleep(5)
  }
  throw new Error('condition not met')
}

class DownStore extends MemoryStore {
  override async ping() {
    return false
  }
}

describe('health and readiness', () => {
  test('/healthz answers 200 { status: ok }', async () => {
    const { req } = await makeTestApp()
    const res = await req('GET', '/healthz')
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ status: 'ok' })
  })

  test('/readyz is 200 when the database and the store answer', async () => {
    const { req } = await makeTestApp()
    const res = await req('GET', '/readyz')
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ status: 'ok', database: 'ok', store: 'ok' })
  })

  test('/readyz is 503 naming the store when it does not answer', async () => {
    const { req } = await makeTestApp({ store: new DownStore() })
    const res = await req('GET', '/readyz')
    expect(res.status).toBe(503)
    expect(res.body).toEqual({ status: 'unavailable', database: 'ok', store: 'failed' })
  })

  test('/readyz is 503 naming the database when it does not answer', async () => {
    // A copy of the shared database whose ping fails; the shared database itself stays untouched.
    const shared = (await sharedInfra()).database
    const database: Database = { ...shared, ping: async () => false }
    const { req } = await makeTestApp({ database })
    const res = await req('GET', '/readyz')
    expect(res.status).toBe(503)
    expect(res.body).toEqual({ status: 'unavailable', database: 'failed', store: 'ok' })
  })
})

describe('/metrics', () => {
  const metricLine = (text: string, name: string, labels: string) =>
    text.split('\n').find((l) => l.startsWith(`${name}{${labels}`))

  test('counts requests by method, route pattern and status, in Prometheus text', async () => {
    const { app, req, seed } = await makeTestApp()
    app.use(
      new Elysia().get('/v1/things/:thingId', ({ params }) => ({ id: params.thingId }), {
        detail: { hide: true },
      }),
    )
    await req('GET', '/healthz')
    await req('GET', '/healthz')
    await req('GET', '/v1/things/a1')
    await req('GET', '/v1/things/b2')
    await req('GET', '/definitely/not/here')
    await req('GET', `/scanner/${crypto.randomUUID()}`)
    await seed()

    const text = await until(async () => {
      const res = await req('GET', '/metrics')
      expect(res.status).toBe(200)
      expect(res.headers.get('content-type')).toStartWith('text/plain; version=0.0.4')
      const body = res.body as string
      return body.includes('route="unmatched",status="404",class="4xx"} 2') ? body : undefined
    })
    expect(text).toContain('# TYPE http_requests_total counter')
    expect(text).toContain('# TYPE http_request_duration_seconds histogram')
    expect(
      metricLine(text, 'http_requests_total', 'method="GET",route="/healthz",status="200"'),
    ).toEndWith(' 2')
    // The pattern, never the raw path: both thing requests land in one series.
    expect(
      metricLine(
        text,
        'http_requests_total',
        'method="GET",route="/v1/things/:thingId",status="200"',
      ),
    ).toEndWith(' 2')
    expect(text).not.toContain('/v1/things/a1')
    expect(text).not.toContain('/scanner/')
    expect(
      metricLine(text, 'http_requests_total', 'method="GET",route="unmatched",status="404"'),
    ).toEndWith(' 2')
    const inf = metricLine(
      text,
      'http_request_duration_seconds_bucket',
      'method="GET",route="/v1/things/:thingId",status="200",le="+Inf"',
    )
    expect(inf).toEndWith(' 2')
    expect(
      metricLine(
        text,
        'http_request_duration_seconds_count',
        'method="GET",route="/v1/things/:thingId",status="200"',
      ),
    ).toEndWith(' 2')
  })

  test('error statuses are recorded as sent: validation 400, thrown API errors, a response off its schema', async () => {
    const { app, req } = await makeTestApp()
    const { t } = await import('elysia')
    const { ApiError } = await import('../../src/lib/errors')
    app.use(
      new Elysia()
        .post('/v1/echo', ({ body }) => body, {
          body: t.Object({ n: t.Number() }),
          detail: { hide: true },
        })
        .get(
          '/v1/gone',
          () => {
            throw new ApiError('forbidden', 403, 'no')
          },
          { detail: { hide: true } },
        )
        // Its handler returns, then the schema check fails: counted once, as the 500 sent.
        .get('/v1/off-schema', () => ({ n: 'x' }) as unknown as { n: number }, {
          response: t.Object({ n: t.Number() }),
          detail: { hide: true },
        }),
    )
    expect((await req('POST', '/v1/echo', { body: { n: 'x' } })).status).toBe(400)
    expect((await req('GET', '/v1/gone')).status).toBe(403)
    expect((await req('GET', '/v1/off-schema')).status).toBe(500)
    const text = await until(async () => {
      const body = (await req('GET', '/metrics')).body as string
      return body.includes('route="/v1/gone"') && body.includes('route="/v1/echo"') && body.includes('route="/v1/off-schema"')
        ? body
        : undefined
    })
    expect(
      metricLine(text, 'http_requests_total', 'method="GET",route="/v1/off-schema",status="500"'),
    ).toEndWith(' 1')
    expect(text).not.toContain('route="/v1/off-schema",status="200"')
    expect(
      metricLine(text, 'http_requests_total', 'method="POST",route="/v1/echo",status="400"'),
    ).toEndWith(' 1')
    expect(
      metricLine(text, 'http_requests_total', 'method="GET",route="/v1/gone",status="403"'),
    ).toEndWith(' 1')
  })
})

describe('oversized bodies', () => {
  test.each([
    ['/auth/validate', 16 * 1024, { status: 'failed', error: 'bad_request' }],
    ['/v1/licenses', 1024 * 1024, { error: 'bad_request', message: 'Request body is too large' }],
  ])('%s over its limit gets 413 in the route error shape', async (path, limit, body) => {
    const { req } = await makeTestApp()
    const big = JSON.stringify({ pad: 'x'.repeat(limit) })
    const res = await req('POST', path, { body: big })
    expect(res.status).toBe(413)
    expect(res.body).toEqual(body)
    const justUnder = await req('POST', path, { body: JSON.stringify({ pad: 'x'.repeat(limit - 20) }) })
    expect(justUnder.status).not.toBe(413)
  })
})

describe('bodies over a socket', () => {
  // In-process Requests carry no Content-Length; a real client's does, and it takes another read path.
  test('declared and chunked bodies: parsed, refused when malformed or over the limit', async () => {
    const { app } = await makeTestApp()
    app.listen({ hostname: '127.0.0.1', port: 0 })
    try {
      const url = `http://127.0.0.1:${app.server?.port}/auth/validate`
      const post = async (body: string | ReadableStream) => {
        const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
        return { status: res.status, body: await res.json() }
      }
      const chunked = (text: string) =>
        new ReadableStream({
          start(c) {
            c.enqueue(new TextEncoder().encode(text))
            c.close()
          },
        })
      const unknownApp = JSON.stringify({
        appId: '00000000-0000-4000-8000-000000000000',
        appSecret: 'secret',
        licenseKey: 'ABCD-EFGH-IJKL-MNOP',
        hwid: 'hwid',
        nonce: 'nonce-0123456789',
      })
      const invalidApp = { status: 401, body: { status: 'failed', error: 'invalid_app' } }
      expect(await post(unknownApp)).toEqual(invalidApp)
      expect(await post(chunked(unknownApp))).toEqual(invalidApp)
      const wrongType = JSON.stringify({ appId: 7 })
      const bad = { status: 400, body: { status: 'failed', error: 'bad_request' } }
      expect(await post(wrongType)).toEqual(bad)
      expect(await post(chunked(wrongType))).toEqual(bad)
      expect(await post('{"appId":')).toEqual(bad)
      expect(await post(chunked('{"appId":'))).toEqual(bad)
      const big = JSON.stringify({ pad: 'x'.repeat(16 * 1024) })
      const tooLarge = { status: 413, body: { status: 'failed', error: 'bad_request' } }
      expect(await post(big)).toEqual(tooLarge)
      expect(await post(chunked(big))).toEqual(tooLarge)
    } finally {
      await app.stop()
    }
  })
})
