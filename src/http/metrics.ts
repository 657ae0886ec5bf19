import { Elysia, StatusMap } from 'elysia'
import { log, logs } from '../lib/log'
import type { Metrics } from '../lib/metrics'
import { REQUEST_ID_HEADER, requestIdFor } from './request-id'

/** Label for requests that matched no route: one series, whatever paths scanners try. */
export const UNMATCHED_ROUTE = 'unmatched'

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

// The start time and the request id, by request. Not on the context object: Elysia reads each hook's and
// handler's source to decide what to parse for every route, and a context handed whole to a function, or
// indexed by a symbol, makes it parse headers, query, cookies and body on every request, /auth's included.
interface Observed {
  started: number
  id: string
}
const observed = new WeakMap<Request, Observed>()

/** The id of the request a hook or handler is serving ('' outside the plugin below). */
export const requestIdOf = (request: Request): string => observed.get(request)?.id ?? ''

/**
 * Global hooks on every request: the request id (taken or made, answered in X-Request-Id on every
 * response, errors included), the timing behind http_requests_total (not counted without `metrics`:
 * the internal metrics listener's requests stay out of the public series) and, at debug, one access log
 * line. The status comes from the Response when a handler returned one, else from `set.status`
 * (app.ts's onError writes the status of the error it answered there).
 */
export const httpObservation = (metrics: Metrics | null) =>
  new Elysia({ name: 'http-observation' })
    .onRequest(({ request, set }) => {
      const id = requestIdFor(request)
      observed.set(request, { started: performance.now(), id })
      set.headers[REQUEST_ID_HEADER] = id
    })
    .onAfterResponse({ as: 'global' }, (ctx) => {
      const seen = observed.get(ctx.request)
      if (seen === undefined) return
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
      const ms = performance.now() - seen.started
      metrics?.http.record(method, route, status, ms / 1000)
      // The route pattern, never the path (it carries license keys and HWIDs); no client IP, which is
      // personal data and already in a proxy's own log where one runs.
      if (logs('debug')) {
        log.debug('request', { requestId: seen.id, method, route, status, ms: Math.round(ms * 1000) / 1000 })
      }
    })
