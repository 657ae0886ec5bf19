import { holdsSeat } from '../actors/load'
import type { Context } from '../context'
import { countResult } from '../lib/metrics'
import { keys } from '../store/store'
import { authorize, refundingOnFailure } from './authorize'
import type { HeartbeatInput, SignedReply } from './model'
import { canonicalAppId, ceiling, fail, HEARTBEATS_PER_CREDIT, licenseState, listsAllow, type Outcome, perIpBucket, SANDBOX } from './policy'

/** POST /auth/heartbeat: re-checks the license on every call, so revocations reach clients at once. */
export const heartbeat = (ctx: Context, input: HeartbeatInput, ip: string, requestId: string): Promise<SignedReply> =>
  countResult(ctx.metrics.heartbeats, renewSession(ctx, input, ip, requestId))

async function renewSession(ctx: Context, input: HeartbeatInput, ip: string, requestId: string): Promise<SignedReply> {
  const { sessions, payloads } = ctx
  const appId = canonicalAppId(input.appId)
  const session = sessions.readFor(appId, input.sessionToken, input.hwid, ctx.clock())
  // A session ends no later than its license (SessionTokens.issue): one that ended with its license is
  // answered `expired`, as the heartbeat a moment before its end would have been, not `session_expired`.
  const ended = session ? null : sessions.readEnded(appId, input.sessionToken, input.hwid)
  const licenseKey = (session ?? ended)?.lic ?? null
  const auth = await authorize(ctx, { ip, requestId, appId, licenseKey, needsNonce: false }, (app, license, nowMs, shard) => {
    let outcome: Outcome
    if (!app) outcome = fail('invalid_app')
    else if (!session && !ended) outcome = fail('session_expired')
    // A token of ours whose session ended with its license is answered as a live one: app and lists first.
    else if (app.disabled) outcome = fail('app_disabled')
    else if (!listsAllow(app, ip, input.hwid)) outcome = fail('blocked')
    else if (!session) {
      // invalid_key also has the license looked up, and is the answer once it is known to be gone.
      const state = licenseState(license, app, nowMs)
      outcome = fail(state === 'expired' || state === 'invalid_key' ? state : 'session_expired')
    } else {
      const state = licenseState(license, app, nowMs)
      if (state) outcome = fail(state)
      // A reset HWID ends the session: the client logs in again, which binds it afresh.
      else if (!holdsSeat(license!, input.hwid)) outcome = fail('session_expired')
      else outcome = { ok: true, bind: false }
    }
    const ipBucket = app?.sandbox ? perIpBucket(shard, 'h:ip', app.id, ip, SANDBOX.heartbeatIp) : null
    return {
      outcome,
      ceiling: app ? ceiling(ctx.config, app, shard, nowMs) : null,
      ipBucket,
      buckets: ipBucket ? [ipBucket] : [],
      nonce: null,
      charge:
        outcome.ok && app && !app.sandbox && session
          ? { accountId: app.accountId, cost: 1, counter: { key: keys.heartbeats(shard, session.lic), every: HEARTBEATS_PER_CREDIT } }
          : null,
    }
  })
  const nowMs = ctx.clock()
  const license = auth.license!
  const renewed = sessions.issue({ app: auth.app.id, lic: session!.lic, hwid: input.hwid, ttl: session!.ttl }, license.expiresAt, nowMs)
  return refundingOnFailure(ctx, auth, () => payloads.sign(auth.app, license, input.hwid, renewed, input.nonce, nowMs))
}
