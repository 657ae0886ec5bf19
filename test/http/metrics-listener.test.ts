/**
 * A scrape describes the whole server: with several server processes every scrape carries each
 * process's series (labelled process="i") and the server-wide ones once. METRICS_PORT moves /metrics
 * to a listener of its own, and the real server's log carries the request ids it answers.
 */
import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { internalMetricsApp } from '../../src/http/ops'
import { type OtherProcesses, PROCESS_ANSWER_MS, ServerMetrics } from '../../src/http/scrape'
import { sendToChild, sendToFirstServerProcess } from '../../src/server-processes'
import { loggedBy } from '../support/log-capture'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_REDIS_URL, type TestApp } from '../support/helpers'
import { startServer, twoProcessesWithMetricsPort } from '../support/server-process'
import { freePort } from '../support/servers'
import { sample } from '../support/metrics-text'

/** Messages cross a structured clone, as over the IPC channel, and arrive on a later turn. */
const across = (deliver: (message: unknown) => void) => (message: unknown) => {
  const copy = structuredClone(message)
  setTimeout(() => deliver(copy), 0)
  return true
}

/** A first process and others built on test contexts, wired as main.ts wires them; `silent` ones never answer. */
async function processes(others: number, silent: number[] = []) {
  const contexts: TestApp[] = []
  for (let i = 0; i <= others; i++) contexts.push(await makeTestApp())
  const first = new ServerMetrics(contexts[0]!.ctx, { kind: 'first' })
  const rest = contexts.slice(1).map(
    (t, i) => new ServerMetrics(t.ctx, { kind: 'other', index: i + 1, toFirst: across((m) => first.receive(m, i + 1)) }),
  )
  const channel: OtherProcesses = {
    indexes: () => rest.map((_, i) => i + 1),
    send: (index, message) => {
      if (!silent.includes(index)) across((m) => rest[index - 1]?.receive(m))(message)
      return true
    },
  }
  first.attach(channel)
  return { contexts, first, rest }
}

