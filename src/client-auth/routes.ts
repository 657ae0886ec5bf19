import { Elysia } from 'elysia'
import { heartbeat } from './heartbeat'
import { selfban } from './selfban'
import { validate } from './validate'
import type { Context } from '../context'
import { ClientAddresses } from '../http/client-ip'
import { requestIdOf } from '../http/metrics'
import { publicErrors } from '../http/openapi'
import { SIGNED_PAYLOAD_MODEL } from '../signing/model'
import { HeartbeatBody, SelfbanBody, SelfbanResponse, SignedPayload, SignedResponse, ValidateBody } from './model'

const tags = ['Client authentication']
// The app secret or session token in the body authenticates: no bearer key.
const security: [] = []

/** What every request naming an app can fail with before the endpoint's own checks: the app, its sandbox ceiling. */
const APP_CHECKS = ['invalid_app', 'app_disabled', 'demo_quota_exceeded'] as const

/** The listening server, whose peer addresses the client IPs come from; null in-process (app.handle). */
export type ListeningServer = () => { requestIP(r: Request): { address: string } | null } | null

/**
 * The client IP of a request to the client endpoints, by TRUSTED_PROXIES. `server` is read per request
 * rather than the handler context's `server`: Elysia defines that as a getter on every request's
 * context, an Object.defineProperty per request on the hot path.
 */
export function clientIpOf(ctx: Context, server: ListeningServer): (request: Request) => string {
  const addresses = new ClientAddresses(ctx.config.trustedProxies)
  return (request) => addresses.of(server()?.requestIP(request)?.address ?? null, request.headers.get('x-forwarded-for'))
}

/** The client endpoints; `ipOf` is clientIpOf's. */
export const clientRoutes = (ctx: Context, ipOf: (request: Request) => string) =>
  new Elysia({ name: 'routes-client', prefix: '/auth' })
    .model({ [SIGNED_PAYLOAD_MODEL]: SignedPayload })
    .post('/validate', (context) => validate(ctx, context.body, ipOf(context.request), requestIdOf(context.request)), {
      body: ValidateBody,
      response: {
        200: SignedResponse,
        ...publicErrors(...APP_CHECKS, 'replay_detected', 'blocked', 'invalid_key', 'expired', 'revoked', 'hwid_mismatch', 'no_credits'),
      },
      detail: {
        operationId: 'validateLicense',
        security,
        tags,
        summary: 'Log in with a license key',
        description:
          'Authenticates the app (appId + appSecret), claims the nonce (once per app for 7 days), applies ' +
          'the IP and HWID lists (IP blacklist, IP whitelist, HWID blacklist, HWID whitelist), checks the ' +
          'license, binds the HWID to a free seat, charges 1 credit on billed apps and returns a payload ' +
          'signed with the app key. Unlimited-seat keys bind nothing and never give hwid_mismatch.',
      },
    })
    .post('/heartbeat', (context) => heartbeat(ctx, context.body, ipOf(context.request), requestIdOf(context.request)), {
      body: HeartbeatBody,
      response: {
        200: SignedResponse,
        ...publicErrors(...APP_CHECKS, 'session_expired', 'blocked', 'invalid_key', 'expired', 'revoked', 'no_credits'),
      },
      detail: {
        operationId: 'sendHeartbeat',
        security,
        tags,
        summary: 'Refresh a session',
        description:
          'Checks the session token and the license again (revoked, expired, deleted or reset fails at ' +
          'once) and returns a fresh token with the same lifetime. Every 10th heartbeat of a license ' +
          'costs 1 credit on billed apps. The optional nonce is echoed, not enforced.',
      },
    })
    .post('/selfban', (context) => selfban(ctx, context.body, ipOf(context.request), requestIdOf(context.request)), {
      body: SelfbanBody,
      response: {
        200: SelfbanResponse,
        ...publicErrors(...APP_CHECKS, 'session_expired', 'replay_detected', 'revoke_requires_session', 'invalid_key'),
      },
      detail: {
        operationId: 'reportTampering',
        security,
        tags,
        summary: 'Report tampering',
        description:
          'Pre-session (appSecret, licenseKey, nonce) or post-session (sessionToken). Blacklists the HWID ' +
          'and the caller IP by default; post-session also revokes the license by default, pre-session ' +
          'refuses revokeLicense with revoke_requires_session. `performed` lists only changes this call ' +
          'made (an entry already listed, a full list or an already revoked license report false). On a ' +
          'sandbox app it succeeds and changes nothing.',
      },
    })
