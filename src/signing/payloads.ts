import { t } from 'elysia'
import type { CachedApp, CachedLicense } from '../actors/load'
import { PublicError } from '../lib/errors'
import { log } from '../lib/log'
import type { Signer } from './signer'
import type { Session } from './session'

/** A signed payload as the client endpoints answer it: the response model of validate and heartbeat. */
export const SignedResponse = t.Object({
  status: t.Literal('success'),
  payload: t.String({ description: 'Base64 JSON: sessionToken, expiresIn (Unix seconds), nonce, license state, variables' }),
  signature: t.String({ description: 'Base64 Ed25519 signature over the UTF-8 bytes of `payload` as sent (88 characters)' }),
  keyId: t.String({ description: 'Signing key that produced the signature' }),
})

/**
 * Writes and signs the payload of a successful validate or heartbeat. The payload is JSON with a
 * fixed field order (sessionToken, expiresIn, sessionExpiresAt, timestamp, nonce?, appId, licenseKey,
 * hwid, licenseExpiresAt, unlimitedHwidSlots, maxHwidSlots, hwidCount, licenseLabel, appVariables,
 * licenseVariables). The fields that only change when the app or the license is reloaded are
 * serialized once per cache entry (entries are replaced, never mutated, on reload) by the same
 * JSON.stringify, so the text is byte for byte what one JSON.stringify of the whole object gives.
 */
export class SignedPayloads {
  readonly #tails = new WeakMap<CachedLicense, { app: CachedApp; head: string; tail: string }>()
  // Many requests share one clock second or millisecond: the last text of each is kept.
  #lastSeconds = Number.NaN
  #lastSecondsIso = ''
  #lastMillis = Number.NaN
  #lastMillisIso = ''

  constructor(private readonly signer: Signer) {}

  async sign(
    app: CachedApp,
    license: CachedLicense,
    hwid: string,
    session: { token: string; session: Session },
    nonce: string | undefined,
    nowMs: number,
  ): Promise<typeof SignedResponse.static> {
    if (!app.signing) {
      log.error('app has no active signing key', { appId: app.id })
      throw new PublicError('system_error')
    }
    const exp = session.session.exp
    const json =
      `{"sessionToken":${JSON.stringify(session.token)},"expiresIn":${JSON.stringify(exp)},` +
      `"sessionExpiresAt":"${this.#isoSeconds(exp)}","timestamp":"${this.#isoMillis(nowMs)}"` +
      `${nonce === undefined ? '' : `,"nonce":${JSON.stringify(nonce)}`},${this.#licenseFields(app, license, hwid)}`
    const payload = Buffer.from(json, 'utf8').toString('base64')
    const { keyId, key } = app.signing
    return { status: 'success', payload, signature: await this.signer.sign(keyId, key, payload), keyId }
  }

  #licenseFields(app: CachedApp, license: CachedLicense, hwid: string): string {
    let parts = this.#tails.get(license)
    if (!parts || parts.app !== app) {
      const head = JSON.stringify({ appId: app.id, licenseKey: license.key })
      const tail = JSON.stringify({
        licenseExpiresAt: license.expiresAt === null ? null : new Date(license.expiresAt).toISOString(),
        unlimitedHwidSlots: license.unlimitedHwidSlots,
        maxHwidSlots: license.maxHwidSlots,
        hwidCount: license.hwids.length,
        licenseLabel: license.label,
        appVariables: app.variables,
        licenseVariables: license.variables,
      })
      parts = { app, head: head.slice(1, -1), tail: tail.slice(1) }
      this.#tails.set(license, parts)
    }
    return `${parts.head},"hwid":${JSON.stringify(hwid)},${parts.tail}`
  }

  #isoSeconds(unixSeconds: number): string {
    if (unixSeconds !== this.#lastSeconds) {
      this.#lastSecondsIso = new Date(unixSeconds * 1000).toISOString()
      this.#lastSeconds = unixSeconds
    }
    return this.#lastSecondsIso
  }

  #isoMillis(ms: number): string {
    if (ms !== this.#lastMillis) {
      this.#lastMillisIso = new Date(ms).toISOString()
      this.#lastMillis = ms
    }
    return this.#lastMillisIso
  }
}
