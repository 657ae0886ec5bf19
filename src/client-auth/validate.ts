import { type CachedApp, type CachedLicense, StoreUnavailable } from '../actors/load'
import type { Context } from '../context'
import { PublicError } from '../lib/errors'
import { countResult } from '../lib/metrics'
import { keys } from '../store/store'
import { authorize, refundingOnFailure } from './authorize'
import type { SignedReply, ValidateInput } from './model'
import {
  bucket,
  canonicalAppId,
  ceiling,
  fail,
  licenseState,
  listsAllow,
  NONCE_TTL_SECONDS,
  type Outcome,
  perIpBucket,
  SANDBOX,
  secretMatches,
} from './policy'
import { clampTtl } from '../signing/session'

/** POST /auth/validate: authenticate the app, claim the nonce, check the license, bind the seat, charge, sign. */
export const validate = (ctx: Context, input: ValidateInput, ip: string, requestId: string): Promise<SignedReply> =>
  countResult(ctx.metrics.validations, validateAndSign(ctx, input, ip, requestId))

async function validateAndSign(ctx: Context, input: ValidateInput, ip: string, requestId: string): Promise<SignedReply> {
  const { hwid, licenseKey } = input
  const appId = canonicalAppId(input.appId)
  const auth = await authorize(ctx, { ip, requestId, appId, licenseKey, needsNonce: true }, (app, license, nowMs, shard) => {
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
    const ipBucket = app ? perIpBucket(shard, 'v:ip', app.id, ip, sandbox ? SANDBOX.validateIp : ctx.config.validateLimitPerIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx.config, app, shard, nowMs) : null,
      ipBucket,
      // Only a caller holding the app secret counts against a license's limit: anyone who merely names
      // a key (and random keys would each leave a bucket in the store) spends their IP's tokens alone.
      buckets: !ipBucket
        ? []
        : secretOk
          ? [ipBucket, bucket(shard, 'v:lic', app!.id, licenseKey, sandbox ? SANDBOX.validateLicense : ctx.config.validateLimitPerLicense)]
          : [ipBucket],
      // A nonce is consumed by any validate that passes app authentication (the contract).
      nonce: secretOk ? { key: keys.nonce(shard, appId, input.nonce), ttlSeconds: NONCE_TTL_SECONDS } : null,
      charge: outcome.ok && !sandbox && app ? { accountId: app.accountId, cost: 1, counter: null } : null,
    }
  })
  const { app } = auth
  const license = auth.outcome.bind
    ? await refundingOnFailure(ctx, auth, () => bindHwid(ctx, app, auth.license!, hwid))
    : auth.license!
  const nowMs = ctx.clock()
  const ttl = clampTtl(input.ttlSeconds, ctx.config.sessionTtlSeconds)
  const session = ctx.sessions.issue({ app: app.id, lic: licenseKey, hwid, ttl }, license.expiresAt, nowMs)
  const signed = await refundingOnFailure(ctx, auth, () => ctx.payloads.sign(app, license, hwid, session, input.nonce, nowMs))
  // Recorded once the client is answered with a signed payload: a validate answered as failed was none.
  if (app.wantsValidated) {
    ctx.validatedEvents.add({
      event: 'license.validated',
      data: { licenseKey, appId: app.id, status: 'active', hwid },
      occurredAt: new Date(nowMs),
    })
  }
  return signed
}

/** Binds a new HWID through the app's actor, then reports the license as it now stands. */
async function bindHwid(ctx: Context, app: CachedApp, license: CachedLicense, hwid: string): Promise<CachedLicense> {
  const { actors } = ctx
  let bound: boolean
  try {
    bound = await actors.bindSeat(app.id, license.key, hwid)
  } catch (err) {
    ctx.metrics.seatBinds.add('failed')
    throw err
  }
  ctx.metrics.seatBinds.add(bound ? 'bound' : 'refused')
  actors.forgetLicense(app.id, license.key)
  if (bound) {
    // The seat is committed (to an active, unexpired license: the bind's own condition), so the login
    // succeeded and is charged whatever the reload meets: a store or database failing it now only
    // leaves the next request to load the license.
    const current = await reloadLicense(actors, app.id, license.key).catch(() => null)
    return current ?? { ...license, hwids: [...license.hwids, hwid] }
  }
  const current = await reloadLicense(actors, app.id, license.key)
  const state = current ? licenseState(current, app, ctx.clock()) : 'invalid_key'
  if (state) throw new PublicError(state)
  // Bound meanwhile by a concurrent validate of the same HWID: that is a pass, not a mismatch.
  if (current!.hwids.includes(hwid)) return current!
  throw new PublicError('hwid_mismatch')
}

/**
 * The license as PostgreSQL now holds it, cached under a freshly read epoch so that the next request
 * of this HWID is served from the actor; read from PostgreSQL alone when the store cannot give the epoch.
 */
async function reloadLicense(actors: Context['actors'], appId: string, licenseKey: string): Promise<CachedLicense | null> {
  try {
    await actors.ensureLicense(appId, licenseKey)
  } catch (err) {
    if (!(err instanceof StoreUnavailable)) throw err
  }
  return actors.cachedLicense(appId, licenseKey)?.value ?? (await actors.loadLicense(licenseKey))
}