describe('a scrape of several processes', () => {
  test('whichever process answers, every process is in it, labelled, and the backlog once', async () => {
    const { contexts, first, rest } = await processes(2)
    contexts[2]!.ctx.metrics.validations.add('success', 3)
    contexts[0]!.ctx.metrics.validations.add('success', 1)
    for (const text of [await first.exposition(), await rest[0]!.exposition(), await rest[1]!.exposition()]) {
      expect(sample(text, 'license_validations_total{result="success",process="2"}')).toBe(3)
      expect(sample(text, 'license_validations_total{result="success",process="0"}')).toBe(1)
      for (const p of ['0', '1', '2']) expect(text).toContain(`process_start_time_seconds{process="${p}"}`)
      expect(text.match(/^webhook_backlog\{stage="undispatched_events"\}/gm)).toHaveLength(1)
      expect(text.match(/^# TYPE license_validations_total counter$/gm)).toHaveLength(1)
      expect(sample(text, 'server_processes_missing')).toBe(0)
    }
  })

  test('a process that does not answer in time is left out and counted missing', async () => {
    const { first } = await processes(2, [2])
    const started = performance.now()
    const text = await first.exposition()
    expect(performance.now() - started).toBeGreaterThanOrEqual(PROCESS_ANSWER_MS - 50)
    expect(text).toContain('process_start_time_seconds{process="1"}')
    expect(text).not.toContain('process="2"')
    expect(sample(text, 'server_processes_missing')).toBe(1)
  })
})

/** Bun's Subprocess.send and process.send after the channel closed, before `killed` is set. */
const closedChannel = () => {
  throw Object.assign(new Error('Channel closed.'), { code: 'ERR_IPC_CHANNEL_CLOSED' })
}

describe('a process whose IPC channel closed mid-scrape', () => {
  test('the first: a send to it is refused, not thrown, and the scrape counts it missing at once', async () => {
    expect(sendToChild({ killed: false, send: closedChannel }, { type: 'metrics:collect', id: 1 })).toBe(false)
    expect(sendToChild({ killed: true, send: () => {} }, {})).toBe(false)
    expect(sendToChild(undefined, {})).toBe(false)
    expect(sendToChild({ killed: false, send: () => {} }, {})).toBe(true)
    const t = await makeTestApp()
    const first = new ServerMetrics(t.ctx, { kind: 'first' })
    first.attach({ indexes: () => [1], send: (_, message) => sendToChild({ killed: false, send: closedChannel }, message) })
    const started = performance.now()
    const text = await first.exposition()
    expect(performance.now() - started).toBeLessThan(PROCESS_ANSWER_MS)
    expect(sample(text, 'server_processes_missing')).toBe(1)
  })

  test('another: a send to the first is refused, not thrown, and the process answers with its own figures', async () => {
    const send = process.send
    process.send = closedChannel
    try {
      expect(sendToFirstServerProcess({ type: 'metrics:scrape', id: 1 })).toBe(false)
    } finally {
      process.send = send
    }
    const t = await makeTestApp()
    t.ctx.metrics.validations.add('success', 2)
    const other = new ServerMetrics(t.ctx, { kind: 'other', index: 1, toFirst: () => false })
    const started = performance.now()
    const text = await other.exposition()
    expect(performance.now() - started).toBeLessThan(PROCESS_ANSWER_MS)
    expect(sample(text, 'license_validations_total{result="success",process="1"}')).toBe(2)
  })

  test('another falls back to its own figures when the first does not answer', async () => {
    const t = await makeTestApp()
    t.ctx.metrics.validations.add('success', 1)
    const other = new ServerMetrics(t.ctx, { kind: 'other', index: 1, toFirst: () => true })
    const text = await other.exposition()
    expect(sample(text, 'license_validations_total{result="success",process="1"}')).toBe(1)
    expect(text).not.toContain('process="0"')
  }, PROCESS_ANSWER_MS * 3 + 10_000)

  test('a scrape the first cannot gather for another is logged, not left to reject (which ends the server)', async () => {
    const t = await makeTestApp()
    const first = new ServerMetrics(t.ctx, { kind: 'first' })
    first.attach({ indexes: () => [], send: () => true })
    t.ctx.metrics.collect = () => {
      throw new Error('collect failed')
    }
    const rejected: unknown[] = []
    const onRejection = (err: unknown) => rejected.push(err)
    process.on('unhandledRejection', onRejection)
    try {
      const entries: Record<string, any>[] = []
      await loggedBy(async () => {
        first.receive({ type: 'metrics:scrape', id: 1 }, 1)
        // The scrape gathers its figures after a turn or more: on a loaded machine, longer than a fixed wait.
        for (const end = Date.now() + 5_000; Date.now() < end && entries.length === 0; ) await Bun.sleep(20)
        await Bun.sleep(50)
      }, entries)
      expect(entries).toContainEqual(expect.objectContaining({ msg: 'metrics scrape for another server process failed', error: 'Error' }))
      expect(rejected).toEqual([])
    } finally {
      process.off('unhandledRejection', onRejection)
    }
  })
})

// Several processes share the port only with the shared database and store.
if (MODE === 'postgres') {
  test('SERVER_PROCESSES=2 with METRICS_PORT: the internal listener shows both processes, the public port 404', async () => {
    const metricsPort = await freePort()
    const server = await twoProcessesWithMetricsPort(TEST_DATABASE_URL!, TEST_REDIS_URL!, metricsPort)
    try {
      const t = await makeTestApp()
      const s = await t.seed()
      const licenseKey = await insertLicense(t.ctx, s.appId)
      const machine = hwid()
      // A new connection per request, so the kernel spreads them over both processes.
      const fresh = (url: string, init: RequestInit = {}) =>
        fetch(url, { ...init, keepalive: false, headers: { ...init.headers, connection: 'close' } })
      for (let i = 0; i < 8; i++) {
        const res = await fresh(`${server.url}/auth/validate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: machine, nonce: nonce() }),
        })
        expect(res.status).toBe(200)
      }
      expect((await fresh(`${server.url}/metrics`)).status).toBe(404)
      const text = await (await fresh(`http://127.0.0.1:${metricsPort}/metrics`)).text()
      const success = (p: string) => sample(text, `license_validations_total{result="success",process="${p}"}`)
      expect(success('0') + success('1')).toBe(8)
      expect(text).toContain('process_start_time_seconds{process="0"}')
      expect(text).toContain('process_start_time_seconds{process="1"}')
      expect(sample(text, 'server_processes_missing')).toBe(0)
    } finally {
      await server.stop()
    }
  })
}

test('the internal listener logs a failed scrape with its request id and answers 500 without the error', async () => {
  const failing = {
    exposition: async () => {
      throw new Error('exposition failed at figure 3')
    },
  } as unknown as ServerMetrics
  const app = internalMetricsApp(failing)
  let res: Response | undefined
  const entries = await loggedBy(async () => {
    res = await app.handle(new Request('http://metrics.internal/metrics', { headers: { 'x-request-id': 'scrape-7' } }))
  })
  expect(res?.status).toBe(500)
  expect(res?.headers.get('x-request-id')).toBe('scrape-7')
  expect(await res?.text()).not.toContain('figure 3')
  expect(entries).toContainEqual(
    expect.objectContaining({ level: 'error', msg: 'metrics scrape failed', requestId: 'scrape-7', error: 'Error', message: 'exposition failed at figure 3' }),
  )
  expect((await app.handle(new Request('http://metrics.internal/other'))).status).toBe(404)
})

/** The local addresses of the sockets listening on `port`, from the kernel's tables (hex, as /proc spells them). */
function listeningAddresses(port: number): string[] {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0')
  return ['/proc/net/tcp', '/proc/net/tcp6'].flatMap((table) =>
    readFileSync(table, 'utf8')
      .split('\n')
      .slice(1)
      .map((line) => line.trim().split(/\s+/))
      // local_address is ADDRESS:PORT; state 0A is LISTEN.
      .filter((fields) => fields[1]?.endsWith(`:${hexPort}`) && fields[3] === '0A')
      .map((fields) => fields[1]!.split(':')[0]!),
  )
}

test('METRICS_PORT: /metrics there and only there; request ids answered and in the access log', async () => {
  const metricsPort = await freePort()
  const env: Record<string, string> = { METRICS_PORT: String(metricsPort), LOG_LEVEL: 'debug' }
  if (MODE === 'postgres') Object.assign(env, { DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '1' })
  const server = await startServer(env)
  try {
    // METRICS_HOST unset: the loopback only (127.0.0.1, little-endian in /proc), no other address, no IPv6.
    expect(listeningAddresses(metricsPort)).toEqual(['0100007F'])
    const internal = `http://127.0.0.1:${metricsPort}`
    const publicScrape = await fetch(`${server.url}/metrics`, { headers: { 'x-request-id': 'public-scrape' } })
    expect(publicScrape.status).toBe(404)
    expect(publicScrape.headers.get('x-request-id')).toBe('public-scrape')
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200)

    const scrape = await fetch(`${internal}/metrics`, { headers: { 'x-request-id': 'internal-scrape' } })
    expect(scrape.status).toBe(200)
    expect(scrape.headers.get('x-request-id')).toBe('internal-scrape')
    expect(await scrape.text()).toContain('route="unmatched",status="404",class="4xx"} 1')
    for (const path of ['/healthz', '/v1/account', '/auth/validate', '/metrics/']) {
      expect((await fetch(`${internal}${path}`)).status, path).toBe(404)
    }

    // The listener's own requests (the scrape above, those 404s) stay out of the client port's series.
    const again = await (await fetch(`${internal}/metrics`)).text()
    expect(again).toContain('route="unmatched",status="404",class="4xx"} 1')
    expect(again).not.toContain('route="/metrics"')

    const logged = () => server.log().split('\n').filter((l) => l.includes('"msg":"request"')).map((l) => JSON.parse(l))
    for (let i = 0; i < 100 && !logged().some((e) => e.requestId === 'internal-scrape'); i++) await Bun.sleep(20)
    expect(logged()).toContainEqual(expect.objectContaining({ requestId: 'public-scrape', route: 'unmatched', status: 404 }))
    expect(logged()).toContainEqual(expect.objectContaining({ requestId: 'internal-scrape', route: '/metrics', status: 200 }))
  } finally {
    await server.stop()
  }
})
