import { ValueErrorType } from '@sinclair/typebox/errors'
import type { TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { Elysia } from 'elysia'
import type { Context } from './context'
import { ApiError, LoggedPublicError, PublicError } from './lib/errors'
import { HttpObservation, requestIdOf, UNMATCHED_ROUTE } from './http/metrics'
import { authenticate } from './http/auth'
import { REQUEST_ID_HEADER } from './http/request-id'
import { sentEmptyBody } from './http/no-body'
import { ServerMetrics } from './http/scrape'
import { isDatabaseError, countDatabaseError } from './db/errors'
import { API_BODY_LIMIT, AUTH_BODY_LIMIT, BODY_DEADLINES, bodyTooSlow } from './http/body-limits'
import { log, logErrorOnce } from './lib/log'
import { DeadlineExceeded, withDeadline } from './lib/with-timeout'
import { STORABLE } from './lib/model'
import { accountRoutes } from './accounts/routes'
import { appRoutes } from './apps/routes'
import { clientIpOf, clientRoutes } from './client-auth/routes'
import { countRefusedRequest } from './client-auth/authorize'
import { docsRoutes } from './http/docs'
import { activationRequestRoutes, offlineFileRoutes } from './licenses/offline/routes'
import { licenseRoutes } from './licenses/routes'
import { metricsRoutes, opsRoutes } from './http/ops'
import { securityRoutes } from './security/routes'
import { variableRoutes } from './variables/routes'
import { webhookRoutes } from './webhooks/routes'

const isPublic = (path: string) => path.startsWith('/auth/') || path === '/auth'
const isRateLimitHeader = (name: string) => /^ratelimit-/i.test(name)

class BodyTooLarge extends Error {}
// Stateless between calls (no streaming), so one decoder serves every request.
const utf8 = new TextDecoder()
/** A /v1 body that is not UTF-8 is refused: decoded leniently, U+FFFD would be stored in place of its bytes. */
const strictUtf8 = new TextDecoder('utf-8', { fatal: true })
class MalformedJson extends Error {}
/** A path parameter's escape that does not decode (wellFormedPath). */
class MalformedPath extends ApiError {
  constructor() {
    super('bad_request', 400, 'The path is not valid percent-encoded UTF-8')
  }
}
/** A parsed body that must not reach validation; the message says why. */
class RefusedBody extends Error {
  /** `body`: what was parsed, when it was (a client endpoint's refused body still names its app). */
  constructor(message: string, readonly body: unknown = undefined) {
    super(message)
  }
}

/**
 * /v1 requests whose body is not a JSON object (null, an array, a scalar, no body). Elysia fills a
 * schema's defaults into such a body before validating it, so its error names a field the client never
 * saw ("appId must be a string") rather than that the body is the wrong kind of value.
 */
const notAnObject = new WeakSet<Request>()
const isJsonObject = (body: unknown) => typeof body === 'object' && body !== null && !Array.isArray(body)

/**
 * How deep a body may nest. This API's bodies nest two levels; JSON.parse takes far deeper ones, and a
 * validation error quoting one (Elysia's JSON.stringify of the value) overflows the stack: a 500.
 */
const MAX_BODY_DEPTH = 32

/**
 * A key JSON.parse keeps as an own property, but which any copy of the object (as filling in defaults
 * does) turns into its prototype: the fields under it would pass as inherited, past the unknown-field
 * check of a strict body.
 */
const PROTO_KEY = '__proto__'
const PROTO_REFUSAL = `Request body may not have a "${PROTO_KEY}" key`

/**
 * Why `value` cannot be validated (nested deeper than MAX_BODY_DEPTH, or a `__proto__` key at any
 * depth), or null. Iterative: no recursion to overflow.
 */
function refusal(value: unknown): string | null {
  if (typeof value !== 'object' || value === null) return null
  // The common body, an object of scalars, is settled without allocating.
  let nested = false
  for (const key in value) {
    if (key === PROTO_KEY) return PROTO_REFUSAL
    const child = (value as Record<string, unknown>)[key]
    if (typeof child === 'object' && child !== null) nested = true
  }
  if (!nested) return null
  const pending: [object, number][] = [[value, 1]]
  for (let next = pending.pop(); next; next = pending.pop()) {
    const [node, depth] = next
    if (depth > MAX_BODY_DEPTH) return `Request body nests deeper than ${MAX_BODY_DEPTH} levels`
    for (const key in node) {
      if (key === PROTO_KEY) return PROTO_REFUSAL
      const child = (node as Record<string, unknown>)[key]
      if (typeof child === 'object' && child !== null) pending.push([child, depth + 1])
    }
  }
  return null
}

/**
 * Whether a URL's path is well-formed percent-encoded UTF-8. Bun's router, which a listening server
 * routes with, decodes a malformed escape (`%zz`, a lone `%E9`) in a path parameter to U+FFFD: the
 * route would then act on a name the client never sent (release another device's seat).
 */
function wellFormedPath(url: string): boolean {
  // A request whose Host Bun refuses has a URL of its path alone.
  const start = url.charCodeAt(0) === 47 ? 0 : url.indexOf('/', url.indexOf('//') + 2)
  const query = url.indexOf('?', start)
  const path = query < 0 ? url.slice(start) : url.slice(start, query)
  if (!path.includes('%')) return true
  try {
    decodeURIComponent(path)
    return true
  } catch {
    return false
  }
}

/**
 * Whether a /v1 request was refused before its route's key check (a transform): its body did not parse
 * or failed the checks made as it is parsed, or its path did not decode. A body too large or too slow
 * is not: the connection closes with it unread, and the key is not worth a lookup.
 */
function refusedBeforeKeyCheck(code: unknown, error: unknown): boolean {
  const errors = [error, (error as Error | undefined)?.cause]
  if (errors.some((e) => e instanceof BodyTooLarge || e instanceof DeadlineExceeded)) return false
  return code === 'PARSE' || errors.some((e) => e instanceof RefusedBody || e instanceof MalformedJson || e instanceof MalformedPath)
}

function errorResponse(path: string, status: number, code: string, message: string, headers: Record<string, string> = {}): Response {
  const body = isPublic(path) ? { status: 'failed', error: code } : { error: code, message }
  return Response.json(body, { status, headers })
}

/** Reads the body's bytes, stopping as soon as they pass `limit`: a chunked body cannot make the server buffer more. */
async function readBounded(request: Request, limit: number): Promise<Uint8Array> {
  if (!request.body) return new Uint8Array(0)
  const chunks: Uint8Array[] = []
  let size = 0
  for await (const chunk of request.body) {
    size += chunk.byteLength
    if (size > limit) throw new BodyTooLarge()
    chunks.push(chunk)
  }
  return chunks.length === 1 ? (chunks[0] as Uint8Array) : Buffer.concat(chunks, size)
}

/** Whether a request sends `text/plain` (its media type, parameters aside). */
const isPlainText = (request: Request) =>
  request.headers.get('content-type')?.split(';')[0]?.trim().toLowerCase() === 'text/plain'

/**
 * Reads a body within the route's limit. Every body is JSON whatever its Content-Type says, except a
 * `text/plain` one on the Developer API: that is a string (an `.authforge-request` pasted as is), which
 * a route without a text body refuses with 400. The client endpoints keep JSON only, as the SDKs send it.
 * An empty JSON body is null, like a JSON `null`: a route that takes a body refuses both with 400. A
 * Developer API body must be UTF-8 (a 400 otherwise); the client endpoints' read stays Bun's own.
 */
async function parseBody(request: Request, path: string): Promise<unknown> {
  const limit = isPublic(path) ? AUTH_BODY_LIMIT : API_BODY_LIMIT
  const declared = Number(request.headers.get('content-length') ?? '0')
  if (declared > limit) throw new BodyTooLarge()
  if (!isPublic(path)) {
    const bytes = await readBounded(request, limit)
    let text: string
    try {
      text = strictUtf8.decode(bytes)
    } catch {
      throw new RefusedBody('Request body is not valid UTF-8')
    }
    if (text === '') sentEmptyBody(request)
    if (isPlainText(request)) return text
    if (text === '') return null
    const body = parsed(text)
    // A JSON string passed the activation-request route's schema as if it were its text/plain body.
    if (typeof body === 'string') throw new RefusedBody('The body must be a JSON object')
    return checked(body)
  }
  // A declared length bounds the body already; Bun's own JSON read is ~1 µs cheaper than the copy below.
  if (declared > 0) {
    let body: unknown
    try {
      body = await request.json()
    } catch {
      throw new MalformedJson()
    }
    return checked(body)
  }
  const bytes = await readBounded(request, limit)
  return bytes.byteLength === 0 ? null : checked(parsed(utf8.decode(bytes)))
}

function parsed(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    throw new MalformedJson()
  }
}

