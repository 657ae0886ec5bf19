import { createHash, timingSafeEqual } from 'node:crypto'
import { and, eq } from 'drizzle-orm'
import { licenses } from '../db/schema'
import type { Context } from '../context'
import { PublicError, type PublicErrorCode } from '../lib/errors'
import { errorFields, log, logEvery } from '../lib/log'
import { type AuthorizeInput, type AuthorizeResult, keys } from '../store/store'
import { AuthCache, type CachedApp, type CachedLicense, StoreUnavailable } from '../actors/app-cache'
import { recordEvents } from '../delivery/outbox'
import { invalidate } from '../actors/invalidate'
import { SeatBinder } from '../actors/seat-binder'
import { EventBatch } from './validated-events'
import { appendEntry } from '../security/service'
import { clampTtl, issueSession, MAX_SESSION_TTL, readSession, type Session } from './session'

/** The spec's sandbox limits (per minute) and the contract's heartbeat pricing. */
const SANDBOX = { validateIp: 20, validateLicense: 60, heartbeatIp: 20, selfbanIp: 20, selfbanLicense: 30 }
const HEARTBEATS_PER_CREDIT = 10
/** A nonce is remembered for the longest session lifetime, per app. */
const NONCE_TTL_SECONDS = MAX_SESSION_TTL
const MAX_ATTEMPTS = 5

/** Per-Context state of the client endpoints: the caches, the license.validated batch and the seat binder. */
interface Runtime {
  cache: AuthCache
  events: EventBatch
  binder: SeatBinder
}
const runtimes = new WeakMap<Context, Runtime>()

function runtime(ctx: Context): Runtime {
  let rt = runtimes.get(ctx)
  if (!rt) {
    rt = { cache: new AuthCache(ctx), events: new EventBatch(ctx), binder: new SeatBinder(ctx) }
    runtimes.set(ctx, rt)
  }
  return rt
}

/** Background work of the client endpoints; stop() flushes what is pending (call before closing storage). */
export function startClientAuth(ctx: Context): { stop(): Promise<void> } {
  return {
    async stop() {
      await runtime(ctx).events.stop()
    },
  }
}

/** How often the client endpoints read PostgreSQL for app and license state (for tests and metrics). */
export function clientAuthLoads(ctx: Context): { apps: number; licenses: number } {
  return { ...runtime(ctx).cache.loads }
}

/** Writes pending license.validated events now (tests and shutdown). */
export function flushValidatedEvents(ctx: Context): Promise<void> {
  return runtime(ctx).events.flush()
}

type Outcome = { ok: true; bind: boolean } | { ok: false; code: PublicErrorCode }
const fail = (code: PublicErrorCode): Outcome => ({ ok: false, code })

type Bucket = AuthorizeInput['buckets'][number]

/**
 * What one request asks of the store, minus the epochs (added from the cache entries used). A plan
 * made without the license that fails with `invalid_key` means the license decides: only then is it
 * looked up, after `ipBucket` (also one of `buckets`) gave a token.
 */
type Plan = Omit<AuthorizeInput, 'nowMs' | 'generation' | 'epochs' | 'deny'> & { outcome: Outcome; ipBucket: Bucket | null }

interface Authorized {
  app: CachedApp
  license: CachedLicense | null
  outcome: Outcome & { ok: true }
  charged: number
}

/** Whether a plan made without the license failed only for want of it: the caller may look it up. */
const licenseDecides = (p: Plan) => !p.outcome.ok && p.outcome.code === 'invalid_key'

function secretMatches(presented: string, hash: Buffer): boolean {
  const got = createHash('sha256').update(presented, 'utf8').digest()
  return got.length === hash.length && timingSafeEqual(got, hash)
}

/** The spec's list order: IP blacklist, IP whitelist, HWID blacklist, HWID whitelist. */
function listsAllow(app: CachedApp, ip: string, hwid: string): boolean {
  if (app.ipBlacklist.has(ip)) return false
  if (app.ipWhitelist.size > 0 && !app.ipWhitelist.has(ip)) return false
  if (app.hwidBlacklist.has(hwid)) return false
  if (app.hwidWhitelist.size > 0 && !app.hwidWhitelist.has(hwid)) return false
  return true
}

