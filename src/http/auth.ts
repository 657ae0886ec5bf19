import { and, eq, isNull } from 'drizzle-orm'
import { Elysia } from 'elysia'
import { sha256Hex } from '../core/crypto'
import { apiKeys } from '../db/schema'
import type { Deps } from '../deps'
import { ApiError } from '../errors'
import { takeApiToken } from './rate-limit'

const BEARER = /^Bearer\s+(svc_live_[A-Za-z0-9_-]{16,128})\s*$/

/** SHA-256 of a well-formed bearer key, or null when the header is missing or malformed. */
export function presentedKeyHash(authorization: string | undefined): string | null {
  const match = authorization ? BEARER.exec(authorization) : null
  return match?.[1] ? sha256Hex(match[1]) : null
}

/** The account a Developer API key belongs to, or null for an unknown or revoked key. */
export async function accountForKeyHash(deps: Deps, keyHash: string): Promise<string | null> {
  // The key is looked up by its SHA-256: equality on a digest leaks nothing useful about the key.
  const [row] = await deps.database.db
    .select({ accountId: apiKeys.accountId })
    .from(apiKeys)
    .where(and(eq(apiKeys.keyHash, keyHash), isNull(apiKeys.revokedAt)))
    .limit(1)
  return row?.accountId ?? null
}

const invalidKey = () =>
  new ApiError('invalid_api_key', 401, 'Missing, malformed or revoked API key')

/**
 * `{ apiKey: true }` on a route resolves `accountId` from the bearer key, or answers 401. The rate
 * limit comes first, keyed on the presented key, so a flood of requests never reaches the database.
 */
export const apiKeyAuth = (deps: Deps) =>
  new Elysia({ name: 'api-key-auth' }).macro({
    apiKey: {
      // Every route using the macro is documented as needing the bearer key (docs.ts names the scheme).
      detail: { security: [{ bearerAuth: [] }] },
      async resolve({ headers, set }) {
        const keyHash = presentedKeyHash(headers.authorization)
        if (!keyHash) throw invalidKey()
        Object.assign(set.headers, await takeApiToken(deps, keyHash))
        const accountId = await accountForKeyHash(deps, keyHash)
        if (!accountId) throw invalidKey()
        return { accountId }
      },
    },
  })