/** A parsed body, unless refusal() finds it must not reach validation. */
function checked(body: unknown): unknown {
  const refused = refusal(body)
  if (refused) throw new RefusedBody(refused, body)
  return body
}

interface SchemaLike {
  type?: string
  anyOf?: SchemaLike[]
  minimum?: number
  maximum?: number
  minLength?: number
  maxLength?: number
  minItems?: number
  maxItems?: number
  enum?: unknown[]
  const?: unknown
  pattern?: string
  format?: string
  /** Chars' bounds, in characters (lib/model.ts). */
  'x-characters'?: [number, number]
  /** What a patterned string is, in words (Timestamp, lib/model.ts). */
  'x-form'?: string
  properties?: Record<string, SchemaLike>
  /** A map's names (its patternProperties enforce them). */
  propertyNames?: SchemaLike
  maxProperties?: number
}

/** What a field must be, in words, from its schema (the numeric-string union Elysia adds is looked through). */
function expected(schema: SchemaLike | undefined): string | null {
  if (!schema) return null
  if (schema.anyOf) {
    const nullable = schema.anyOf.some((s) => s.type === 'null')
    if (nullable) {
      const rest = expected({ anyOf: schema.anyOf.filter((s) => s.type !== 'null') })
      return rest && `${rest} or null`
    }
    if (schema.anyOf.length === 1) return expected(schema.anyOf[0])
    const literals = schema.anyOf.filter((s) => s.const !== undefined).map((s) => JSON.stringify(s.const))
    if (literals.length === schema.anyOf.length) return `one of ${literals.join(', ')}`
    // Elysia's numeric text beside a number is no choice of the client's: the number is what it means.
    const meant = schema.anyOf.filter((s) => !(s.type === 'string' && (s.format === 'numeric' || s.format === 'integer')))
    const scalars = [...new Set(meant.map((s) => s.type))]
    if (scalars.length > 1 && scalars.every((type) => type === 'string' || type === 'number' || type === 'boolean')) {
      return `a ${scalars.slice(0, -1).join(', ')} or ${scalars.at(-1)}`
    }
    const typed = meant.find((s) => s.type === 'integer' || s.type === 'number')
    return expected(typed ?? meant.find((s) => s.type !== 'string') ?? meant[0] ?? schema.anyOf[0])
  }
  if (schema.const !== undefined) return JSON.stringify(schema.const)
  const range = (lo?: number, hi?: number, unit = '') =>
    lo !== undefined && hi !== undefined ? ` from ${lo} to ${hi}${unit}` : lo !== undefined ? ` of at least ${lo}${unit}` : hi !== undefined ? ` of at most ${hi}${unit}` : ''
  switch (schema.type) {
    case 'integer':
      return `an integer${range(schema.minimum, schema.maximum)}`
    case 'number':
      return `a number${range(schema.minimum, schema.maximum)}`
    case 'string': {
      if (schema['x-form']) return schema['x-form']
      const [lo, hi] = schema['x-characters'] ?? [schema.minLength, schema.maxLength]
      return `a string${range(lo || undefined, hi, ' characters')}`
    }
    case 'boolean':
      return 'true or false'
    case 'array':
      return `an array${range(schema.minItems, schema.maxItems, ' items')}`
    case 'object':
      return 'an object'
    default:
      return null
  }
}

