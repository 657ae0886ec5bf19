import { createPublicKey, randomBytes, verify } from 'node:crypto'
import https from 'node:https'

/**
 * A minimal client that speaks to the server exactly as AuthForge's public Node SDK does: HTTPS JSON
 * POSTs, a fresh 32-hex nonce per call that must come back in the payload (validate and heartbeat),
 * an Ed25519 check over the payload string as received with the raw public key, and the session
 * expiry read from `exp` in the first base64url part of the session token.
 */
export class SdkLikeClient {
  sessionToken: string | null = null
  sessionExpiresIn: number | null = null
  appVariables: Record<string, unknown> | null = null
  licenseVariables: Record<string, unknown> | null = null

  constructor(
    private readonly opts: { baseUrl: string; appId: string; appSecret: string; publicKey: string; hwid: string; ca: string },
  ) {}

  async login(licenseKey: string): Promise<void> {
    const { appId, appSecret, hwid } = this.opts
    const nonce = randomBytes(16).toString('hex')
    this.#apply(await this.#post('/auth/validate', { appId, appSecret, licenseKey, hwid, nonce }), nonce)
  }

  async heartbeat(): Promise<void> {
    if (!this.sessionToken) throw new Error('missing_session_token')
    const nonce = randomBytes(16).toString('hex')
    const body = { appId: this.opts.appId, sessionToken: this.sessionToken, nonce, hwid: this.opts.hwid }
    this.#apply(await this.#post('/auth/heartbeat', body), nonce)
  }

  async selfban(flags: Record<string, boolean> = {}): Promise<Record<string, unknown>> {
    const body = { appId: this.opts.appId, sessionToken: this.sessionToken, hwid: this.opts.hwid, ...flags }
    return this.#post('/auth/selfban', body)
  }

  #apply(res: Record<string, any>, nonce: string): void {
    if (!['ok', 'success', 'valid', 'true', '1'].includes(String(res.status).toLowerCase())) {
      throw new Error(String(res.error ?? 'unknown_error'))
    }
    const payloadB64 = String(res.payload)
    const payload = JSON.parse(Buffer.from(payloadB64, 'base64').toString('utf8'))
    if (String(payload.nonce ?? '').trim() !== nonce) throw new Error('nonce_mismatch')
    const key = createPublicKey({
      key: { crv: 'Ed25519', kty: 'OKP', x: this.opts.publicKey.replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '') },
      format: 'jwk',
    })
    if (!verify(null, Buffer.from(payloadB64, 'utf8'), key, Buffer.from(String(res.signature).trim(), 'base64'))) {
      throw new Error('signature_mismatch')
    }
    const token = String(payload.sessionToken ?? '').trim()
    if (!token) throw new Error('missing_sessionToken')
    const part = token.split('.')[0] ?? ''
    const padded = part + '='.repeat((4 - (part.length % 4)) % 4)
    const claims = JSON.parse(Buffer.from(padded.replace(/-/g, '+').replace(/_/g, '/'), 'base64').toString('utf8'))
    const exp = Number.parseInt(String(claims.exp), 10)
    if (Number.isNaN(exp)) throw new Error('missing_expiresIn')
    this.sessionToken = token
    this.sessionExpiresIn = exp
    this.appVariables = payload.appVariables ?? null
    this.licenseVariables = payload.licenseVariables ?? null
  }

  #post(path: string, body: unknown): Promise<Record<string, any>> {
    const text = JSON.stringify(body)
    const url = new URL(`${this.opts.baseUrl}${path}`)
    return new Promise((resolve, reject) => {
      const req = https.request(
        {
          method: 'POST',
          hostname: url.hostname,
          port: url.port,
          path: url.pathname,
          ca: this.opts.ca,
          headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) },
        },
        (res) => {
          const chunks: Buffer[] = []
          res.on('data', (c: Buffer) => chunks.push(c))
          res.on('end', () => {
            try {
              resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')))
            } catch (err) {
              reject(err)
            }
          })
        },
      )
      req.on('error', reject)
      req.end(text)
    })
  }
}
