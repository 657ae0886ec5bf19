import { type StringOptions, Type } from '@sinclair/typebox'
import { t } from 'elysia'

/**
 * Text that PostgreSQL can store: no NUL character (text and JSON columns refuse it) and no unpaired
 * UTF-16 surrogate (it has no UTF-8 form). Every string a request brings in is checked against it, so
 * such input is a 400 at the edge and never reaches a query or a shared batch.
 */
export const STORABLE_TEXT =
  '^[^\\u0000\\uD800-\\uDFFF]*(?:[\\uD800-\\uDBFF][\\uDC00-\\uDFFF][^\\u0000\\uD800-\\uDFFF]*)*$'

/** A request string: `t.String` limited to storable text (see STORABLE_TEXT). */
export const Text = (options: StringOptions = {}) => t.String({ ...options, pattern: STORABLE_TEXT })

/**
 * A count in a request body: a JSON integer only. TypeBox's own Integer, because Elysia's `t.Integer`
 * also takes numeric text ("0x10", " 3") through a transform.
 */
export const Count = (options: Parameters<typeof Type.Integer>[0] = {}) => Type.Integer(options)

/** A /v1 request body: exactly the documented fields; any other gets 400 naming it. */
export const StrictBody = <T extends Parameters<typeof t.Object>[0]>(
  properties: T,
  options: { description?: string; minProperties?: number } = {},
) => t.Object(properties, { ...options, additionalProperties: false })

/** Developer API error body. */
export const ErrorBody = t.Object(
  {
    error: t.String({ description: 'Machine-readable code', examples: ['bad_request'] }),
    message: t.String({ description: 'Human-readable explanation' }),
  },
)

/** Public client endpoint error body. */
export const PublicErrorBody = t.Object({
  status: t.Literal('failed'),
  error: t.String({ examples: ['invalid_key'] }),
})

const err = (description: string) => ({ ...ErrorBody, description })

/** The error responses every authenticated /v1 route can give; spread into `response`. */
export const apiErrors = {
  400: err('bad_request: invalid or missing parameters'),
  401: err('invalid_api_key: missing, malformed or revoked API key'),
  403: err('forbidden: the app or license belongs to another account'),
  429: err('rate_limited: retry after the Retry-After header'),
  500: err('internal_error'),
} as const

/** The errors of a route that names no app or license: nothing to forbid. */
export const accountErrors = {
  400: apiErrors[400],
  401: apiErrors[401],
  429: apiErrors[429],
  500: apiErrors[500],
} as const

export const notFoundError = { 404: err('not_found') } as const
export const noCreditsError = { 402: err('no_credits: the account has no credits') } as const

export const OkBody = t.Object({ ok: t.Literal(true) })
