import {
  type KeyObject,
  createCipheriv,
  createDecipheriv,
  createHash,
  createHmac,
  createPrivateKey,
  generateKeyPairSync,
  hkdfSync,
  randomBytes,
  sign,
  timingSafeEqual,
} from 'node:crypto'
import { utf8Bytes } from './scratch'

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex')
}

/** Compares two strings in time independent of where they differ (hash first, so lengths leak nothing). */
export function safeEqual(a: string, b: string): boolean {
  const ha = createHash('sha256').update(a, 'utf8').digest()
  const hb = createHash('sha256').update(b, 'utf8').digest()
  return timingSafeEqual(ha, hb)
}

export function randomToken(bytes = 32): string {
  return randomBytes(bytes).toString('base64url')
}

// 32 symbols, so a random byte masked to 5 bits picks one without bias; no I, O, 0 or 1.
const LICENSE_ALPHABET = 'ABCDEFGHJKLMNPQRSTUVWXYZ23456789'

/** XXXX-XXXX-XXXX-XXXX from a cryptographic source (80 bits). */
export function generateLicenseKey(): string {
  const bytes = randomBytes(16)
  let out = ''
  for (let i = 0; i < 16; i++) {
    if (i > 0 && i % 4 === 0) out += '-'
    out += LICENSE_ALPHABET[(bytes[i] ?? 0) & 31]
  }
  return out
}

export const LICENSE_KEY_PATTERN = '^[A-Za-z0-9]{4}-[A-Za-z0-9]{4}-[A-Za-z0-9]{4}-[A-Za-z0-9]{4}$'

export function generateApiKey(): string {
  return `svc_live_${randomToken(24)}`
}

export function generateAppSecret(): string {
  return randomToken(32)
}

export function generateWebhookSecret(): string {
  return `whsec_${randomToken(24)}`
}

export function generateWebhookId(): string {
  return `wh_${randomToken(12)}`
}

export function generateKeyId(): string {
  return `key_${randomToken(9)}`
}

/** A sealed value that the key at hand does not open: another key's, or damaged. */
export class SealError extends Error {}

/**
 * What the database stores to recognise the master key its values are sealed with: an HMAC of a fixed
 * label under a key derived for this purpose alone, so it reveals nothing of the master key or the
 * sealing key.
 */
export function keyCheckValue(masterKey: Buffer): string {
  return hmacHex(deriveKey(masterKey, 'key-check-v1'), 'license-service master key check')
}

/** Seals secrets at rest with AES-256-GCM: "v1.<iv>.<tag>.<ciphertext>", all base64url. */
export class Sealer {
  readonly #key: Buffer
  /** keyCheckValue of the master key: what the database must hold before this sealer seals anything there. */
  readonly check: string
  constructor(masterKey: Buffer) {
    this.#key = Buffer.from(hkdfSync('sha256', masterKey, Buffer.alloc(0), 'seal-v1', 32))
    this.check = keyCheckValue(masterKey)
  }
  seal(plain: Buffer | string): string {
    const iv = randomBytes(12)
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv)
    const body = Buffer.concat([cipher.update(plain), cipher.final()])
    return ['v1', iv, cipher.getAuthTag(), body].map((p) => (typeof p === 'string' ? p : p.toString('base64url'))).join('.')
  }
  open(sealed: string): Buffer {
    const [version, iv, tag, body] = sealed.split('.')
    const ivBytes = Buffer.from(iv ?? '', 'base64url')
    const tagBytes = Buffer.from(tag ?? '', 'base64url')
    // What seal() writes, exactly: a cut value would otherwise fail as a TypeError naming nothing, and a
    // short tag is one GCM would take, with less of the authentication it gives.
    if (version !== 'v1' || ivBytes.length !== 12 || tagBytes.length !== 16 || body === undefined) {
      throw new SealError('a sealed value is not in a recognised format (damaged)')
    }
    const decipher = createDecipheriv('aes-256-gcm', this.#key, ivBytes, { authTagLength: 16 })
    decipher.setAuthTag(tagBytes)
    try {
      return Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()])
    } catch {
      // GCM's own message (unable to authenticate data) does not tell an operator what to do.
      throw new SealError('a sealed value does not open with this master key (another key, or damaged); after master-key rotate, start with MASTER_KEY set to the new key')
    }
  }
}

/** Derives a purpose-specific key from the master key (sessions, for example). */
export function deriveKey(masterKey: Buffer, purpose: string): Buffer {
  return Buffer.from(hkdfSync('sha256', masterKey, Buffer.alloc(0), purpose, 32))
}

export interface NewSigningKey {
  /** Raw 32-byte public key, base64: what the SDKs take. */
  publicKey: string
  /** PKCS#8 DER of the private key, to be sealed before storage. */
  privatePkcs8: Buffer
}

export function generateSigningKey(): NewSigningKey {
  const { publicKey, privateKey } = generateKeyPairSync('ed25519')
  const jwk = publicKey.export({ format: 'jwk' })
  return {
    publicKey: Buffer.from(jwk.x ?? '', 'base64url').toString('base64'),
    privatePkcs8: privateKey.export({ format: 'der', type: 'pkcs8' }),
  }
}

/**
 * An app's Ed25519 signing key from its PKCS#8 DER, as a KeyObject made once: signing with it avoids
 * re-parsing the key on every request. A key of another type is refused here, not at its first signature.
 */
export function privateKeyFromPkcs8(der: Buffer): KeyObject {
  const key = createPrivateKey({ key: der, format: 'der', type: 'pkcs8' })
  if (key.asymmetricKeyType !== 'ed25519') throw new Error(`a signing key must be Ed25519, not ${key.asymmetricKeyType}`)
  return key
}

/** Ed25519 over the UTF-8 bytes of the text as sent; base64, 88 characters. */
export function signText(text: string, key: KeyObject): string {
  return sign(null, utf8Bytes(text), key).toString('base64')
}

export function hmacHex(key: Buffer | string, body: string): string {
  return createHmac('sha256', key).update(body, 'utf8').digest('hex')
}

export function hmacBase64Url(key: Buffer, body: string): string {
  return createHmac('sha256', key).update(body, 'utf8').digest('base64url')
}
