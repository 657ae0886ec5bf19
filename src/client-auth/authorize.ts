import { type CachedApp, type CachedLicense, StoreUnavailable } from '../actors/load'
import type { Context } from '../context'
import { LoggedPublicError, PublicError } from '../lib/errors'
import { errorFields, logEvery } from '../lib/log'
import { withDeadline } from '../lib/with-timeout'
import type { AuthorizeInput, AuthorizeResult, Shard } from '../store/store'
import { keys, STORE_CALL_TIMEOUT_MS } from '../store/store'
import { APP_ID_MAX_LENGTH } from './model'
import { type Bucket, canonicalAppId, ceiling, type Outcome, rateLimited } from './policy'

const MAX_ATTEMPTS = 5
/**
 * Stale answers after which a request reads its app and license from PostgreSQL for itself and asks the
 * store with no epoch to compare: an app whose owner writes to it many times a second (each write bumps
 * its epoch) moved on during every reload, and its clients got 500s. A row read now is as fresh as a
 * request served without the cache can be.
 */
const STALE_ATTEMPTS = 3

/**
 * What one request asks of the store, minus the epochs (added from the cache entries used). A plan
 * made without the license that fails with `invalid_key` means the license decides: only then is it
 * looked up, after `ipBucket` (also one of `buckets`) gave a token.
 */
export type Plan = Omit<AuthorizeInput, 'nowMs' | 'shard' | 'generation' | 'epochs' | 'deny'> & { outcome: Outcome; ipBucket: Bucket | null }

/**
 * Each endpoint's rules: what a request with this app and license gets, and what it costs. `shard` is
 * the app's account's (worked out once per request), whose tag the plan's keys carry; '' without an app.
 */
export type Planner = (app: CachedApp | null, license: CachedLicense | null, nowMs: number, shard: Shard) => Plan

/**
 * Who asks for what: `licenseKey` is null when a session named none; a nonce claim fails closed
 * without the store. `requestId` names the request on the lines logged for it.
 */
export interface AuthRequest {
  ip: string
  requestId: string
  appId: string
  licenseKey: string | null
  needsNonce: boolean
}

export interface Authorized {
  app: CachedApp
  license: CachedLicense | null
  outcome: Outcome & { ok: true }
  charged: number
  /** The store generation the charge was made under, for its refund (AuthorizeResult). */
  chargedUnder: string
  /** The heartbeat counter the call moved (charged or not), for its uncount; null for any other call. */
  counted: string | null
}

/**
 * Runs what follows an authorization (a seat's bind, the signature) and gives its charge back if that
 * fails: the client is answered an error, and a retry would be charged again.
 */
export async function refundingOnFailure<T>(ctx: Context, auth: Authorized, work: () => Promise<T>): Promise<T> {
  try {
    return await work()
  } catch (err) {
    if (auth.charged > 0) await ctx.credits.refund(auth.app.accountId, auth.charged, auth.chargedUnder)
    if (auth.counted) await ctx.credits.uncount(auth.counted, auth.chargedUnder)
    throw err
  }
}

/**
 * How a lookup reads the app: into the cache (an entry) or from PostgreSQL alone, while the store is
 * unreachable (the app itself). A lookup joins only one of its own kind, whose answer has its shape.
 */
type AppRead = 'cache' | 'database'

/**
 * An app id this process does not hold costs a read before any limit can apply, so an IP may look up
 * only so many that turn out not to exist (absentAppBudget). Past that it is refused without a read,
 * whether the app exists or not: `rate_limited`, which a client retries, as `invalid_app` would tell
 * a real app's client (one behind the same NAT as a scanner) that its credentials are wrong.
 */
async function lookUpApp<T>(
  ctx: Context,
  ip: string,
  appId: string,
  read: AppRead,
  nowMs: number,
  lookup: () => Promise<T>,
  absent: (found: T) => boolean,
): Promise<T> {
  const budget = ctx.actors.absentAppBudget
  const looked = await budget.lookUp(ip, `${read}\n${appId}`, nowMs, ctx.clock, lookup, absent)
  if (!looked) throw rateLimited(budget.retryAfterMs(ip, nowMs))
  return looked.found
}

/** The app's cache entry, loaded within the IP's budget for absent apps; undefined when it went before it could be read. */
const loadAppEntry = (ctx: Context, ip: string, appId: string, nowMs: number) =>
  lookUpApp(ctx, ip, appId, 'cache', nowMs, async () => {
    await ctx.actors.ensureApp(appId)
    return ctx.actors.cachedApp(appId)
  }, (entry) => entry?.value === null)

/** Whether a plan made without the license failed only for want of it: the caller may look it up. */
const licenseDecides = (p: Plan) => !p.outcome.ok && p.outcome.code === 'invalid_key'

/** A store call that counts a sandbox app's daily ceiling and nothing else. */
const CEILING_ONLY = { epochs: [], buckets: [], nonce: null, deny: false, charge: null }

