import { and, eq, isNull } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { sha256Hex } from '../lib/crypto'
import { apiKeys } from '../db/schema'
import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { requestIdOf } from './metrics'
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

/** The request's own Elysia context: transform, resolve and the handler all see this one object. */
interface AuthContext {
  request: Request
  headers: Record<string, string | undefined>
  set: { headers: Record<string, unknown> }
  /** Set once the key checked out: the account it belongs to. */
  accountId?: string
}

/**
 * The API-key check as a `transform` hook: rate limit first (keyed on the presented key, so a flood
 * never reaches the database), then the key lookup. Idempotent per request, so a route whose own
 * transform must run after authentication can list it first.
 */
export const authenticate =
  (ctx: Context) =>
  async (requestContext: AuthContext): Promise<void> => {
    if (requestContext.accountId !== undefined) return
    const keyHash = presentedKeyHash(requestContext.headers.authorization)
    if (!keyHash) throw invalidKey()
    Object.assign(requestContext.set.headers, await takeApiToken(ctx, keyHash, requestIdOf(requestContext.request)))
    const accountId = await accountForKeyHash(ctx, keyHash)
    if (!accountId) throw invalidKey()
    requestContext.accountId = accountId
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
