import { Elysia, ElysiaCustomStatusResponse, StatusMap } from 'elysia'
import { log, logs } from '../lib/log'
import type { Metrics } from '../lib/metrics'
import { REQUEST_ID_HEADER, requestIdFor } from './request-id'

/** Label for requests that matched no route: one series, whatever paths scanners try. */
export const UNMATCHED_ROUTE = 'unmatched'

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

// The start time and the request id, by request, and whether its response was counted. Not on the
// context object: Elysia reads each hook's and handler's source to decide what to parse for every route,
// and a context handed whole to a function, or indexed by a symbol, makes it parse headers, query,
// cookies and body on every request, /auth's included.
interface Observed {
  started: number
  id: string
  counted: boolean
}
const observed = new WeakMap<Request, Observed>()

/**
 * The request's id and start, made by the first hook or handler that asks: the body parser for a
 * request with a body, the transform hook below for the others, the error handler for a request no
 * route matched. Not an onRequest hook: with one, Elysia builds every request's URL and query index
 * before its handler.
 */
function observe(request: Request): Observed {
  let seen = observed.get(request)
  if (seen === undefined) {
    seen = { started: performance.now(), id: requestIdFor(request), counted: false }
    observed.set(request, seen)
  }
  return seen
}

/** The id of the request a hook or handler is serving. */
export const requestIdOf = (request: Request): string => observe(request).id

/** The status an answer goes out with: a Response's own, a status() call's, else the one set. */
function statusOf(answer: unknown, set: number | keyof typeof StatusMap | undefined): number {
  if (answer instanceof Response) return answer.status
  if (answer instanceof ElysiaCustomStatusResponse) return answer.code
  return typeof set === 'number' ? set : set === undefined ? 200 : (StatusMap[set] ?? 200)
}

/**
 * Every request's id (taken or made, answered in X-Request-Id on every response, errors included),
 * the timing behind http_requests_total (not counted without `metrics`: the internal metrics
 * listener's requests stay out of the public series) and, at debug, one access log line. `plugin` is
 * global hooks; an app's onError reports the answers it makes with `answered` (the hooks never see a
 * 404's) and puts the id in their headers itself.
 */
export class HttpObservation {
  readonly plugin

  constructor(private readonly metrics: Metrics | null) {
    this.plugin = new Elysia({ name: 'http-observation' })
      // Returns nothing: the body is left to the next parser. A body's upload is part of the request's time.
      .onParse({ as: 'global' }, ({ request }) => {
        observe(request)
      })
      .onTransform({ as: 'global' }, ({ request, set }) => {
        set.headers[REQUEST_ID_HEADER] = observe(request).id
      })
      // Counted here, as the handler's answer is about to be sent, rather than in an afterResponse hook,
      // which Elysia runs from a setImmediate closure of its own per request.
      .mapResponse({ as: 'global' }, ({ request, route, set, responseValue }) => {
        this.answered(request, route, statusOf(responseValue, set.status))
      })
  }

  /** Counts the request's answer: the first report of it (an error while an answer is sent reports it again). */
  answered(request: Request, route: string, status: number): void {
    const seen = observe(request)
    if (seen.counted) return
    seen.counted = true
    const method = METHODS.has(request.method) ? request.method : 'OTHER'
    const pattern = route || UNMATCHED_ROUTE
    const ms = performance.now() - seen.started
    this.metrics?.http.record(method, pattern, status, ms / 1000)
    // The route pattern, never the path (it carries license keys and HWIDs); no client IP, which is
    // personal data and already in a proxy's own log where one runs.
    if (logs('debug')) {
      log.debug('request', { requestId: seen.id, method, route: pattern, status, ms: Math.round(ms * 1000) / 1000 })
    }
  }
}
