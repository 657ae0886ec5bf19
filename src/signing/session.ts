import { timingSafeEqual } from 'node:crypto'
import { decodeUtf8Base64, utf8Base64 } from '../lib/scratch'

/** The contract's bounds on a requested session lifetime (seconds). */
export const MIN_SESSION_TTL = 3600
export const MAX_SESSION_TTL = 604_800

/** What a session token carries. `exp` and `iat` are Unix seconds; `exp` is what the public SDKs read. */
export interface Session {
  v: 1
  app: string
  lic: string
  hwid: string
  /** Lifetime in seconds, kept across heartbeats. */
  ttl: number
  exp: number
  iat: number
  /** Random: every issued token differs, even two in the same second. */
  jti: string
}

export function clampTtl(requested: number | undefined, fallback: number): number {
  const ttl = requested ?? fallback
  return Math.min(MAX_SESSION_TTL, Math.max(MIN_SESSION_TTL, Math.floor(ttl)))
}

const JTI_BYTES = 9
/** HMAC-SHA256. */
const MAC_BYTES = 32

/**
 * Stateless token `<b64url(JSON)>.<b64url(HMAC-SHA256)>`: nothing is stored, so a restart of Redis or
 * of the server ends no session, and nothing secret is kept in clear anywhere. Revocation still reaches
 * the client at its next heartbeat because heartbeat re-checks the license on every call.
 *
 * Both directions run on every validate and heartbeat. An HMAC keyed once and copied per token skips
 * the key schedule (half the cost of createHmac), and random bytes drawn 4 KiB at a time skip a call
 * into the CSPRNG per token; both give the same bytes' worth of security as before.
 */
export class SessionTokens {
  readonly #hasher: Bun.CryptoHasher
  readonly #randomPool = Buffer.allocUnsafe(JTI_BYTES * 455)
  #randomOffset = this.#randomPool.length
  readonly #givenMac = Buffer.allocUnsafe(64)
  readonly #wantMac = Buffer.allocUnsafe(64)

  constructor(key: Buffer) {
    this.#hasher = new Bun.CryptoHasher('sha256', key)
  }

  /**
   * A session of `ttl` seconds from now, ending no later than its license (`licenseExpiresAt`, epoch
   * milliseconds, null for lifetime): an SDK heartbeating locally reads `exp` alone, and would run on
   * past the license's end until the session's, up to the longest TTL (7 days), never asking again.
   */
  issue(s: Omit<Session, 'v' | 'exp' | 'iat' | 'jti'>, licenseExpiresAt: number | null, nowMs: number): { token: string; session: Session } {
    const iat = Math.floor(nowMs / 1000)
    const session: Session = {
      v: 1,
      app: s.app,
      lic: s.lic,
      hwid: s.hwid,
      ttl: s.ttl,
      // Rounded up: a license ending within the second still gets a session that has not already expired.
      exp: licenseExpiresAt === null ? iat + s.ttl : Math.min(iat + s.ttl, Math.ceil(licenseExpiresAt / 1000)),
      iat,
      jti: this.#randomJti(),
    }
    const body = utf8Base64(JSON.stringify(session), 'base64url')
    return { token: `${body}.${this.#hasher.copy().update(body, 'utf8').digest('base64url')}`, session }
  }

  /** The token's session when its MAC is ours and it has not expired; null otherwise. */
  read(token: string, nowMs: number): Session | null {
    const dot = token.indexOf('.')
    if (dot <= 0 || dot !== token.lastIndexOf('.')) return null
    const body = token.slice(0, dot)
    // A MAC part that decodes to more than MAC_BYTES fills the buffer past them and is refused like a short one.
    const mac = token.slice(dot + 1)
    const given = this.#givenMac.write(mac, 0, 'base64url')
    // Bun writes an HMAC into a caller's array only when it has room for any digest (64 bytes).
    this.#hasher.copy().update(body, 'utf8').digest(this.#wantMac)
    if (given !== MAC_BYTES || !timingSafeEqual(this.#givenMac.subarray(0, MAC_BYTES), this.#wantMac.subarray(0, MAC_BYTES))) return null
    // Only the spelling issued: decoding skips what is not base64url and the last character's unused
    // bits, so `token + "!!"` read as the same token, a token never issued that anything keyed on the
    // token's text (a denylist, a count) would take for another.
    if (mac !== this.#wantMac.toString('base64url', 0, MAC_BYTES)) return null
    let s: Session
    try {
      s = JSON.parse(decodeUtf8Base64(body, 'base64url')) as Session
    } catch {
      return null
    }
    if (s?.v !== 1 || typeof s.exp !== 'number' || s.exp * 1000 <= nowMs) return null
    if (typeof s.app !== 'string' || typeof s.lic !== 'string' || typeof s.hwid !== 'string') return null
    return s
  }

  /** The session of a heartbeat or post-session selfban: token, app and HWID must all match. */
  readFor(appId: string, token: string, hwid: string, nowMs: number): Session | null {
    const session = this.read(token, nowMs)
    return session && session.app === appId && session.hwid === hwid ? session : null
  }

  /** A token readFor would take but for its end having passed; null for any other. */
  readEnded(appId: string, token: string, hwid: string): Session | null {
    return this.readFor(appId, token, hwid, Number.NEGATIVE_INFINITY)
  }

  #randomJti(): string {
    if (this.#randomOffset + JTI_BYTES > this.#randomPool.length) {
      crypto.getRandomValues(this.#randomPool)
      this.#randomOffset = 0
    }
    const start = this.#randomOffset
    this.#randomOffset += JTI_BYTES
    return this.#randomPool.toString('base64url', start, this.#randomOffset)
  }
}
