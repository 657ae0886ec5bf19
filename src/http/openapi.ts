import { t } from 'elysia'
import { BODY_DEADLINES, bodyTooSlow } from './body-limits'
import { type ApiErrorCode, PUBLIC_ERROR_STATUS, type PublicErrorCode } from '../lib/errors'

/**
 * What routes declare for the OpenAPI document beyond their request and response models. Error responses:
 * one per status, its `error` an enum of exactly the codes the route can give at that status. The errors
 * themselves are thrown (ApiError, PublicError) and written by the app's onError, so these schemas only
 * describe them: no handler returns them, so no response is checked against them.
 */

/**
 * A route's `detail[ALSO_SERVES]`: the media types a response has besides JSON (content negotiation), by
 * status, which `response` schemas cannot say. The document's transform (docs.ts) adds them to the responses.
 */
export const ALSO_SERVES = 'x-also-serves'

/**
 * A route's `detail[RESPONSE_HEADERS]`: headers of its own that a response carries, by status, as OpenAPI
 * Header Objects. The headers every response or every Developer API response carries are the transform's.
 */
export const RESPONSE_HEADERS = 'x-response-headers'

const seconds = { type: 'integer', minimum: 0 } as const

/**
 * The headers the server sends on many responses, as the document's `components.headers`; the transform
 * (docs.ts) refers each response to those it carries.
 */
export const SHARED_HEADERS = {
  'X-Request-Id': {
    description:
      "The request's id, on every response: the client's or a proxy's `X-Request-Id` when it is 1 to 128 of " +
      'letters, digits and `-_.:`, else a new one. Every log line of the request carries it.',
    required: true,
    schema: { type: 'string', pattern: '^[A-Za-z0-9_.:-]{1,128}$', examples: ['7f3a9c1e2b4d-1a'] },
  },
  'RateLimit-Limit': {
    description:
      "The API key's burst (requests). Sent once the key is well-formed and the body parsed, unless the rate-limit " +
      "store is unreachable (the limit is then not applied) or a 429 comes from another limit than the key's bucket " +
      "(the address's unknown keys, test pings in flight).",
    schema: { ...seconds, examples: [100] },
  },
  'RateLimit-Remaining': {
    description: "Requests left in the key's bucket after this one; sent with RateLimit-Limit.",
    schema: { ...seconds, examples: [99] },
  },
  'RateLimit-Reset': {
    description: 'Seconds until the bucket is full again (on a 429: until it holds the next token); sent with RateLimit-Limit.',
    schema: { ...seconds, examples: [1] },
  },
  'Retry-After': {
    description: 'Seconds to wait before the next request has a token.',
    required: true,
    schema: { ...seconds, minimum: 1, examples: [1] },
  },
} as const

/** Retry-After on a client endpoint's 429: only `rate_limited` sends it, a quota or credits failure does not. */
export const PUBLIC_RETRY_AFTER = {
  description: 'With `rate_limited` only: seconds to wait before the limit admits the next request.',
  schema: SHARED_HEADERS['Retry-After'].schema,
}

interface ErrorCase {
  status: number
  /** When the code is given, for the response's description. */
  when: string
  /** A message the API really sends with it: the document's example. */
  message: string
}

/** Every Developer API error code: its status, when it is given and a message it comes with. */
const API_ERRORS = {
  bad_request: {
    status: 400,
    when: 'a parameter or body field is missing or invalid, or the body is not JSON',
    message: 'quantity must be an integer from 1 to 100',
  },
  invalid_api_key: {
    status: 401,
    when: 'the bearer key is missing, malformed or revoked',
    message: 'Missing, malformed or revoked API key',
  },
  no_credits: {
    status: 402,
    when: 'the account has no credits left',
    message: 'The account has no credits left; add credits to create licenses',
  },
  forbidden: {
    status: 403,
    when: 'the app (or the license) is not one of this account',
    message: 'App not found in this account',
  },
  not_found: { status: 404, when: 'no such license (or webhook, or HWID bound)', message: 'No license K7QM-3XWT-9HFP-2RDN' },
  seats_full: {
    status: 409,
    when: 'more new HWIDs than free seats (nothing is bound)',
    message: '2 new HWIDs but 1 free seats',
  },
  license_inactive: { status: 409, when: 'the license is revoked or expired', message: 'License K7QM-3XWT-9HFP-2RDN is revoked' },
  app_disabled: {
    status: 409,
    when: 'the app is disabled',
    message: 'The app is disabled: enable it to mint offline files',
  },
  hwid_blocked: {
    status: 409,
    when: "an HWID of the file is refused by the app's HWID blacklist or whitelist, or a file for any machine by its whitelist",
    message: "HWID 1 of the file is refused by the app's HWID blacklist or whitelist",
  },
  rate_limited: {
    status: 429,
    when:
      "the API key's budget is spent, the client address's budget of unknown API keys (a key found live before skips it), or on a test ping the account's test pings on their way are at their limit: retry after the Retry-After header (seconds)",
    message: 'Too many requests for this API key; retry after the Retry-After header',
  },
  internal_error: { status: 500, when: 'an unexpected failure', message: 'Something went wrong on our side' },
} as const satisfies Record<ApiErrorCode, ErrorCase>

/** A body over the route's limit: the contract keeps the code `bad_request` and makes the status 413. */
const TOO_LARGE = (limit: string) => `\`bad_request\`: the body is over ${limit}`
/** A body still arriving at the route's deadline (app.ts's BODY_DEADLINES): the connection is closed. */
const TOO_SLOW = (ms: number) =>
  `\`bad_request\`: the body was not all there within ${ms / 1000} s of the request's head; the connection is closed`

