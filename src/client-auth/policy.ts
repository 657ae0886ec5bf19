import { timingSafeEqual } from 'node:crypto'
import type { CachedApp, CachedLicense } from '../actors/load'
import { hwidListsAllow } from '../actors/list-append'
import type { Config } from '../config'
import { PublicError, type PublicErrorCode } from '../lib/errors'
import { limitSubject } from '../lib/ip'
import { type AuthorizeInput, keys, type Shard } from '../store/store'
import { MAX_SESSION_TTL } from '../signing/session'

/** The spec's sandbox limits (per minute) and the contract's heartbeat pricing. */
export const SANDBOX = { validateIp: 20, validateLicense: 60, heartbeatIp: 20, selfbanIp: 20, selfbanLicense: 30 }
export const HEARTBEATS_PER_CREDIT = 10
/** A nonce is remembered for the longest session lifetime, per app. */
export const NONCE_TTL_SECONDS = MAX_SESSION_TTL

/**
 * App ids are lower-case UUIDs, and PostgreSQL finds the app under any spelling of one: every request
 * is read under the spelling its actor, epochs, nonces and sessions are keyed by, or an upper-case
 * spelling would get an actor (and a cache) of its own that no change of the app ever reaches.
 * Already lower-case (every SDK sends the id as the API gave it), the call returns the same string.
 */
export const canonicalAppId = (appId: string) => appId.toLowerCase()

export type Outcome = { ok: true; bind: boolean } | { ok: false; code: PublicErrorCode }
export const fail = (code: PublicErrorCode): Outcome => ({ ok: false, code })

export type Bucket = AuthorizeInput['buckets'][number]

// Written by every check, read before the next: no digest Buffer for the collector on each validate.
const presentedHash = Buffer.allocUnsafe(32)

export function secretMatches(presented: string, hash: Buffer): boolean {
  Bun.SHA256.hash(presented, presentedHash)
  return presentedHash.length === hash.length && timingSafeEqual(presentedHash, hash)
}

/** The spec's list order: IP blacklist, IP whitelist, HWID blacklist, HWID whitelist. */
export function listsAllow(app: CachedApp, ip: string, hwid: string): boolean {
  if (app.ipBlacklist.has(ip)) return false
  if (app.ipWhitelist.size > 0 && !app.ipWhitelist.has(ip)) return false
  return hwidListsAllow(app.hwidBlacklist, app.hwidWhitelist, hwid)
}

export function licenseState(license: CachedLicense | null, app: CachedApp, nowMs: number): PublicErrorCode | null {
  if (!license || license.appId !== app.id) return 'invalid_key'
  if (license.status === 'revoked') return 'revoked'
  if (license.expiresAt !== null && license.expiresAt <= nowMs) return 'expired'
  return null
}

/** A sandbox app's daily ceiling; billed apps have none. */
export function ceiling(config: Pick<Config, 'sandboxDailyCeiling'>, app: CachedApp, shard: Shard, nowMs: number): AuthorizeInput['ceiling'] {
  if (!app.sandbox) return null
  const day = new Date(nowMs).toISOString().slice(0, 10)
  const nextMidnight = Date.parse(`${day}T00:00:00.000Z`) + 86_400_000
  // Kept an hour past midnight: the key names its day, so the next day starts from zero regardless.
  return {
    key: keys.daily(shard, app.id, day),
    limit: config.sandboxDailyCeiling,
    ttlSeconds: Math.ceil((nextMidnight - nowMs) / 1000) + 3600,
  }
}

/** A bucket of the app's shard (`shard`: its account's). */
export const bucket = (shard: Shard, scope: string, appId: string, id: string, perMinute: number): Bucket => ({
  key: keys.bucket(shard, `${scope}:${appId}`, id),
  capacity: perMinute,
  refillPerSecond: perMinute / 60,
})

/** A per-IP bucket: `ip` counted as limitSubject counts it. */
export const perIpBucket = (shard: Shard, scope: string, appId: string, ip: string, perMinute: number): Bucket =>
  bucket(shard, scope, appId, limitSubject(ip), perMinute)

export const rateLimited = (retryAfterMs: number) =>
  new PublicError('rate_limited', { 'retry-after': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) })