function licenseState(license: CachedLicense | null, app: CachedApp, nowMs: number): PublicErrorCode | null {
  if (!license || license.appId !== app.id) return 'invalid_key'
  if (license.status === 'revoked') return 'revoked'
  if (license.expiresAt && license.expiresAt.getTime() <= nowMs) return 'expired'
  return null
}

function ceiling(ctx: Context, app: CachedApp, nowMs: number): AuthorizeInput['ceiling'] {
  if (!app.sandbox) return null
  const day = new Date(nowMs).toISOString().slice(0, 10)
  const nextMidnight = Date.parse(`${day}T00:00:00.000Z`) + 86_400_000
  // Kept an hour past midnight: the key names its day, so the next day starts from zero regardless.
  return {
    key: keys.daily(app.id, day),
    limit: ctx.config.sandboxDailyCeiling,
    ttlSeconds: Math.ceil((nextMidnight - nowMs) / 1000) + 3600,
  }
}

const bucket = (scope: string, appId: string, id: string, perMinute: number) => ({
  key: keys.bucket(`${scope}:${appId}`, id),
  capacity: perMinute,
  refillPerSecond: perMinute / 60,
})

const rateLimited = (retryAfterMs: number) =>
  new PublicError('rate_limited', { 'retry-after': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) })

/**
 * Runs one request through cache, evaluation and the store script, reloading and retrying when the
 * script reports a stale cache entry or an unloaded balance. Without a nonce the request fails open
 * when the store is unreachable (fresh rows from PostgreSQL, no limits, no charge); with one it fails
 * closed.
 */