interface ValidationIssue {
  type?: number
  path?: string
  message?: string
  schema?: SchemaLike
  value?: unknown
}

/**
 * An object sent where a union (text or object, or objects of different shapes) is expected failed the
 * union as a whole; what the client needs is the complaint of the member it meant (the field it lacks
 * or should not have).
 */
function objectMemberIssue(issue: ValidationIssue | undefined): ValidationIssue | undefined {
  const value = issue?.value
  const members = issue?.schema?.anyOf?.filter((s) => s.type === 'object') ?? []
  if (members.length === 0 || typeof value !== 'object' || value === null || Array.isArray(value)) return issue
  const unnamed = literalIssue(members, value as Record<string, unknown>)
  if (unnamed) return { ...unnamed, path: `${issue?.path ?? ''}${unnamed.path}` }
  const member = meantMember(members, value as Record<string, unknown>)
  const inner = Value.Errors(member as TSchema, value).First()
  return inner ? { ...inner, path: `${issue?.path ?? ''}${inner.path}`, schema: inner.schema as SchemaLike } : issue
}

/** The values a literal field takes (a const, or a union of them); null for any other field. */
const literals = (schema: SchemaLike): unknown[] | null =>
  schema.const !== undefined ? [schema.const] : schema.anyOf?.every((s) => s.const !== undefined) ? schema.anyOf.map((s) => s.const) : null

