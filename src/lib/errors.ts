/** Developer API error codes (body `{ error, message }`). */
export type ApiErrorCode =
  | 'bad_request'
  | 'invalid_api_key'
  | 'no_credits'
  | 'forbidden'
  | 'not_found'
  | 'seats_full'
  | 'license_inactive'
  | 'app_disabled'
  | 'hwid_blocked'
  | 'rate_limited'
  | 'internal_error'

/** Public client endpoint error codes (body `{ status: "failed", error }`), with their HTTP status. */
export const PUBLIC_ERROR_STATUS = {
  bad_request: 400,
  invalid_app: 401,
  invalid_key: 401,
  session_expired: 401,
  replay_detected: 401,
  blocked: 403,
  app_disabled: 403,
  hwid_mismatch: 403,
  revoke_requires_session: 403,
  expired: 410,
  revoked: 410,
  rate_limited: 429,
  demo_quota_exceeded: 429,
  no_credits: 429,
  system_error: 500,
} as const
export type PublicErrorCode = keyof typeof PUBLIC_ERROR_STATUS

/** Thrown anywhere on /v1; the app's onError turns it into the spec's body. */
export class ApiError extends Error {
  constructor(
    readonly code: ApiErrorCode,
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message)
  }
}

/** Thrown anywhere on /auth; the status comes from the contract's table. */
export class PublicError extends Error {
  readonly status: number
  constructor(
    readonly code: PublicErrorCode,
    readonly headers: Record<string, string> = {},
  ) {
    super(code)
    this.status = PUBLIC_ERROR_STATUS[code]
  }
}

/**
 * A failure on our side that the client sees only as its code: app.ts's onError logs `note` with the
 * request's id, which the code that threw does not hold.
 */
export class LoggedPublicError extends PublicError {
  constructor(
    code: PublicErrorCode,
    readonly note: string,
    readonly fields: Record<string, unknown>,
  ) {
    super(code)
  }
}

export const badRequest = (message: string) => new ApiError('bad_request', 400, message)
export const forbidden = (message = 'This resource does not belong to your account') =>
  new ApiError('forbidden', 403, message)
export const notFound = (message: string) => new ApiError('not_found', 404, message)
