/**
 * Each domain metric at /metrics moves when its event happens: client requests by result, seat binds,
 * webhook deliveries by outcome, the outbox backlog, credit flush lag, store and database errors, and
 * the process's own figures.
 */
import { describe, expect, setSystemTime, test } from 'bun:test'
import { sql } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { startDispatcher } from '../../src/delivery/dispatcher'
import { writeIsolated } from '../../src/db/isolated-write'
import type { Context } from '../../src/context'
import { BACKLOG_CACHE_MS, BACKLOG_TIMEOUT_MS, ServerMetrics } from '../../src/http/scrape'
import { startEventLoopMonitor } from '../../src/lib/process-metrics'
import { RedisStore } from '../../src/store/redis'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, type TestApp } from '../support/helpers'
import { countSoFar, sample } from '../support/metrics-text'
import { ownRedis } from '../support/servers'
import { startReceiver, testCertificate, until } from '../support/webhooks-receiver'

const scrape = async (t: TestApp) => (await t.req('GET', '/metrics')).body as string

async function validate(t: TestApp, app: { appId: string; appSecret: string }, licenseKey: string, machine = hwid()) {
  return t.req('POST', '/auth/validate', {
    body: { appId: app.appId, appSecret: app.appSecret, licenseKey, hwid: machine, nonce: nonce() },
  })
}

describe('client requests by result', () => {
  test('validations, heartbeats and selfbans: success, and each error code answered', async () => {
    const t = await makeTestApp()
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const machine = hwid()
    const ok = await validate(t, s, licenseKey, machine)
    expect(ok.status, JSON.stringify(ok.body)).toBe(200)
    expect((await validate(t, { ...s, appSecret: 'wrong' }, licenseKey)).status).toBe(401)
    const { sessionToken } = decode(ok.body.payload)
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: machine } })).status).toBe(200)
    expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken, hwid: 'other' } })).status).toBe(401)
    const banned = await t.req('POST', '/auth/selfban', {
      body: { appId: s.appId, sessionToken, hwid: machine, revokeLicense: false, blacklistIp: false },
    })
    expect(banned.status, JSON.stringify(banned.body)).toBe(200)

    const text = await scrape(t)
    expect(sample(text, 'license_validations_total{result="success"}')).toBe(1)
    expect(sample(text, 'license_validations_total{result="invalid_app"}')).toBe(1)
    expect(sample(text, 'license_heartbeats_total{result="success"}')).toBe(1)
    expect(sample(text, 'license_heartbeats_total{result="session_expired"}')).toBe(1)
    expect(sample(text, 'license_selfbans_total{result="success"}')).toBe(1)
    expect(sample(text, 'license_seat_binds_total{result="bound"}')).toBe(1)
  })

  test('seat binds: the free seat is bound once, the concurrent others are refused', async () => {
    const t = await makeTestApp()
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    // Warm the cache with the license seen free, so every one of the burst plans a bind.
    await t.ctx.actors.ensureLicense(s.appId, licenseKey)
    const answers = await Promise.all(Array.from({ length: 5 }, () => validate(t, s, licenseKey)))
    expect(answers.map((a) => a.status).sort()).toEqual([200, 403, 403, 403, 403])
    const text = await scrape(t)
    expect(sample(text, 'license_seat_binds_total{result="bound"}')).toBe(1)
    expect(sample(text, 'license_seat_binds_total{result="refused"}')).toBe(4)
    expect(sample(text, 'license_validations_total{result="hwid_mismatch"}')).toBe(4)
  })

  test('HTTP requests carry the route pattern, the status and its class, each answer counted once', async () => {
    const t = await makeTestApp()
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    // A handler's object, a body the schema refuses, an error the app answers, a Response, a status()
    // call, and no route at all.
    expect((await validate(t, s, licenseKey)).status).toBe(200)
    expect((await t.req('POST', '/auth/validate', { body: { appId: 7 } })).status).toBe(400)
    expect((await t.req('GET', '/v1/account')).status).toBe(401)
    expect((await t.req('GET', '/docs')).status).toBe(200)
    expect((await t.req('GET', '/docs/assets/nope.js')).status).toBe(404)
    expect((await t.req('GET', '/no/such/route')).status).toBe(404)
    const series = [
      'http_requests_total{method="POST",route="/auth/validate",status="200",class="2xx"}',
      'http_requests_total{method="POST",route="/auth/validate",status="400",class="4xx"}',
      'http_requests_total{method="GET",route="/v1/account",status="401",class="4xx"}',
      'http_requests_total{method="GET",route="/docs",status="200",class="2xx"}',
      'http_requests_total{method="GET",route="/docs/assets/:file",status="404",class="4xx"}',
      'http_requests_total{method="GET",route="unmatched",status="404",class="4xx"}',
    ]
    const text = await scrape(t)
    expect(series.map((line) => countSoFar(text, line))).toEqual(series.map(() => 1))
    // Nothing else counted: the scrape's own request is counted once its answer is made.
    const counted = text.split('\n').filter((l) => l.startsWith('http_requests_total{'))
    expect(counted.reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0)).toBe(series.length)
  })
})