/**
 * A body whose literal field (the `action`, an entry's `type`) names no member of the union: that field
 * is what is wrong, and it may be any of the members' values. Null when the members have no such field
 * or the body names one of them.
 */
function literalIssue(members: SchemaLike[], value: Record<string, unknown>): ValidationIssue | null {
  for (const name of Object.keys(members[0]?.properties ?? {})) {
    const each = members.map((m) => (m.properties?.[name] ? literals(m.properties[name]) : null))
    if (each.some((values) => values === null)) continue
    const all = each.flat() as unknown[]
    if (!all.includes(value[name])) return { path: `/${name}`, value: value[name], schema: { anyOf: all.map((v) => ({ const: v })) } }
  }
  return null
}

/**
 * The union member a body was meant for: among those whose literal fields it matches (the `action` it
 * names), the one it fails least.
 */
function meantMember(members: SchemaLike[], value: Record<string, unknown>): SchemaLike {
  const named = members.filter((m) =>
    Object.entries(m.properties ?? {}).every(([name, field]) => !(name in value) || (literals(field)?.includes(value[name]) ?? true)),
  )
  const failures = (m: SchemaLike) => {
    let n = 0
    for (const _ of Value.Errors(m as TSchema, value)) if (++n === 10) break
    return n
  }
  const scored = (named.length > 0 ? named : members).map((m) => ({ m, n: failures(m) }))
  return scored.reduce((best, next) => (next.n < best.n ? next : best)).m
}

const unescapeStep = (step: string) => step.replaceAll('~1', '/').replaceAll('~0', '~')

