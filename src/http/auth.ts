import { and, eq, isNull } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { sha256Hex } from '../core/crypto'
import { apiKeys } from '../db/schema'
import type { Deps } from '../deps'
import { ApiError } from '../errors'

const BEARER = /^Bearer\s+(svc_live_[A-Za-z0-9_-]{16,128})\s*$/

/** The account a Developer API key belongs to, or null for a missing, malformed or revoked key. */
export async function accountForApiKey(deps: Deps, authorization: string | undefined): Promise<string | null> {
  const match = authorization ? BEARER.exec(authorization) : null
  if (!match?.[1]) return null
  // The key is looked up by its SHA-256: equality on a digest leaks nothing useful about the key.
  const [row] = await deps.database.db
    .select({ accountId: apiKeys.accountId })
    .from(apiKeys)
    .where(and(eq(apiKeys.keyHash, sha256Hex(match[1])), isNull(apiKeys.revokedAt)))
    .limit(1)
  return row?.accountId ?? null
}

/** `{ apiKey: true }` on a route resolves `accountId` from the bearer key, or answers 401. */
export const apiKeyAuth = (deps: Deps) =>
  new Elysia({ name: 'api-key-auth' }).macro({
    apiKey: {
      async resolve({ headers }) {
        const accountId = await accountForApiKey(deps, headers.authorization)
        if (!accountId) {
          throw new ApiError('invalid_api_key', 401, 'Missing, malformed or revoked API key')
        }
        return { accountId }
      },
    },
  })