describe('webhooks', () => {
  test('the backlog counts events waiting for the dispatcher; deliveries are counted by outcome', async () => {
    const t = await makeTestApp({ env: { NODE_EXTRA_CA_CERTS: testCertificate().certFile } })
    const s = await t.seed()
    await using rx = startReceiver((path) => (path === '/ok' ? 200 : 500))
    for (const path of ['/ok', '/fail']) {
      const res = await t.req('POST', `/v1/apps/${s.appId}/webhooks`, {
        apiKey: s.apiKey,
        body: { url: rx.url(path), events: ['license.created'] },
      })
      expect(res.status, JSON.stringify(res.body)).toBe(201)
    }
    const before = sample(await scrape(t), 'webhook_backlog{stage="undispatched_events"}')
    const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId, quantity: 2 } })
    expect(created.status, JSON.stringify(created.body)).toBe(201)
    await Bun.sleep(BACKLOG_CACHE_MS)
    expect(sample(await scrape(t), 'webhook_backlog{stage="undispatched_events"}')).toBe(before + 2)

    // The dispatcher sends whatever the shared test database still owes too: only these four are known.
    await using _d = startDispatcher(t.ctx, { pollMs: 50 })
    await until(async () => {
      const text = await scrape(t)
      return countSoFar(text, 'webhook_deliveries_total{outcome="success"}') >= 2 && countSoFar(text, 'webhook_deliveries_total{outcome="http_error"}') >= 2
    }, 'four deliveries counted', 60_000)
    expect(rx.received).toHaveLength(4)
  })
})

describe('the backlog count', () => {
  /** A scrape of `t`'s figures whose backlog count runs `execute` instead of the database's. */
  const scrapeWith = (t: TestApp, execute: () => Promise<unknown>) => {
    let counts = 0
    const database = {
      db: {
        execute: () => {
          counts++
          return execute()
        },
      },
    }
    const metrics = new ServerMetrics({ ...t.ctx, database } as unknown as Context, { kind: 'single' })
    return { scrape: () => metrics.exposition(), counts: () => counts }
  }

  test('one count answers the scrapes of the next second', async () => {
    const t = await makeTestApp()
    const { scrape, counts } = scrapeWith(t, async () => [{ events: 7, deliveries: 3 }])
    const [a, b] = await Promise.all([scrape(), scrape()])
    expect(sample(await scrape(), 'webhook_backlog{stage="undispatched_events"}')).toBe(7)
    expect([a, b].map((text) => sample(text, 'webhook_backlog{stage="unattempted_deliveries"}'))).toEqual([3, 3])
    expect(counts()).toBe(1)
    await Bun.sleep(BACKLOG_CACHE_MS)
    await scrape()
    expect(counts()).toBe(2)
  })

  test('a database that never answers: the scrape answers without the backlog, counted, and the count is not piled up', async () => {
    const t = await makeTestApp()
    const { scrape, counts } = scrapeWith(t, () => new Promise(() => {}))
    const started = performance.now()
    const text = await scrape()
    expect(performance.now() - started).toBeLessThan(BACKLOG_TIMEOUT_MS + 500)
    expect(text).not.toContain('webhook_backlog{')
    expect(sample(text, 'webhook_backlog_count_timeouts_total')).toBe(1)
    expect(sample(text, 'process_uptime_seconds')).toBeGreaterThan(0)
    await Bun.sleep(BACKLOG_CACHE_MS)
    expect(sample(await scrape(), 'webhook_backlog_count_timeouts_total')).toBe(2)
    // The hung count is still running: it is waited for again, not started again.
    expect(counts()).toBe(1)
  })
})