/** Turns Elysia's validation error into a short message naming the field, never the whole schema. */
function validationMessage(error: unknown): string {
  const e = error as { all?: ValidationIssue[]; type?: string }
  const first = objectMemberIssue(e.all?.[0])
  // A JSON pointer's steps, each unescaped (~1 is a '/' of a name, ~0 a '~'), joined by dots.
  const where = first?.path ? first.path.slice(1).split('/').map(unescapeStep).join('.') : (e.type ?? 'request')
  // JSON-quoted: a field name may be anything a client sent, NUL included.
  if (first?.type === ValueErrorType.ObjectAdditionalProperties) {
    // A map (variables) takes any name its propertyNames allow: one it refuses is misnamed, not unknown.
    const names = first.schema?.propertyNames
    if (!names) return `Unknown field ${JSON.stringify(where)}`
    const name = unescapeStep(first.path?.replace(/^.*\//, '') ?? '')
    if (!STORABLE.test(name)) return `The name ${JSON.stringify(name)} must not contain NUL characters or unpaired surrogates`
    return `The name ${JSON.stringify(name)} must be ${expected(names)}`
  }
  if (first?.type === ValueErrorType.ObjectMinProperties) return `The ${where} must hold at least one field`
  if (first?.type === ValueErrorType.ObjectMaxProperties) {
    return `The ${where} must hold at most ${first.schema?.maxProperties} ${first.schema?.propertyNames ? 'names' : 'fields'}`
  }
  // Text's pattern, or Chars' (which counts the characters too): told about only when the text is not storable.
  if (first?.type === ValueErrorType.StringPattern && typeof first.value === 'string' && !STORABLE.test(first.value)) {
    return `${where} must not contain NUL characters or unpaired surrogates`
  }
  const want = expected(first?.schema)
  if (!first?.path && want) return `The ${where} must be ${want}`
  if (first?.path && want) return `${where} must be ${want}`
  return first?.message ? `${where || e.type}: ${first.message}` : `Invalid ${where}`
}

/** What a /v1 body that is not a JSON object was refused for: the route's body, text where it takes text. */
function wrongBodyKind(error: unknown): string {
  const schema = (error as { validator?: { schema?: SchemaLike } }).validator?.schema
  const takesText = schema?.anyOf?.some((s) => s.type === 'string') ?? false
  return takesText ? 'The body must be text or a JSON object' : 'The body must be a JSON object'
}

/**
 * The server's routes. `scrape` is what /metrics answers (main.ts's knows the other server processes;
 * by default this process alone); with METRICS_PORT set, /metrics is on that listener instead, and here 404.
 * The returned app is the one to listen (or to `handle` in-process): the client routes read the peer's
 * address from its server, and mounted inside another app they would see none.
 */
export function createApp(
  ctx: Context,
  scrape = new ServerMetrics(ctx, { kind: 'single' }),
  bodyDeadlines = BODY_DEADLINES,
) {
  const { metrics } = ctx
  // normalize off: Elysia would silently drop unknown body fields; the schemas refuse them instead
  // (StrictBody on /v1, /auth bodies admit them explicitly), and a response that carries a field its
  // schema lacks is an error (500) rather than trimmed. strictPath: a trailing slash would otherwise
  // reach the parent route, and clients collapse a `.` or `..` path segment (an HWID being released) into
  // one: `DELETE /v1/licenses/K/hwids/..` must not become `DELETE /v1/licenses/K`.
  const app = new Elysia({ name: 'license-service', normalize: false, strictPath: true })
  const observation = new HttpObservation(metrics)
  const bodyDeadline = (path: string) => (isPublic(path) ? bodyDeadlines.auth : bodyDeadlines.api)
  const ipOf = clientIpOf(ctx, () => app.server)
  const checkKey = authenticate(ctx)
  /** The key check's refusal (401, 429), or null: a key that checks out, or one that cannot be checked now (the body's fault stands). */
  const keyCheckError = (requestContext: Parameters<typeof checkKey>[0]) =>
    checkKey(requestContext).then(
      () => null,
      (err: unknown) => (err instanceof ApiError ? err : null),
    )
  return app
    .use(observation.plugin)
    .onParse(async ({ request, path }) => {
      if (request.method === 'GET' || request.method === 'HEAD') return
      const body = await withDeadline(parseBody(request, path), bodyDeadline(path), 'the request body')
      if (!isJsonObject(body) && !isPublic(path)) notAnObject.add(request)
      return body
    })
    // Routes with parameters only: the others match their path exactly, and the client endpoints have none.
    .onTransform({ as: 'global' }, ({ request, route }) => {
      if (route.includes(':') && !wellFormedPath(request.url)) throw new MalformedPath()
    })
    .onError(async ({ code, error, path, request, route, set, server }) => {
      // Refused before the route's key check ran: a request without a valid key learns that first (401),
      // as it does of every other fault of its body, and a valid key's answer carries its bucket's headers.
      if (path.startsWith('/v1/') && refusedBeforeKeyCheck(code, error)) {
        const authorization = request.headers.get('authorization') ?? undefined
        error = (await keyCheckError({ request, set, server, headers: { authorization } })) ?? error
      }
      const requestId = requestIdOf(request)
      const reply = (status: number, errorCode: string, message: string, headers: Record<string, string> = {}) => {
        observation.answered(request, route, status)
        return errorResponse(path, status, errorCode, message, { ...headers, [REQUEST_ID_HEADER]: requestId })
      }
      const internalError = () =>
        isPublic(path)
          ? reply(500, 'system_error', 'system_error')
          : reply(500, 'internal_error', 'Something went wrong on our side')
      // A 429 of another limit than the key's bucket (unknown keys from an address, test pings in flight):
      // the bucket's headers, set when the key was checked, would tell the client requests remain.
      if (error instanceof ApiError && error.status === 429 && !Object.keys(error.headers).some(isRateLimitHeader)) {
        for (const name of Object.keys(set.headers)) if (isRateLimitHeader(name)) delete set.headers[name]
      }
      const headers = Object.fromEntries(
        Object.entries(set.headers).filter((e): e is [string, string] => typeof e[1] === 'string'),
      )
      if (error instanceof ApiError) {
        return reply(error.status, error.code, error.message, { ...headers, ...error.headers })
      }
      if (error instanceof PublicError) {
        if (error instanceof LoggedPublicError) log.error(error.note, { requestId, route, ...error.fields })
        return reply(error.status, error.code, error.code, { ...headers, ...error.headers })
      }
      // Elysia wraps what a parse hook throws in its ParseError, with ours as the cause.
      if (error instanceof BodyTooLarge || (error as Error).cause instanceof BodyTooLarge) {
        // The rest of the body is left unread, so the connection cannot carry another request: close it,
        // which also frees a client still sending.
        return reply(413, 'bad_request', 'Request body is too large', { connection: 'close' })
      }
      if (code === 'PARSE' && (error as Error).cause instanceof DeadlineExceeded) {
        // As for a body too large: what is still on its way would be read as the next request.
        return reply(408, 'bad_request', bodyTooSlow(bodyDeadline(path)), { connection: 'close' })
      }
      const refused = error instanceof RefusedBody ? error : (error as Error).cause
      if (refused instanceof RefusedBody) {
        if (!isPublic(path)) return reply(400, 'bad_request', refused.message)
        return countRefusedRequest(ctx, refused.body, ipOf(request)).then(() => reply(400, 'bad_request', refused.message))
      }
      if (error instanceof MalformedJson || code === 'PARSE') {
        return reply(400, 'bad_request', 'Request body is not valid JSON')
      }
      if (code === 'VALIDATION') {
        const on = (error as { type?: string }).type
        if (on === 'body' && notAnObject.has(request)) return reply(400, 'bad_request', wrongBodyKind(error))
        if (on === 'body' && isPublic(path)) {
          return countRefusedRequest(ctx, (error as { value?: unknown }).value, ipOf(request)).then(() =>
            reply(400, 'bad_request', validationMessage(error)),
          )
        }
        if (on !== 'response') return reply(400, 'bad_request', validationMessage(error))
        // The error's message quotes the response, which may hold a secret: the route is all that is logged.
        log.error('response does not match its schema', { requestId, route })
        return internalError()
      }
      if (code === 'NOT_FOUND') {
        return reply(404, 'not_found', 'No such route')
      }
      if (isDatabaseError(error)) countDatabaseError(error)
      // The route pattern, not the path: a path carries license keys, HWIDs and webhook ids.
      logErrorOnce('unhandled error', error, { requestId, route: route || UNMATCHED_ROUTE })
      return internalError()
    })
    .use(opsRoutes(ctx))
    .use(ctx.config.metricsPort === null ? metricsRoutes(scrape) : new Elysia({ name: 'routes-metrics' }))
    .use(docsRoutes(ctx))
    .use(licenseRoutes(ctx))
    .use(offlineFileRoutes(ctx))
    .use(activationRequestRoutes(ctx))
    .use(accountRoutes(ctx))
    .use(appRoutes(ctx))
    .use(variableRoutes(ctx))
    .use(securityRoutes(ctx))
    .use(webhookRoutes(ctx))
    .use(clientRoutes(ctx, ipOf))
}

export type App = ReturnType<typeof createApp>
