import { Elysia, StatusMap } from 'elysia'
import { log, logs } from '../lib/log'
import type { Metrics } from '../lib/metrics'
import { REQUEST_ID_HEADER, requestIdFor } from './request-id'

/** Label for requests that matched no route: one series, whatever paths scanners try. */
export const UNMATCHED_ROUTE = 'unmatched'

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

// The start time and the request id ride on the request's context object, which Elysia keeps from
// onRequest to onAfterResponse (onError included): cheaper than a WeakMap or AsyncLocalStorage.
const started = Symbol('metrics.started')
const requestId = Symbol('request.id')
type Observed = { [started]?: number; [requestId]?: string }

/** The id of the request a hook or handler is serving ('' outside the plugin below). */
export const requestIdOf = (ctx: object): string => (ctx as Observed)[requestId] ?? ''

/**
 * Global hooks on every request: the request id (taken or made, answered in X-Request-Id on every
 * response, errors included), the timing behind http_requests_total (not counted without `metrics`:
 * the internal metrics listener's requests stay out of the public series) and, at debug, one access log
 * line. The status comes from the Response when a handler returned one, else from `set.status`
 * (app.ts's onError writes the status of the error it answered there).
 */
export const httpObservation = (metrics: Metrics | null) =>
  new Elysia({ name: 'http-observation' })
    .onRequest((ctx) => {
      const id = requestIdFor(ctx.request)
      ;(ctx as Observed)[started] = performance.now()
      ;(ctx as Observed)[requestId] = id
      ctx.set.headers[REQUEST_ID_HEADER] = id
    })
    .onAfterResponse({ as: 'global' }, (ctx) => {
      const t0 = (ctx as Observed)[started]
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
      const route = ctx.route || UNMATCHED_ROUTE
      const ms = performance.now() - t0
      metrics?.http.record(method, route, status, ms / 1000)
      // The route pattern, never the path (it carries license keys and HWIDs); no client IP, which is
      // personal data and already in a proxy's own log where one runs.
      if (logs('debug')) {
        log.debug('request', { requestId: (ctx as Observed)[requestId], method, route, status, ms: Math.round(ms * 1000) / 1000 })
      }
    })