async function authorize(
  ctx: Context,
  ip: string,
  appId: string,
  licenseKey: string | null,
  needsNonce: boolean,
  plan: (app: CachedApp | null, license: CachedLicense | null, nowMs: number) => Plan,
): Promise<Authorized> {
  const { cache } = runtime(ctx)
  const nowMs = ctx.clock()
  // Set once the IP token was taken to admit the license lookup; the script then leaves that bucket out.
  let admitted: Bucket | null = null
  try {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      let appEntry = cache.cachedApp(appId)
      // Awaited only on a miss: the common all-cached request skips a promise and a microtask turn.
      if (!appEntry) {
        if (!cache.absentApps.allows(ip, nowMs)) throw new PublicError('invalid_app')
        await cache.ensureApp(appId)
        appEntry = cache.cachedApp(appId)
        if (!appEntry) continue
        if (appEntry.value === null) cache.absentApps.charge(ip, nowMs)
      }
      const app = appEntry.value
      let licenseEntry = licenseKey === null ? undefined : cache.cachedLicense(licenseKey)
      let p = plan(app, licenseEntry?.value ?? null, nowMs)
      if (licenseKey !== null && !licenseEntry && licenseDecides(p)) {
        // The app secret (or session), the app's state and its lists passed: only now may the key reach
        // PostgreSQL, and only with a token of the caller's IP limit, so unauthenticated traffic and a
        // flood of made-up keys stop before the database.
        const token: Bucket | null = ctx.config.publicRateLimits && !admitted ? p.ipBucket : null
        const read = await cache.ensureLicense(licenseKey, token ? { ...token, nowMs } : undefined)
        if (read.kind === 'limited') throw rateLimited(read.retryAfterMs)
        admitted ??= token
        licenseEntry = cache.cachedLicense(licenseKey)
        if (!licenseEntry) continue
        p = plan(app, licenseEntry.value, nowMs)
      }
      const license = licenseEntry?.value ?? null
      if (!app) throw new PublicError('invalid_app')
      const epochs = [{ key: keys.appEpoch(appId), expected: appEntry.epoch }]
      if (licenseKey !== null && licenseEntry) epochs.push({ key: keys.licenseEpoch(licenseKey), expected: licenseEntry.epoch })
      const { outcome, ipBucket: _, ...rest } = p
      if (!ctx.config.publicRateLimits) rest.buckets = []
      else if (admitted) rest.buckets = rest.buckets.filter((b) => b.key !== admitted!.key)
      const generation = cache.generation
      let result: AuthorizeResult
      try {
        result = await ctx.store.authorize({ ...rest, nowMs, generation, epochs, deny: !outcome.ok })
      } catch (err) {
        throw new StoreUnavailable(err)
      }
      switch (result.kind) {
        case 'new_generation':
          cache.startOver(result.generation)
          continue
        case 'stale':
          if (result.epochs[0] !== appEntry.epoch) await cache.reloadApp(appId, result.epochs[0] ?? 0, generation)
          if (licenseKey !== null && result.epochs[1] !== licenseEntry?.epoch) {
            // Read again at once only for a caller that may look the license up at all.
            if (licenseDecides(plan(app, null, nowMs))) await cache.reloadLicense(licenseKey, result.epochs[1] ?? 0, generation)
            else cache.forgetLicense(licenseKey)
          }
          continue
        case 'no_balance':
          await ctx.credits.loadLiveBalance(app.accountId).catch((err: unknown) => {
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
          return { app, license, outcome, charged: result.charged }
      }
    }
    log.error('client request kept finding stale cache entries', { appId })
    throw new PublicError('system_error')
  } catch (err) {
    if (!(err instanceof StoreUnavailable)) throw err
    if (needsNonce) {
      logEvery('warn', 'store unreachable: refusing requests that need a nonce claim', () => errorFields(err.cause))
      throw new PublicError('system_error')
    }
    logEvery('warn', 'store unreachable: serving requests without limits or charges', () => errorFields(err.cause))
    if (!cache.absentApps.allows(ip, nowMs)) throw new PublicError('invalid_app')
    const [app, license] = await Promise.all([
      cache.loadApp(appId),
      licenseKey === null ? null : cache.loadLicense(licenseKey),
    ])
    const { outcome } = plan(app, license, nowMs)
    if (!app) {
      cache.absentApps.charge(ip, nowMs)
      throw new PublicError('invalid_app')
    }
    if (!outcome.ok) throw new PublicError(outcome.code)
    return { app, license, outcome, charged: 0 }
  }
}

export interface ValidateInput {
  appId: string
  appSecret: string
  licenseKey: string
  hwid: string
  nonce: string
  ttlSeconds?: number
}

export interface SignedResponse {
  status: 'success'
  payload: string
  signature: string
  keyId: string
}

/** POST /auth/validate: authenticate the app, claim the nonce, check the license, bind the seat, charge, sign. */
export async function validate(ctx: Context, input: ValidateInput, ip: string): Promise<SignedResponse> {
  const { hwid, licenseKey } = input
  const auth = await authorize(ctx, ip, input.appId, licenseKey, true, (app, license, nowMs) => {
    const secretOk = app !== null && secretMatches(input.appSecret, app.secretHash)
    let outcome: Outcome
    if (!app || !secretOk) outcome = fail('invalid_app')
    else if (app.disabled) outcome = fail('app_disabled')
    else if (!listsAllow(app, ip, hwid)) outcome = fail('blocked')
    else {
      const state = licenseState(license, app, nowMs)
      if (state) outcome = fail(state)
      else if (license!.unlimitedHwidSlots || license!.hwids.includes(hwid)) outcome = { ok: true, bind: false }
      else if (license!.hwids.length >= license!.maxHwidSlots) outcome = fail('hwid_mismatch')
      else outcome = { ok: true, bind: true }
    }
    const sandbox = app?.sandbox ?? false
    const ipBucket = app ? bucket('v:ip', app.id, ip, sandbox ? SANDBOX.validateIp : ctx.config.validateLimitPerIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx, app, nowMs) : null,
      ipBucket,
      // Only a caller holding the app secret counts against a license's limit: anyone who merely names
      // a key (and random keys would each leave a bucket in the store) spends their IP's tokens alone.
      buckets: !ipBucket
        ? []
        : secretOk
          ? [ipBucket, bucket('v:lic', app!.id, licenseKey, sandbox ? SANDBOX.validateLicense : ctx.config.validateLimitPerLicense)]
          : [ipBucket],
      // A nonce is consumed by any validate that passes app authentication (the contract).
      nonce: secretOk ? { key: keys.nonce(input.appId, input.nonce), ttlSeconds: NONCE_TTL_SECONDS } : null,
      charge: outcome.ok && !sandbox && app ? { accountId: app.accountId, cost: 1, counter: null } : null,
    }
  })
  const { app } = auth
  let license = auth.license!
  if (auth.outcome.bind) {
    try {
      license = await bindHwid(ctx, app, license.key, hwid)
    } catch (err) {
      if (auth.charged > 0) await ctx.store.refund(app.accountId, auth.charged)
      throw err
    }
  }
  const nowMs = ctx.clock()
  if (app.wantsValidated) {
    runtime(ctx).events.add({
      event: 'license.validated',
      data: { licenseKey, appId: app.id, status: 'active', hwid },
      occurredAt: new Date(nowMs),
    })
  }
  const ttl = clampTtl(input.ttlSeconds, ctx.config.sessionTtlSeconds)
  const session = issueSession(ctx.sessionKey, { app: app.id, lic: licenseKey, hwid, ttl }, nowMs)
  return signedResponse(ctx, app, license, hwid, session, input.nonce, nowMs)
}