describe('credits, store and database', () => {
  test('credit flush lag grows until a flush pass moves every pending charge', async () => {
    const t = await makeTestApp()
    await Bun.sleep(30)
    const waiting = sample(await scrape(t), 'credit_flush_lag_seconds')
    expect(waiting).toBeGreaterThanOrEqual(0.03)
    const flushStarted = performance.now()
    await t.ctx.credits.flush()
    const lag = sample(await scrape(t), 'credit_flush_lag_seconds')
    // Counted from the start of that pass at the most: it found every pending charge and moved it.
    expect(lag).toBeLessThanOrEqual((performance.now() - flushStarted) / 1000)
  })

  test('credit flush lag is a duration: a wall clock stepped back an hour does not make it negative', async () => {
    const t = await makeTestApp()
    await t.ctx.credits.flush()
    try {
      setSystemTime(new Date(Date.now() - 3_600_000))
      const lag = sample(await scrape(t), 'credit_flush_lag_seconds')
      expect(lag).toBeGreaterThanOrEqual(0)
      expect(lag).toBeLessThan(60)
    } finally {
      setSystemTime()
    }
  })

  test('store errors: a Redis that is down fails commands and connections, each counted', async () => {
    const t = await makeTestApp()
    const redis = await ownRedis()
    const store = new RedisStore(redis.url, { connectTimeoutMs: 200 })
    try {
      await store.take('k', 1, 1, Date.now())
      await redis.stop()
      const before = await scrape(t)
      await expect(store.take('k', 1, 1, Date.now())).rejects.toThrow()
      await until(async () => countSoFar(await scrape(t), 'store_errors_total{kind="connection"}') > countSoFar(before, 'store_errors_total{kind="connection"}'), 'a connection error')
      expect(sample(await scrape(t), 'store_errors_total{kind="command"}')).toBeGreaterThan(countSoFar(before, 'store_errors_total{kind="command"}'))
    } finally {
      await store.close()
      await redis.stop()
    }
  })

  test('database errors, by SQLSTATE class: in a batched write and in a request', async () => {
    const t = await makeTestApp()
    t.app.use(
      new Elysia().get('/v1/divide', () => t.ctx.database.db.execute(sql`SELECT 1 / 0`), { detail: { hide: true } }),
    )
    const before = countSoFar(await scrape(t), 'database_errors_total{code="22"}')
    const written = await writeIsolated(
      [1],
      async () => {
        await t.ctx.database.db.execute(sql`SELECT 1 / 0`)
      },
      'isolate',
    )
    expect(written.refused).toHaveLength(1)
    expect(sample(await scrape(t), 'database_errors_total{code="22"}')).toBe(before + 1)
    expect((await t.req('GET', '/v1/divide')).status).toBe(500)
    expect(sample(await scrape(t), 'database_errors_total{code="22"}')).toBe(before + 2)
  })
})

test('process figures: CPU, memory, descriptors, start time, uptime, event-loop delay', async () => {
  const t = await makeTestApp()
  // A short window, so one closes within the test: the figures are absent until one has.
  startEventLoopMonitor(50)
  await until(async () => (await scrape(t)).includes('process_event_loop_delay_seconds{stat="p99"}'), 'a closed event-loop window')
  const text = await scrape(t)
  expect(sample(text, 'process_cpu_seconds_total')).toBeGreaterThan(0)
  expect(sample(text, 'process_resident_memory_bytes')).toBeGreaterThan(1e6)
  expect(sample(text, 'process_heap_bytes')).toBeGreaterThan(1e5)
  expect(sample(text, 'process_open_fds')).toBeGreaterThan(2)
  expect(sample(text, 'process_start_time_seconds')).toBeLessThanOrEqual(Date.now() / 1000)
  expect(sample(text, 'process_uptime_seconds')).toBeGreaterThan(0)
  expect(sample(text, 'process_event_loop_delay_seconds{stat="p99"}')).toBeGreaterThanOrEqual(0)
})
