import { eq } from 'drizzle-orm'
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

/** What a Developer API key's hash names: a live key's account, a revoked key, or (null) no key at all. */
type KeyLookup = { accountId: string } | 'revoked' | null

async function lookUpKeyHash(ctx: Context, keyHash: string): Promise<KeyLookup> {
  // The key is looked up by its SHA-256: equality on a digest leaks nothing useful about the key.
  const [row] = await ctx.database.db
    .select({ accountId: apiKeys.accountId, revokedAt: apiKeys.revokedAt })
    .from(apiKeys)
    .where(eq(apiKeys.keyHash, keyHash))
    .limit(1)
  if (!row) return null
  return row.revokedAt === null ? { accountId: row.accountId } : 'revoked'
}

const invalidKey = () =>
  new ApiError('invalid_api_key', 401, 'Missing, malformed or revoked API key')

/**
 * Lookups of keys that turn out unknown, per client IP and minute: each random key has a full bucket of
 * its own (the limit is per key), so without this one IP could make every request a PostgreSQL read.
 * A vendor's backend presenting its real keys never spends it.
 */
export const UNKNOWN_API_KEYS_PER_MINUTE = 60

/** How many keys found live or revoked a process remembers (Context.knownApiKeys). */
export const KNOWN_API_KEYS = 10_000

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
    // A key found live before is still looked up on every request (a revocation holds at once), and skips
    // the budget, as a key found revoked does (no key comes back from revocation, so it is answered without
    // a read): a revoked key still in use on a vendor's host (a forgotten cron job) must not spend the
    // lookups its address's live keys need, the replacement's first use included.
    const known = ctx.knownApiKeys.get(keyHash)
    if (known === 'revoked') throw invalidKey()
    let found: KeyLookup
    if (known === 'live') {
      found = await lookUpKeyHash(ctx, keyHash)
    } else {
      const looked = await ctx.unknownApiKeys.lookUp(ip, keyHash, nowMs, ctx.clock, () => lookUpKeyHash(ctx, keyHash), (key) => key === null)
      if (!looked) {
        const retryAfter = String(Math.max(1, Math.ceil(ctx.unknownApiKeys.retryAfterMs(ip, nowMs) / 1000)))
        throw new ApiError('rate_limited', 429, 'Too many unknown API keys from this address; retry after the Retry-After header', {
          'Retry-After': retryAfter,
        })
      }
      found = looked.found
    }
    if (found === null) {
      ctx.knownApiKeys.delete(keyHash)
      throw invalidKey()
    }
    if (found === 'revoked') {
      ctx.knownApiKeys.set(keyHash, 'revoked')
      throw invalidKey()
    }
    ctx.knownApiKeys.set(keyHash, 'live')
    requestContext.accountId = found.accountId
  }
}

/**
 * `{ apiKey: true }` on a route resolves `accountId` from the bearer key, or answers 401. It runs at
 * `transform`, before body validation, so a request without a valid key learns that first (401, not 400);
 * a body or path refused before `transform` (it did not parse) has its key checked by app.ts's onError.
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
