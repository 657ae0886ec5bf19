import { Elysia, t } from 'elysia'
import type { Context } from '../context'
import { errorFields, log } from '../lib/log'
import { withTimeout } from '../lib/with-timeout'
import { HttpObservation, requestIdOf } from './metrics'
import { REQUEST_ID_HEADER } from './request-id'
import type { ServerMetrics } from './scrape'

const Check = t.Union([t.Literal('ok'), t.Literal('failed')])
const Readiness = t.Object({
  status: t.Union([t.Literal('ok'), t.Literal('unavailable')]),
  database: Check,
  store: Check,
})
// Probes and scrapers carry no key.
const security: [] = []

// A dependency that hangs is as unready as one that refuses: never let a probe wait for ever.
const PING_TIMEOUT_MS = 2000

async function probe(ping: () => Promise<boolean>): Promise<'ok' | 'failed'> {
  return (await withTimeout(ping().catch(() => false), PING_TIMEOUT_MS)) ? 'ok' : 'failed'
}

/** Liveness and readiness for orchestrators; no authentication. */
export const opsRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-ops' })
    .get('/healthz', () => ({ status: 'ok' as const }), {
      response: {
        200: t.Object({ status: t.Literal('ok') }, { description: 'Serving', examples: [{ status: 'ok' }] }),
      },
      detail: {
        operationId: 'checkHealth',
        security,
        tags: ['Operations'],
        summary: 'Liveness',
        description: 'Answers 200 while the process serves HTTP; checks no dependency.',
      },
    })
    .get(
      '/readyz',
      async ({ set }) => {
        const [database, store] = await Promise.all([
          probe(() => ctx.database.ping()),
          probe(() => ctx.store.ping()),
        ])
        const ready = database === 'ok' && store === 'ok'
        if (!ready) set.status = 503
        return { status: ready ? ('ok' as const) : ('unavailable' as const), database, store }
      },
      {
        response: {
          200: { ...Readiness, description: 'Ready', examples: [{ status: 'ok', database: 'ok', store: 'ok' }] },
          503: {
            ...Readiness,
            description: 'Not ready: the failed dependency is named',
            examples: [{ status: 'unavailable', database: 'ok', store: 'failed' }],
          },
        },
        detail: {
          operationId: 'checkReadiness',
          security,
          tags: ['Operations'],
          summary: 'Readiness',
          description:
            'Pings the database and the store (Redis or in-process); 503 names the one that failed.',
        },
      },
    )

/** Prometheus metrics of the whole server (every process); no authentication. */
export const metricsRoutes = (scrape: ServerMetrics) =>
  new Elysia({ name: 'routes-metrics' }).get(
    '/metrics',
    async () =>
      new Response(await scrape.exposition(), {
        headers: { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' },
      }),
    {
      detail: {
        operationId: 'getMetrics',
        security,
        // No response schema (the body is text, not validated): the document's response is declared here.
        responses: {
          200: {
            description: 'Prometheus text exposition format 0.0.4',
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
        },
        tags: ['Operations'],
        summary: 'Prometheus metrics',
        description:
          'HTTP requests by route pattern and status, validations, heartbeats and selfbans by result, seat binds, ' +
          'webhook deliveries by outcome, the outbox backlog, credit flush lag, store and database errors, and ' +
          'process figures (CPU, memory, event-loop delay, open descriptors, start time), each process labelled ' +
          'process="i" when several share the port. Served on METRICS_HOST:METRICS_PORT instead of here when that is set.',
      },
    },
  )

/**
 * The listener METRICS_PORT opens in the first server process: /metrics and nothing else (404), kept
 * off the client port so the figures need not be public. Its requests carry ids and reach the access
 * log but are not counted: http_requests_total describes the client port. A failed scrape is logged
 * here, and answered without Elysia's default body, which would carry the error's message.
 */
export function internalMetricsApp(scrape: ServerMetrics) {
  const observation = new HttpObservation(null)
  return new Elysia({ name: 'internal-metrics', strictPath: true })
    .use(observation.plugin)
    .onError(({ code, error, request, route }) => {
      const requestId = requestIdOf(request)
      const text = (status: number, body: string) => {
        observation.answered(request, route, status)
        return new Response(body, {
          status,
          headers: { 'content-type': 'text/plain; charset=utf-8', [REQUEST_ID_HEADER]: requestId },
        })
      }
      if (code === 'NOT_FOUND') return text(404, 'NOT_FOUND')
      log.error('metrics scrape failed', { requestId, ...errorFields(error) })
      return text(500, 'internal error\n')
    })
    .use(metricsRoutes(scrape))
}
