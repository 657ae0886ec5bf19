import type { CachedApp, CachedLicense } from '../actors/load'
import type { VariableMap } from '../db/schema'
import { LoggedPublicError } from '../lib/errors'
import { utf8Base64 } from '../lib/scratch'
import type { SignedResponse } from './model'
import type { Signer } from './signer'
import type { Session } from './session'

/**
 * Writes and signs the payload of a successful validate or heartbeat. The payload is JSON with a
 * fixed field order (sessionToken, expiresIn, sessionExpiresAt, timestamp, nonce?, appId, licenseKey,
 * hwid, licenseExpiresAt, unlimitedHwidSlots, maxHwidSlots, hwidCount, licenseLabel, appVariables,
 * licenseVariables), written field by field so the text is byte for byte what one JSON.stringify of
 * the whole object gives. Nothing is kept per license: with up to a million licenses cycling through
 * the cache, text kept beside each entry would double its memory and its collector work for a
 * saving of well under a microsecond per request. Only the app's variables, the same for each of its
 * licenses, are serialized once per app entry (entries are replaced, never mutated, on reload).
 */
export class SignedPayloads {
  readonly #appVariables = new WeakMap<CachedApp, string>()
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
      throw new LoggedPublicError('system_error', 'app has no active signing key', { appId: app.id })
    }
    const exp = session.session.exp
    const json =
      `{"sessionToken":${JSON.stringify(session.token)},"expiresIn":${JSON.stringify(exp)},` +
      `"sessionExpiresAt":"${this.#isoSeconds(exp)}","timestamp":"${this.#isoMillis(nowMs)}"` +
      `${nonce === undefined ? '' : `,"nonce":${JSON.stringify(nonce)}`},${this.#licenseFields(app, license, hwid)}`
    const payload = utf8Base64(json, 'base64')
    const { keyId, key } = app.signing
    return { status: 'success', payload, signature: await this.signer.sign(keyId, key, payload), keyId }
  }

  #licenseFields(app: CachedApp, license: CachedLicense, hwid: string): string {
    const expiresAt = license.expiresAt === null ? 'null' : `"${new Date(license.expiresAt).toISOString()}"`
    return (
      `"appId":${JSON.stringify(app.id)},"licenseKey":${JSON.stringify(license.key)},"hwid":${JSON.stringify(hwid)},` +
      `"licenseExpiresAt":${expiresAt},"unlimitedHwidSlots":${license.unlimitedHwidSlots},` +
      `"maxHwidSlots":${JSON.stringify(license.maxHwidSlots)},"hwidCount":${license.hwids.length},` +
      `"licenseLabel":${JSON.stringify(license.label)},"appVariables":${this.#appVariablesOf(app)},` +
      `"licenseVariables":${variablesJson(license.variables)}}`
    )
  }

  #appVariablesOf(app: CachedApp): string {
    let text = this.#appVariables.get(app)
    if (text === undefined) {
      text = variablesJson(app.variables)
      this.#appVariables.set(app, text)
    }
    return text
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

/** Most licenses carry no variables: their text without a call. */
const variablesJson = (variables: VariableMap) => (Object.keys(variables).length === 0 ? '{}' : JSON.stringify(variables))