/** When each client endpoint failure is given (the contract's table). */
const PUBLIC_ERRORS: Record<PublicErrorCode, string> = {
  bad_request: 'a field is missing, mistyped or oversized, or the body is not JSON',
  invalid_app: 'unknown app or wrong app secret',
  invalid_key: 'no such license in this app',
  session_expired: 'unknown, expired or mismatched session (or its HWID was released)',
  replay_detected: 'the nonce was already used',
  blocked: 'an IP or HWID list rejected the caller',
  app_disabled: 'the app is disabled',
  hwid_mismatch: 'every seat of the license is taken by other HWIDs',
  revoke_requires_session: 'revokeLicense asked for without a session',
  expired: 'the license has expired',
  revoked: 'the license is revoked',
  rate_limited: 'a per-IP or per-license limit: retry after the Retry-After header (seconds)',
  demo_quota_exceeded: "the sandbox app's daily ceiling is reached",
  no_credits: 'the account has no credits left',
  system_error: 'an unexpected failure',
}

/**
 * One schema per status, for the codes of that status in the order given. The keys are typed as the literal
 * statuses of `codes` (`statusOf` returns them from an `as const` table): Object.fromEntries cannot say so.
 */
function schemasByStatus<C extends string, S extends number, Body>(
  codes: readonly C[],
  statusOf: (code: C) => S,
  body: (group: C[]) => Body,
): ErrorResponses<S, Body> {
  const groups = new Map<S, C[]>()
  for (const code of codes) {
    const status = statusOf(code)
    groups.set(status, [...(groups.get(status) ?? []), code])
  }
  return Object.fromEntries([...groups].map(([status, group]) => [status, body(group)])) as ErrorResponses<S, Body>
}

// An enum of the codes; UnionEnum's own default (the first code) would read as the usual failure.
const codeEnum = (codes: readonly string[], description: string) =>
  t.UnionEnum(codes as [string, ...string[]], { description, default: undefined })

const describe = <C extends string>(codes: readonly C[], whenOf: (code: C) => string) =>
  codes.map((code) => `\`${code}\`: ${whenOf(code)}`).join('; ')

function apiErrorBody(codes: readonly ApiErrorCode[], description: string, message: string) {
  return t.Object(
    {
      error: codeEnum(codes, 'Machine-readable code'),
      message: t.String({ description: 'Human-readable explanation' }),
    },
    { description, examples: [{ error: codes[0]!, message }] },
  )
}

/** What every authenticated request can fail with, whatever the route. */
const EVERY_API_ROUTE = ['invalid_api_key', 'rate_limited', 'internal_error'] as const satisfies ApiErrorCode[]
type EveryApiRoute = (typeof EVERY_API_ROUTE)[number]

type ApiStatus<C extends ApiErrorCode> = (typeof API_ERRORS)[C]['status']
type EveryPublicRoute = 'bad_request' | 'rate_limited' | 'system_error'
type ApiErrorBody = ReturnType<typeof apiErrorBody>
/**
 * The statuses as literal keys, as a hand-written `{ 404: … }` would have them: a typed client (Eden)
 * reads a route's error statuses and bodies from these keys, and an index signature would hide them.
 */
type ErrorResponses<S extends number, Body> = { [Status in S]: Body }

/**
 * The error responses of a Developer API route that reads no body (a GET): the key check, the rate
 * limit and an unexpected failure, plus `codes`, what the route's own checks give.
 */
export function apiErrors<C extends ApiErrorCode>(...codes: C[]): ErrorResponses<ApiStatus<C | EveryApiRoute>, ApiErrorBody> {
  const all = [...new Set<C | EveryApiRoute>([...codes, ...EVERY_API_ROUTE])]
  return schemasByStatus(
    all,
    (c) => API_ERRORS[c].status,
    (group) => apiErrorBody(group, describe(group, (c) => API_ERRORS[c].when), API_ERRORS[group[0]!].message),
  )
}

/**
 * The error responses of a Developer API route that reads a body (every method but GET, even one that
 * takes none: the body is parsed, and refused, before the route runs): `apiErrors` with `bad_request`
 * at 400 (malformed JSON, an unknown field), 408 and 413.
 */
export function apiBodyErrors<C extends ApiErrorCode>(...codes: C[]) {
  return {
    ...apiErrors<C | 'bad_request'>('bad_request', ...codes),
    408: apiErrorBody(['bad_request'], TOO_SLOW(BODY_DEADLINES.api), bodyTooSlow(BODY_DEADLINES.api)),
    413: apiErrorBody(['bad_request'], TOO_LARGE('1 MiB'), 'Request body is too large'),
  }
}

function publicErrorBody(codes: readonly PublicErrorCode[], description: string) {
  return t.Object(
    { status: t.Literal('failed'), error: codeEnum(codes, 'Machine-readable code') },
    { description, examples: [{ status: 'failed', error: codes[0]! }] },
  )
}

/**
 * The failures of a client endpoint (`{ status: "failed", error }`): malformed or oversized bodies, the
 * limits and an unexpected failure, plus `codes`, what the endpoint's own checks give. Statuses come
 * from the contract's table (PUBLIC_ERROR_STATUS).
 */
export function publicErrors<C extends PublicErrorCode>(...codes: C[]) {
  const all = [...new Set<C | EveryPublicRoute>(['bad_request', ...codes, 'rate_limited', 'system_error'])]
  return {
    ...schemasByStatus(
      all,
      (c) => PUBLIC_ERROR_STATUS[c],
      (group) => publicErrorBody(group, describe(group, (c) => PUBLIC_ERRORS[c])),
    ),
    408: publicErrorBody(['bad_request'], TOO_SLOW(BODY_DEADLINES.auth)),
    413: publicErrorBody(['bad_request'], TOO_LARGE('16 KiB')),
  }
}