/** Binds a new HWID through the app's seat binder, then reports the license as it now stands. */
async function bindHwid(ctx: Context, app: CachedApp, licenseKey: string, hwid: string): Promise<CachedLicense> {
  const { cache, binder } = runtime(ctx)
  const bound = await binder.bind(app.id, licenseKey, hwid)
  // Reloaded under a freshly read epoch, so the next request of this HWID is served from the cache.
  cache.forgetLicense(licenseKey)
  await cache.ensureLicense(licenseKey)
  const current = cache.cachedLicense(licenseKey)?.value ?? (await cache.loadLicense(licenseKey))
  if (bound && current) return current
  const state = current ? licenseState(current, app, ctx.clock()) : 'invalid_key'
  if (state) throw new PublicError(state)
  // Bound meanwhile by a concurrent validate of the same HWID: that is a pass, not a mismatch.
  if (current!.hwids.includes(hwid)) return current!
  throw new PublicError('hwid_mismatch')
}

export interface HeartbeatInput {
  appId: string
  sessionToken: string
  hwid: string
  nonce?: string
}

/** Session checks shared by heartbeat and post-session selfban: token, app and HWID must all match. */
function sessionFor(ctx: Context, appId: string, token: string, hwid: string): Session | null {
  const session = readSession(ctx.sessionKey, token, ctx.clock())
  return session && session.app === appId && session.hwid === hwid ? session : null
}

/** POST /auth/heartbeat: re-checks the license on every call, so revocations reach clients at once. */
export async function heartbeat(ctx: Context, input: HeartbeatInput, ip: string): Promise<SignedResponse> {
  const session = sessionFor(ctx, input.appId, input.sessionToken, input.hwid)
  const auth = await authorize(ctx, ip, input.appId, session?.lic ?? null, false, (app, license, nowMs) => {
    let outcome: Outcome
    if (!app) outcome = fail('invalid_app')
    else if (!session) outcome = fail('session_expired')
    else if (app.disabled) outcome = fail('app_disabled')
    else if (!listsAllow(app, ip, input.hwid)) outcome = fail('blocked')
    else {
      const state = licenseState(license, app, nowMs)
      if (state) outcome = fail(state)
      // A reset HWID ends the session: the client logs in again, which binds it afresh.
      else if (!license!.unlimitedHwidSlots && !license!.hwids.includes(input.hwid)) outcome = fail('session_expired')
      else outcome = { ok: true, bind: false }
    }
    const ipBucket = app?.sandbox ? bucket('h:ip', app.id, ip, SANDBOX.heartbeatIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx, app, nowMs) : null,
      ipBucket,
      buckets: ipBucket ? [ipBucket] : [],
      nonce: null,
      charge:
        outcome.ok && app && !app.sandbox && session
          ? { accountId: app.accountId, cost: 1, counter: { key: keys.heartbeats(session.lic), every: HEARTBEATS_PER_CREDIT } }
          : null,
    }
  })
  const nowMs = ctx.clock()
  const renewed = issueSession(ctx.sessionKey, { app: auth.app.id, lic: session!.lic, hwid: input.hwid, ttl: session!.ttl }, nowMs)
  return signedResponse(ctx, auth.app, auth.license!, input.hwid, renewed, input.nonce, nowMs)
}

