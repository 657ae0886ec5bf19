import { createPublicKey, verify } from 'node:crypto'

/** A verifier of `.authforge` files written from the format alone, as an SDK would (offline-files.test.ts checks it against AuthForge's vectors). */
export type Verdict =
  | { code: 'ok'; payload: Record<string, any>; headers: Record<string, string> }
  | { code: 'bad_armor' | 'bad_signature' | 'unsupported_version' | 'malformed_payload' | 'wrong_app' | 'expired' | 'hwid_mismatch' }

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/

function parseArmor(text: string) {
  const lines = text.replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n').split('\n')
  const find = (marker: string, from: number) => lines.findIndex((line, i) => i >= from && line.trim() === marker)
  const begin = find('-----BEGIN AUTHFORGE LICENSE-----', 0)
  const end = begin < 0 ? -1 : find('-----END AUTHFORGE LICENSE-----', begin + 1)
  const sigBegin = end < 0 ? -1 : find('-----BEGIN AUTHFORGE SIGNATURE-----', end + 1)
  const sigEnd = sigBegin < 0 ? -1 : find('-----END AUTHFORGE SIGNATURE-----', sigBegin + 1)
  if (sigEnd < 0) return null
  const block = lines.slice(begin + 1, end)
  const blank = block.findIndex((line) => line.trim() === '')
  if (blank < 0) return null
  const headers: Record<string, string> = {}
  for (const line of block.slice(0, blank)) {
    const colon = line.indexOf(':')
    if (colon <= 0) return null
    headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim()
  }
  const payload = block.slice(blank + 1).join('').replace(/\s/g, '')
  const signature = lines.slice(sigBegin + 1, sigEnd).join('').replace(/\s/g, '')
  if (!BASE64.test(payload) || !BASE64.test(signature)) return null
  return { headers, payload, signature }
}

const publicKey = (base64: string) =>
  createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(base64, 'base64').toString('base64url') }, format: 'jwk' })

const nonEmpty = (v: unknown) => typeof v === 'string' && v.length > 0

export function verifyLicenseFile(text: string, opts: { appId: string; publicKeys: string[]; hwid: string; nowMs: number }): Verdict {
  const armor = parseArmor(text)
  if (!armor) return { code: 'bad_armor' }
  const signed = opts.publicKeys.some((key) => {
    try {
      return verify(null, Buffer.from(armor.payload, 'utf8'), publicKey(key), Buffer.from(armor.signature, 'base64'))
    } catch {
      return false
    }
  })
  if (!signed) return { code: 'bad_signature' }
  let payload: any
  try {
    payload = JSON.parse(Buffer.from(armor.payload, 'base64').toString('utf8'))
  } catch {
    return { code: 'malformed_payload' }
  }
  if (typeof payload !== 'object' || payload === null || Array.isArray(payload)) return { code: 'malformed_payload' }
  if (typeof payload.v !== 'number' || payload.v !== 1) return { code: 'unsupported_version' }
  const shaped =
    payload.typ === 'authforge-license' &&
    ['appId', 'licenseKey', 'jti', 'kid', 'issuedAt'].every((f) => nonEmpty(payload[f])) &&
    'expiresAt' in payload &&
    (payload.expiresAt === null || nonEmpty(payload.expiresAt)) &&
    ((payload.hwid?.mode === 'bound' &&
      Array.isArray(payload.hwid.hwids) &&
      payload.hwid.hwids.length > 0 &&
      payload.hwid.hwids.every(nonEmpty)) ||
      payload.hwid?.mode === 'any')
  if (!shaped) return { code: 'malformed_payload' }
  if (payload.appId !== opts.appId.trim()) return { code: 'wrong_app' }
  if (payload.expiresAt !== null && !(Date.parse(payload.expiresAt) > opts.nowMs)) return { code: 'expired' }
  const local = opts.hwid.trim()
  if (payload.hwid.mode === 'bound' && (local === '' || !payload.hwid.hwids.includes(local))) return { code: 'hwid_mismatch' }
  return { code: 'ok', payload, headers: armor.headers }
}

