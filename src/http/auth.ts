import { and, eq, isNull } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { sha256Hex } from '../lib/crypto'
import { apiKeys } from '../db/schema'
import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { requestIdOf } from './metrics'
import { ClientAddresses } from './client-ip'
import { takeApiToken } from './rate-limit'

// Case-insensitive for the scheme's sake (RFC 9110 section 11.1); a key in other case hashes to no key.
const BEARER = /^bearer\s+(svc_live_[A-Za-z0-9_-]{16,128})\s*$/i

/** SHA-256 of a well-formed bearer key, or null when the header is missing or malformed. */
export function presentedKeyHash(authorization: string | undefined): string | null {
  const match = authorization ? BEARER.exec(authorization) : null
  return match?.[1] ? sha256Hex(match[1]) : null
}

/** The account a Developer API key belongs to, or null for an unknown or revoked key. */
export async function accountForKeyHash(ctx: Context, keyHash: string): Promise<string | null> {
  // The key is looked up by its SHA-256: equality on a digest leaks nothing useful about the key.
  const [row] = await ctx.database.db
    .select({ accountId: apiKeys.accountId })
    .from(apiKeys)
    .where(and(eq(apiKeys.keyHash, keyHash), isNull(apiKeys.revokedAt)))
    .limit(1)
  return row?.accountId ?? null
}

const invalidKey = () =>
  new ApiError('invalid_api_key', 401, 'Missing, malformed or revoked API key')

/**
 * Lookups of keys that turn out unknown, per client IP and minute: each random key has a full bucket of
 * its own (the limit is per key), so without this one IP could make every request a PostgreSQL read.
 * A vendor's backend presenting its real keys never spends it.
 */
export const UNKNOWN_API_KEYS_PER_MINUTE = 60

/** How many keys found live a process remembers (Context.liveApiKeys). */
export const LIVE_API_KEYS = 10_000

/** The request's own Elysia context: transform, resolve and the handler all see this one object. */
interface AuthContext {
  request: Request
  headers: Record<string, string | undefined>
  set: { headers: Record<string, unknown> }
  /** The listening server; null in-process (app.handle). */
  server: { requestIP(request: Request): { address: string } | null } | null
  /** Set once the key checked out: the account it belongs to. */
  accountId?: string
}

/**
 * The API-key check as a `transform` hook: rate limit first (keyed on the presented key, so a flood
 * of one key never reaches the database), then the key lookup, unless the client's IP has used up its
 * lookups of unknown keys (a flood of made-up ones). Idempotent per request, so a route whose own
 * transform must run after authentication can list it first.
 */
export const authenticate = (ctx: Context) => {
  const addresses = new ClientAddresses(ctx.config.trustedProxies)
  return async (requestContext: AuthContext): Promise<void> => {
    if (requestContext.accountId !== undefined) return
    const { request } = requestContext
    const keyHash = presentedKeyHash(requestContext.headers.authorization)
    if (!keyHash) throw invalidKey()
    Object.assign(requestContext.set.headers, await takeApiToken(ctx, keyHash, requestIdOf(request)))
    const ip = addresses.of(requestContext.server?.requestIP(request)?.address ?? null, request.headers.get('x-forwarded-for'))
    const nowMs = ctx.clock()
    // Still looked up on every request (a revocation holds at once), a key found live before skips the
    // budget: a revoked key still in use on a vendor's host (a forgotten cron job) spends its address's
    // lookups, and must not lock that host's live keys out with it.
    let accountId: string | null
    if (ctx.liveApiKeys.has(keyHash)) {
      accountId = await accountForKeyHash(ctx, keyHash)
      // Found live before and gone now (revoked): it spends a lookup as an unknown key does.
      if (accountId === null) ctx.unknownApiKeys.spend(ip, ctx.clock())
    } else {
      const looked = await ctx.unknownApiKeys.lookUp(ip, keyHash, nowMs, ctx.clock, () => accountForKeyHash(ctx, keyHash), (id) => id === null)
      if (!looked) {
        const retryAfter = String(Math.max(1, Math.ceil(ctx.unknownApiKeys.retryAfterMs(ip, nowMs) / 1000)))
        throw new ApiError('rate_limited', 429, 'Too many unknown API keys from this address; retry after the Retry-After header', {
          'Retry-After': retryAfter,
        })
      }
      accountId = looked.found
    }
    if (!accountId) {
      ctx.liveApiKeys.delete(keyHash)
      throw invalidKey()
    }
    ctx.liveApiKeys.set(keyHash, true)
    requestContext.accountId = accountId
  }
}

/**
 * `{ apiKey: true }` on a route resolves `accountId` from the bearer key, or answers 401. It runs at
 * `transform`, before body validation, so a request without a valid key learns that first (401, not 400).
 */
export const apiKeyAuth = (ctx: Context) =>
  new Elysia({ name: 'api-key-auth' }).macro({
    apiKey: {
      // Every route using the macro is documented as needing the bearer key (docs.ts names the scheme).
      detail: { security: [{ bearerAuth: [] }] },
      transform: authenticate(ctx),
      resolve(requestContext: AuthContext) {
        if (requestContext.accountId === undefined) throw invalidKey()
        return { accountId: requestContext.accountId }
      },
    },
  })