/**
 * The signed payload is JSON with a fixed field order (sessionToken, expiresIn, sessionExpiresAt,
 * timestamp, nonce?, appId, licenseKey, hwid, licenseExpiresAt, unlimitedHwidSlots, maxHwidSlots,
 * hwidCount, licenseLabel, appVariables, licenseVariables). The fields that only change when the app
 * or the license is reloaded are serialized once per cache entry (entries are replaced, never
 * mutated, on reload) by the same JSON.stringify, so the text is byte for byte what one
 * JSON.stringify of the whole object gives.
 */
const payloadTails = new WeakMap<CachedLicense, { app: CachedApp; head: string; tail: string }>()

function payloadParts(app: CachedApp, license: CachedLicense, hwid: string): string {
  let parts = payloadTails.get(license)
  if (!parts || parts.app !== app) {
    const head = JSON.stringify({ appId: app.id, licenseKey: license.key })
    const tail = JSON.stringify({
      licenseExpiresAt: license.expiresAt ? license.expiresAt.toISOString() : null,
      unlimitedHwidSlots: license.unlimitedHwidSlots,
      maxHwidSlots: license.maxHwidSlots,
      hwidCount: license.hwids.length,
      licenseLabel: license.label,
      appVariables: app.variables,
      licenseVariables: license.variables,
    })
    parts = { app, head: head.slice(1, -1), tail: tail.slice(1) }
    payloadTails.set(license, parts)
  }
  return `${parts.head},"hwid":${JSON.stringify(hwid)},${parts.tail}`
}

// Many requests share one clock second or millisecond: the last text of each is kept.
let lastSeconds = Number.NaN
let lastSecondsIso = ''
let lastMillis = Number.NaN
let lastMillisIso = ''

function isoSeconds(unixSeconds: number): string {
  if (unixSeconds !== lastSeconds) {
    lastSecondsIso = new Date(unixSeconds * 1000).toISOString()
    lastSeconds = unixSeconds
  }
  return lastSecondsIso
}

function isoMillis(ms: number): string {
  if (ms !== lastMillis) {
    lastMillisIso = new Date(ms).toISOString()
    lastMillis = ms
  }
  return lastMillisIso
}

async function signedResponse(
  ctx: Context,
  app: CachedApp,
  license: CachedLicense,
  hwid: string,
  session: { token: string; session: Session },
  nonce: string | undefined,
  nowMs: number,
): Promise<SignedResponse> {
  if (!app.signing) {
    log.error('app has no active signing key', { appId: app.id })
    throw new PublicError('system_error')
  }
  const exp = session.session.exp
  const json =
    `{"sessionToken":${JSON.stringify(session.token)},"expiresIn":${JSON.stringify(exp)},` +
    `"sessionExpiresAt":"${isoSeconds(exp)}","timestamp":"${isoMillis(nowMs)}"` +
    `${nonce === undefined ? '' : `,"nonce":${JSON.stringify(nonce)}`},${payloadParts(app, license, hwid)}`
  const payload = Buffer.from(json, 'utf8').toString('base64')
  const { keyId, key } = app.signing
  return { status: 'success', payload, signature: await ctx.signer.sign(keyId, key, payload), keyId }
}

export interface SelfbanInput {
  appId: string
  hwid: string
  appSecret?: string
  licenseKey?: string
  nonce?: string
  sessionToken?: string
  revokeLicense?: boolean
  blacklistHwid?: boolean
  blacklistIp?: boolean
}

export interface SelfbanResult {
  status: 'success'
  mode: 'pre_session' | 'post_session'
  performed: { revokeLicense: boolean; blacklistHwid: boolean; blacklistIp: boolean }
}

/**
 * POST /auth/selfban. Pre-session (appSecret + licenseKey + nonce) never revokes; post-session (a
 * session token) revokes by default. `performed` reports only changes this request made.
 */
