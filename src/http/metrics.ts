import { Elysia, StatusMap } from 'elysia'
import type { Metrics } from '../lib/metrics'

export const UNMATCHED_ROUTE = 'unmatched'

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

// The start time rides on the request's context object, which Elysia keeps from onRequest to
// onAfterResponse: cheaper than a WeakMap on the hot path.
const started = Symbol('metrics.started')
type Timed = { [started]?: number }

/**
 * Global hooks that time every request. The status comes from the Response when a handler returned
 * one, else from `set.status` (app.ts's onError writes the status of the error it answered there).
 */
export const httpMetrics = (metrics: Metrics) =>
  new Elysia({ name: 'http-metrics' })
    .onRequest((ctx) => {
      ;(ctx as Timed)[started] = performance.now()
    })
    .onAfterResponse({ as: 'global' }, (ctx) => {
      const t0 = (ctx as Timed)[started]
      if (t0 === undefined) return
      const response = (ctx as { response?: unknown }).response
      const set = ctx.set.status ?? 200
      const status =
        response instanceof Response
          ? response.status
          : typeof set === 'number'
            ? set
            : (StatusMap[set as keyof typeof StatusMap] ?? 200)
      const method = METHODS.has(ctx.request.method) ? ctx.request.method : 'OTHER'
      metrics.record(method, ctx.route || UNMATCHED_ROUTE, status, (performance.now() - t0) / 1000)
    })
