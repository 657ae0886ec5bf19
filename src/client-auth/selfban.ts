import { holdsSeat } from '../actors/load'
import type { Context } from '../context'
import { countResult } from '../lib/metrics'
import { keys } from '../store/store'
import { authorize } from './authorize'
import type { SelfbanInput, SelfbanReply } from './model'
import { bucket, canonicalAppId, ceiling, fail, NONCE_TTL_SECONDS, type Outcome, perIpBucket, SANDBOX, secretMatches } from './policy'

/**
 * POST /auth/selfban. Pre-session (appSecret + licenseKey + nonce) never revokes; post-session (a
 * session token) revokes by default. `performed` reports only changes this request made.
 */
export const selfban = (ctx: Context, input: SelfbanInput, ip: string, requestId: string): Promise<SelfbanReply> =>
  countResult(ctx.metrics.selfbans, reportTampering(ctx, input, ip, requestId))

async function reportTampering(ctx: Context, input: SelfbanInput, ip: string, requestId: string): Promise<SelfbanReply> {
  // The schema admits a body without a session token only with the secret, key and nonce.
  const post = input.sessionToken !== undefined
  const appId = canonicalAppId(input.appId)
  const session = post ? ctx.sessions.readFor(appId, input.sessionToken!, input.hwid, ctx.clock()) : null
  const licenseKey = post ? (session?.lic ?? null) : input.licenseKey!
  const revoke = input.revokeLicense ?? post
  const auth = await authorize(ctx, { ip, requestId, appId, licenseKey, needsNonce: !post }, (app, license, nowMs, shard) => {
    const secretOk = post || (app !== null && secretMatches(input.appSecret!, app.secretHash))
    let outcome: Outcome
    if (!app || !secretOk) outcome = fail('invalid_app')
    else if (post && !session) outcome = fail('session_expired')
    else if (app.disabled) outcome = fail('app_disabled')
    else if (!post && revoke) outcome = fail('revoke_requires_session')
    else if (!license || license.appId !== app.id) outcome = fail('invalid_key')
    // As on heartbeat: a released or reset seat ended the session (the actor checks again, under the license's lock).
    else if (post && !holdsSeat(license, input.hwid)) outcome = fail('session_expired')
    else outcome = { ok: true, bind: false }
    const sandbox = app?.sandbox ?? false
    const perIp = sandbox ? SANDBOX.selfbanIp : ctx.config.selfbanLimitPerIp
    const perLicense = sandbox ? SANDBOX.selfbanLicense : ctx.config.selfbanLimitPerLicense
    const ipBucket = app ? perIpBucket(shard, 's:ip', app.id, ip, perIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx.config, app, shard, nowMs) : null,
      ipBucket,
      buckets: !ipBucket ? [] : secretOk && licenseKey ? [ipBucket, bucket(shard, 's:lic', app!.id, licenseKey, perLicense)] : [ipBucket],
      nonce: !post && secretOk ? { key: keys.nonce(shard, appId, input.nonce!), ttlSeconds: NONCE_TTL_SECONDS } : null,
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
    performed: await ctx.actors.selfban(auth.app.id, auth.license!.key, {
      revokeLicense: post && revoke,
      blacklistHwid: input.blacklistHwid ?? true,
      blacklistIp: input.blacklistIp ?? true,
      hwid: input.hwid,
      ip,
      sessionHwid: post,
    }),
  }
}