export async function selfban(ctx: Context, input: SelfbanInput, ip: string): Promise<SelfbanResult> {
  const post = input.sessionToken !== undefined
  if (!post && (input.appSecret === undefined || input.licenseKey === undefined || input.nonce === undefined)) {
    throw new PublicError('bad_request')
  }
  const session = post ? sessionFor(ctx, input.appId, input.sessionToken!, input.hwid) : null
  const licenseKey = post ? (session?.lic ?? null) : input.licenseKey!
  const revoke = input.revokeLicense ?? post
  const auth = await authorize(ctx, ip, input.appId, licenseKey, !post, (app, license, nowMs) => {
    const secretOk = post || (app !== null && secretMatches(input.appSecret!, app.secretHash))
    let outcome: Outcome
    if (!app || !secretOk) outcome = fail('invalid_app')
    else if (post && !session) outcome = fail('session_expired')
    else if (app.disabled) outcome = fail('app_disabled')
    else if (!post && revoke) outcome = fail('revoke_requires_session')
    else if (!license || license.appId !== app.id) outcome = fail('invalid_key')
    else outcome = { ok: true, bind: false }
    const sandbox = app?.sandbox ?? false
    const perIp = sandbox ? SANDBOX.selfbanIp : ctx.config.selfbanLimitPerIp
    const perLicense = sandbox ? SANDBOX.selfbanLicense : ctx.config.selfbanLimitPerLicense
    const ipBucket = app ? bucket('s:ip', app.id, ip, perIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx, app, nowMs) : null,
      ipBucket,
      buckets: !ipBucket ? [] : secretOk && licenseKey ? [ipBucket, bucket('s:lic', app!.id, licenseKey, perLicense)] : [ipBucket],
      nonce: !post && secretOk ? { key: keys.nonce(input.appId, input.nonce!), ttlSeconds: NONCE_TTL_SECONDS } : null,
      charge: null,
    }
  })
  const mode = post ? 'post_session' : 'pre_session'
  const performed = { revokeLicense: false, blacklistHwid: false, blacklistIp: false }
  // The sandbox runs the whole production path and then changes nothing.
  if (auth.app.sandbox) return { status: 'success', mode, performed }
  return {
    status: 'success',
    mode,
    performed: await applySelfban(ctx, auth.app, auth.license!.key, {
      revokeLicense: post && revoke,
      blacklistHwid: input.blacklistHwid ?? true,
      blacklistIp: input.blacklistIp ?? true,
      hwid: input.hwid,
      ip,
    }),
  }
}

async function applySelfban(
  ctx: Context,
  app: CachedApp,
  licenseKey: string,
  want: { revokeLicense: boolean; blacklistHwid: boolean; blacklistIp: boolean; hwid: string; ip: string },
): Promise<SelfbanResult['performed']> {
  const performed = await ctx.mailbox.run(app.id, () =>
    ctx.database.db.transaction(async (tx) => {
      const done = { revokeLicense: false, blacklistHwid: false, blacklistIp: false }
      const now = new Date(ctx.clock())
      if (want.revokeLicense) {
        const rows = await tx
          .update(licenses)
          .set({ status: 'revoked' })
          .where(and(eq(licenses.key, licenseKey), eq(licenses.appId, app.id), eq(licenses.status, 'active')))
          .returning({ key: licenses.key })
        done.revokeLicense = rows.length > 0
        if (done.revokeLicense) {
          await recordEvents(tx, [
            { event: 'license.revoked', data: { licenseKey, appId: app.id, reason: 'selfban' }, occurredAt: now },
          ])
        }
      }
      if (want.blacklistHwid) done.blacklistHwid = await appendEntry(tx, app.id, 'hwidBlacklist', want.hwid)
      if (want.blacklistIp) done.blacklistIp = await appendEntry(tx, app.id, 'ipBlacklist', want.ip)
      return done
    }),
  )
  const bumps: string[] = []
  if (performed.blacklistHwid || performed.blacklistIp) bumps.push(keys.appEpoch(app.id))
  if (performed.revokeLicense) bumps.push(keys.licenseEpoch(licenseKey))
  await invalidate(ctx, bumps)
  if (performed.revokeLicense) ctx.bus.notify()
  return performed
}
