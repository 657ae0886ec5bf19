import type { OfflineHwid, VariableMap } from '../../db/schema'

/** What an offline license file says, in the payload's field order (verifiers read it as JSON). */
export interface OfflinePayload {
  appId: string
  licenseKey: string
  jti: string
  kid: string
  issuedAt: Date
  expiresAt: Date | null
  hwid: OfflineHwid
  label: string | null
  licenseExpiresAt: Date | null
  licenseVariables: VariableMap
  appVariables: VariableMap
}

/** The base64 payload string the signature covers: JSON with the contract's field order, v and typ first. */
export function encodePayload(p: OfflinePayload): string {
  const json = JSON.stringify({
    v: 1,
    typ: 'authforge-license',
    appId: p.appId,
    licenseKey: p.licenseKey,
    jti: p.jti,
    kid: p.kid,
    issuedAt: p.issuedAt.toISOString(),
    expiresAt: p.expiresAt?.toISOString() ?? null,
    hwid: p.hwid,
    label: p.label,
    licenseExpiresAt: p.licenseExpiresAt?.toISOString() ?? null,
    licenseVariables: p.licenseVariables,
    appVariables: p.appVariables,
  })
  return Buffer.from(json, 'utf8').toString('base64')
}

const wrap = (base64: string) => base64.replace(/.{64}(?=.)/g, '$&\n')

/** The `.authforge` text: armored payload with its headers, then the armored signature, 64 columns a line. */
export function armor(p: OfflinePayload, payloadBase64: string, signatureBase64: string): string {
  return [
    '-----BEGIN AUTHFORGE LICENSE-----',
    'Version: 1',
    `App-Id: ${p.appId}`,
    `License: ${p.licenseKey}`,
    `Key-Id: ${p.kid}`,
    `Expires-At: ${p.expiresAt?.toISOString() ?? 'never'}`,
    '',
    wrap(payloadBase64),
    '-----END AUTHFORGE LICENSE-----',
    '-----BEGIN AUTHFORGE SIGNATURE-----',
    wrap(signatureBase64),
    '-----END AUTHFORGE SIGNATURE-----',
    '',
  ].join('\n')
}
