import { Elysia, t } from 'elysia'
import type { Context } from '../context'
import type { Metrics } from '../lib/metrics'

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
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), PING_TIMEOUT_MS)
  })
  try {
    return (await Promise.race([ping().catch(() => false), timeout])) ? 'ok' : 'failed'
  } finally {
    clearTimeout(timer)
  }
}

/** Liveness, readiness and Prometheus metrics for orchestrators and scrapers; no authentication. */
export const opsRoutes = (ctx: Context, metrics: Metrics) =>
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
    .get(
      '/metrics',
      () =>
        new Response(metrics.render(), {
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
            'http_requests_total and http_request_duration_seconds, labelled by method, route pattern and status.',
        },
      },
    )