/** The store's answer to `input`; its failure is the store's (StoreUnavailable). */
async function authorizeInStore(ctx: Context, input: AuthorizeInput): Promise<AuthorizeResult> {
  try {
    return await ctx.store.authorize(input)
  } catch (err) {
    throw new StoreUnavailable(err)
  }
}

/**
 * A public request refused as malformed counts all the same against the sandbox app it names (the
 * contract: the ceiling counts every request naming the app, accepted or not), so a client cannot go
 * past it with requests the schema refuses. The answer stays the 400 whatever the count; a lookup or
 * store failure leaves the request uncounted, as the store's outage leaves every request.
 */
export async function countRefusedRequest(ctx: Context, body: unknown, ip: string): Promise<void> {
  const named = typeof body === 'object' && body !== null ? (body as { appId?: unknown }).appId : undefined
  if (typeof named !== 'string' || named.length > APP_ID_MAX_LENGTH) return
  const appId = canonicalAppId(named)
  const { actors } = ctx
  const nowMs = ctx.clock()
  try {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      // As in authorize: the generation before the entry, which a load on the way may move on.
      const generation = actors.generation
      const entry = actors.cachedApp(appId) ?? (await loadAppEntry(ctx, ip, appId, nowMs))
      const app = entry?.value
      if (!app?.sandbox) return
      const shard = ctx.store.shardOf(app.accountId)
      const counted = await authorizeInStore(ctx, { ...CEILING_ONLY, ceiling: ceiling(ctx.config, app, shard, nowMs), nowMs, shard, generation })
      if (counted.kind !== 'new_generation') return
      actors.startOver(counted.generation)
    }
  } catch (err) {
    if (!(err instanceof StoreUnavailable || err instanceof PublicError)) logEvery('warn', 'a refused request naming an app went uncounted', () => errorFields(err))
  }
}

/**
 * Runs one request through the app's cached state, the endpoint's plan and the store script,
 * reloading and retrying when the script reports a stale entry or an unloaded balance. Without a
 * nonce the request fails open when the store is unreachable (fresh rows from PostgreSQL, no limits,
 * no charge); with one it fails closed.
 */
export async function authorize(ctx: Context, request: AuthRequest, plan: Planner): Promise<Authorized> {
  const { ip, appId, licenseKey } = request
  const { actors } = ctx
  const nowMs = ctx.clock()
  // Set once an IP token was taken to admit a license lookup; the script then leaves that bucket out.
  let admitted: Bucket | null = null
  // Set once the sandbox ceiling counted this request ahead of its lookup; the script then leaves it out.
  let ceilingCounted = false
  let stale = 0
  try {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      // The generation the entries below are read under, taken before any of them: a load awaited on the
      // way may move the registry to a newer one (emptying it), and an entry read before that move must
      // not be checked as if it belonged to the new one (the store then answers new_generation).
      const generation = actors.generation
      const fresh = stale >= STALE_ATTEMPTS ? await freshEntries(ctx, request, plan, nowMs) : null
      let appEntry = fresh?.app ?? actors.cachedApp(appId)
      // Awaited only on a miss: the common all-cached request skips a promise and a microtask turn.
      if (!appEntry) {
        // Undefined when the entry went before it could be read (the registry started over): looked up again.
        appEntry = await loadAppEntry(ctx, ip, appId, nowMs)
        if (!appEntry) continue
      }
      const app = appEntry.value
      const shard = app ? ctx.store.shardOf(app.accountId) : ''
      let licenseEntry = licenseKey === null ? undefined : (fresh?.license ?? actors.cachedLicense(appId, licenseKey))
      let p = plan(app, licenseEntry?.value ?? null, nowMs, shard)
      if (licenseKey !== null && !licenseEntry && licenseDecides(p)) {
        // The app secret (or session), the app's state and its lists passed: only now may the key reach
        // PostgreSQL, and only with a token of the caller's IP limit, so unauthenticated traffic and a
        // flood of made-up keys stop before the database.
        // A token for every lookup, a retry's too (its entry went before use): reads never outnumber tokens.
        const token: Bucket | null = ctx.config.publicRateLimits ? p.ipBucket : null
        // The sandbox ceiling counts every request naming the app before the other limits: before the
        // lookup takes a token (or is refused one) and reads PostgreSQL.
        if (p.ceiling && !ceilingCounted) {
          const counted = await authorizeInStore(ctx, { ...CEILING_ONLY, ceiling: p.ceiling, nowMs, shard, generation })
          if (counted.kind === 'new_generation') {
            actors.startOver(counted.generation)
            continue
          }
          if (counted.kind === 'quota') throw new PublicError('demo_quota_exceeded')
          ceilingCounted = true
        }
        const read = await actors.ensureLicense(appId, licenseKey, token ? { ...token, nowMs } : undefined)
        if (read.kind === 'limited') throw rateLimited(read.retryAfterMs)
        admitted = token
        licenseEntry = actors.cachedLicense(appId, licenseKey)
        if (!licenseEntry) continue
        p = plan(app, licenseEntry.value, nowMs, shard)
      }
      const license = licenseEntry?.value ?? null
      if (!app) throw new PublicError('invalid_app')
      const epochs = fresh ? [] : [{ key: keys.appEpoch(shard, appId), expected: appEntry.epoch }]
      if (!fresh && licenseKey !== null && licenseEntry) epochs.push({ key: keys.licenseEpoch(shard, licenseKey), expected: licenseEntry.epoch })
      const { outcome, ipBucket: _, ...rest } = p
      if (!ctx.config.publicRateLimits) rest.buckets = []
      else if (admitted) rest.buckets = rest.buckets.filter((b) => b.key !== admitted!.key)
      if (ceilingCounted) rest.ceiling = null
      const result = await authorizeInStore(ctx, { ...rest, nowMs, shard, generation, epochs, deny: !outcome.ok })
      switch (result.kind) {
        case 'new_generation':
          actors.startOver(result.generation)
          continue
        case 'stale':
          // The next attempt reads its rows for itself: reloading the entries too would read them twice.
          if (++stale >= STALE_ATTEMPTS) continue
          if (result.epochs[0] !== appEntry.epoch) await actors.reloadApp(appId, result.epochs[0] ?? 0, generation)
          if (licenseKey !== null && result.epochs[1] !== licenseEntry?.epoch) {
            // Read again at once only for a caller that may look the license up at all.
            if (licenseDecides(plan(app, null, nowMs, shard))) await actors.reloadLicense(appId, licenseKey, result.epochs[1] ?? 0, generation)
            else actors.forgetLicense(appId, licenseKey)
          }
          continue
        case 'no_balance':
          // Each store call of the seed has a deadline of its own; this one bounds the whole seed, its
          // PostgreSQL read too, to one.
          await withDeadline(ctx.credits.loadLiveBalance(app.accountId), STORE_CALL_TIMEOUT_MS, 'a balance load').catch((err: unknown) => {
            throw new StoreUnavailable(err)
          })
          continue
        case 'quota':
          throw new PublicError('demo_quota_exceeded')
        case 'limited':
          throw rateLimited(result.retryAfterMs)
        case 'replay':
          throw new PublicError('replay_detected')
        case 'no_credits':
          throw new PublicError('no_credits')
        case 'denied':
          throw new PublicError(outcome.ok ? 'system_error' : outcome.code)
        case 'ok':
          if (!outcome.ok) throw new PublicError(outcome.code)
          return { app, license, outcome, charged: result.charged, chargedUnder: result.chargedUnder, counted: rest.charge?.counter?.key ?? null }
      }
    }
    throw new LoggedPublicError('system_error', 'client request kept finding stale cache entries', { appId })
  } catch (err) {
    if (!(err instanceof StoreUnavailable)) throw err
    return withoutStore(ctx, request, plan, err, nowMs)
  }
}

