import { t } from 'elysia'

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

export const notFoundError = { 404: err('not_found') } as const
export const noCreditsError = { 402: err('no_credits: the account has no credits') } as const

export const OkBody = t.Object({ ok: t.Literal(true) })
