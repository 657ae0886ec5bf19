import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { errorFields, logEvery } from '../lib/log'
import { keys } from '../store/store'

/** Developer API limits from the spec: a burst of 100, sustained 50 requests per second, per API key. */
export const API_BURST = 100
export const API_REFILL_PER_SECOND = 50

/**
 * Takes one token from the presented key's bucket and returns the RateLimit-* headers to send; throws
 * 429 rate_limited when the bucket is empty. `keyHash` is the SHA-256 of the key as presented, so the
 * limit holds before (and whatever) the database says about the key. `requestId` goes on the outage line.
 */
export async function takeApiToken(ctx: Context, keyHash: string, requestId: string): Promise<Record<string, string>> {
  let result
  try {
    result = await ctx.store.take(
      keys.apiBucket(keyHash),
      API_BURST,
      API_REFILL_PER_SECOND,
      ctx.clock(),
    )
  } catch (err) {
    // A limiter outage must not take the API down with it: let the request through and say so.
    logEvery('warn', 'rate-limit store unreachable: Developer API requests are not limited', () => ({ requestId, ...errorFields(err) }))
    return {}
  }
  const headers = {
    'RateLimit-Limit': String(API_BURST),
    'RateLimit-Remaining': String(result.remaining),
    // Seconds until the bucket is full again (success) or holds the next token (429).
    'RateLimit-Reset': String(
      result.ok
        ? Math.ceil((API_BURST - result.remaining) / API_REFILL_PER_SECOND)
        : Math.ceil(result.retryAfterMs / 1000),
    ),
  }
  if (!result.ok) {
    throw new ApiError(
      'rate_limited',
      429,
      'Too many requests for this API key; retry after the Retry-After header',
      {
        ...headers,
        'Retry-After': String(Math.max(1, Math.ceil(result.retryAfterMs / 1000))),
      },
    )
  }
  return headers
}