/**
 * The request's app and license read from PostgreSQL now, as entries no epoch is compared with (see
 * STALE_ATTEMPTS). The license only for a caller the cached path would let look it up (the app secret
 * or session, the app's state and lists passed): for another it is left absent, as it decides nothing.
 */
async function freshEntries(ctx: Context, { appId, licenseKey }: AuthRequest, plan: Planner, nowMs: number) {
  const app = await ctx.actors.loadApp(appId)
  const shard = app ? ctx.store.shardOf(app.accountId) : ''
  const lookUp = licenseKey !== null && app !== null && licenseDecides(plan(app, null, nowMs, shard))
  const license = lookUp ? await ctx.actors.loadLicense(licenseKey) : null
  return { app: { value: app, epoch: 0 }, license: licenseKey === null ? undefined : { value: license, epoch: 0 } }
}

/** The store is unreachable: a request that needs a nonce claim fails closed, the others are served from PostgreSQL. */
async function withoutStore(
  ctx: Context,
  { ip, appId, licenseKey, needsNonce, requestId }: AuthRequest,
  plan: Planner,
  err: StoreUnavailable,
  nowMs: number,
): Promise<Authorized> {
  const { actors } = ctx
  if (needsNonce) {
    logEvery('warn', 'store unreachable: refusing requests that need a nonce claim', () => ({ requestId, ...errorFields(err.cause) }))
    throw new PublicError('system_error')
  }
  logEvery('warn', 'store unreachable: serving requests without limits or charges', () => ({ requestId, ...errorFields(err.cause) }))
  // An app this process holds is no made-up id: it reads what any of its clients' requests reads here.
  const loadApp = () => actors.loadApp(appId)
  const [app, license] = await Promise.all([
    actors.cachedApp(appId)?.value ? loadApp() : lookUpApp(ctx, ip, appId, 'database', nowMs, loadApp, (found) => found === null),
    licenseKey === null ? null : actors.loadLicense(licenseKey),
  ])
  const { outcome } = plan(app, license, nowMs, app ? ctx.store.shardOf(app.accountId) : '')
  if (!app) throw new PublicError('invalid_app')
  if (!outcome.ok) throw new PublicError(outcome.code)
  return { app, license, outcome, charged: 0, chargedUnder: '', counted: null }
}
