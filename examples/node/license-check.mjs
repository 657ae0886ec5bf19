#!/usr/bin/env node
// A client of a self-hosted license service, as an application would embed it: validate a license
// for this machine, verify the signed answer with the app's public key, send one heartbeat, and check
// an offline `.authforge` license file. Node 18+, no dependencies (fetch and node:crypto).
//
// Exit codes: 0 the license is good; 1 it was refused or an answer failed verification; 2 bad usage.
import { createPublicKey, randomBytes, verify } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'

const SETTINGS = {
  'base-url': 'LS_BASE_URL',
  'app-id': 'LS_APP_ID',
  'app-secret': 'LS_APP_SECRET',
  'public-key': 'LS_PUBLIC_KEY',
  'license-key': 'LS_LICENSE_KEY',
  hwid: 'LS_HWID',
  'offline-file': 'LS_OFFLINE_FILE',
}

const USAGE = `usage: node license-check.mjs [--flag value …]
  ${Object.entries(SETTINGS).map(([flag, env]) => `--${flag.padEnd(13)} or ${env}`).join('\n  ')}
Online check (validate + heartbeat) when a license key is given: needs the base URL and app secret.
Offline check when an offline file is given. --public-key takes several keys, comma-separated.`

/** The license was refused, or an answer is not what the server signed for this request: exit 1. */
class Refused extends Error {}
/** A setting is missing or malformed: exit 2. */
class BadUsage extends Error {}

function readSettings() {
  let values
  try {
    ;({ values } = parseArgs({
      options: {
        ...Object.fromEntries(Object.keys(SETTINGS).map((flag) => [flag, { type: 'string' }])),
        help: { type: 'boolean', short: 'h' },
      },
    }))
  } catch (err) {
    throw new BadUsage(err.message)
  }
  if (values.help) {
    console.log(USAGE)
    process.exit(0)
  }
  const s = Object.fromEntries(
    Object.entries(SETTINGS).map(([flag, env]) => [flag, (values[flag] ?? process.env[env] ?? '').trim()]),
  )
  const online = s['license-key'] !== ''
  const offline = s['offline-file'] !== ''
  if (!online && !offline) throw new BadUsage('give a license key (online check), an offline file, or both')
  const required = ['app-id', 'public-key', 'hwid', ...(online ? ['base-url', 'app-secret'] : [])]
  const missing = required.filter((flag) => s[flag] === '')
  if (missing.length > 0) throw new BadUsage(`missing ${missing.map((f) => `--${f} (${SETTINGS[f]})`).join(', ')}`)
  return { ...s, online, offline, keys: s['public-key'].split(',').map(trustedKey) }
}

/** The app's public key as the Developer API and the CLI give it: the raw 32-byte Ed25519 key, base64. */
function trustedKey(base64) {
  const raw = Buffer.from(base64.trim(), 'base64')
  if (raw.length !== 32) throw new BadUsage('a public key must be 32 bytes, base64 (as "publicKey" is given)')
  return createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') }, format: 'jwk' })
}

/** Ed25519 over the UTF-8 bytes of the base64 text exactly as received, by any trusted key (rotation). */
function signedByTrustedKey(text, signatureBase64, keys) {
  const signature = Buffer.from(signatureBase64, 'base64')
  return signature.length === 64 && keys.some((key) => verify(null, Buffer.from(text, 'utf8'), key, signature))
}

async function post(baseUrl, path, body) {
  let res
  try {
    res = await fetch(`${baseUrl.replace(/\/+$/, '')}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
  } catch (err) {
    throw new Refused(`cannot reach ${baseUrl}: ${err.cause?.message ?? err.message}`)
  }
  const reply = await res.json().catch(() => null)
  if (!res.ok || reply?.status !== 'success') {
    throw new Refused(`${path} refused: ${reply?.error ?? 'no JSON answer'} (HTTP ${res.status})`)
  }
  return reply
}

/** Verifies first, then decodes (never parse what is not signed), then checks the nonce echo. */
function openSigned(path, reply, keys, nonce) {
  if (typeof reply.payload !== 'string' || typeof reply.signature !== 'string') {
    throw new Refused(`${path}: the answer has no payload or signature`)
  }
  if (!signedByTrustedKey(reply.payload, reply.signature, keys)) {
    throw new Refused(`${path}: the signature does not verify with the app's public key (keyId ${reply.keyId})`)
  }
  const payload = JSON.parse(Buffer.from(reply.payload, 'base64').toString('utf8'))
  if (payload.nonce !== nonce) throw new Refused(`${path}: the nonce is not ours (a replayed answer?)`)
  if (!(payload.expiresIn * 1000 > Date.now())) throw new Refused(`${path}: the session has already expired`)
  return payload
}

async function checkOnline(s) {
  const nonce = randomBytes(16).toString('hex')
  const validateReply = await post(s['base-url'], '/auth/validate', {
    appId: s['app-id'],
    appSecret: s['app-secret'],
    licenseKey: s['license-key'],
    hwid: s.hwid,
    nonce,
  })
  const session = openSigned('/auth/validate', validateReply, s.keys, nonce)
  if (session.appId !== s['app-id'] || session.licenseKey !== s['license-key'] || session.hwid !== s.hwid) {
    throw new Refused('/auth/validate: the signed payload is for another app, license or machine')
  }
  const seats = session.unlimitedHwidSlots ? 'unlimited seats' : `seat ${session.hwidCount} of ${session.maxHwidSlots}`
  console.log(
    `validate: ok, license ${session.licenseKey} (expires ${session.licenseExpiresAt ?? 'never'}), ${seats}, ` +
      `session until ${session.sessionExpiresAt}, signed by ${validateReply.keyId}`,
  )
  console.log(`variables: app ${JSON.stringify(session.appVariables)}, license ${JSON.stringify(session.licenseVariables)}`)

  const heartbeatNonce = randomBytes(16).toString('hex')
  const heartbeatReply = await post(s['base-url'], '/auth/heartbeat', {
    appId: s['app-id'],
    sessionToken: session.sessionToken,
    hwid: s.hwid,
    nonce: heartbeatNonce,
  })
  const renewed = openSigned('/auth/heartbeat', heartbeatReply, s.keys, heartbeatNonce)
  console.log(`heartbeat: ok, session until ${renewed.sessionExpiresAt}`)
}

const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/

/** The armored file's parts, or null. Tolerates CRLF, a BOM, re-wrapped lines and text around it. */
function parseLicenseFile(text) {
  const lines = text.replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n').split('\n')
  const find = (marker, from) => lines.findIndex((line, i) => i >= from && line.trim() === marker)
  const begin = find('-----BEGIN AUTHFORGE LICENSE-----', 0)
  const end = begin < 0 ? -1 : find('-----END AUTHFORGE LICENSE-----', begin + 1)
  const sigBegin = end < 0 ? -1 : find('-----BEGIN AUTHFORGE SIGNATURE-----', end + 1)
  const sigEnd = sigBegin < 0 ? -1 : find('-----END AUTHFORGE SIGNATURE-----', sigBegin + 1)
  if (sigEnd < 0) return null
  const block = lines.slice(begin + 1, end)
  const blank = block.findIndex((line) => line.trim() === '')
  if (blank < 0 || block.slice(0, blank).some((line) => line.indexOf(':') <= 0)) return null
  const payload = block.slice(blank + 1).join('').replace(/\s+/g, '')
  const signature = lines.slice(sigBegin + 1, sigEnd).join('').replace(/\s+/g, '')
  return BASE64.test(payload) && BASE64.test(signature) ? { payload, signature } : null
}

const nonEmpty = (v) => typeof v === 'string' && v.length > 0

/** The SDKs' verdict on a file, in their fixed order; the payload when it is `ok`. */
function verifyLicenseFile(text, { appId, keys, hwid, now = Date.now() }) {
  const armor = parseLicenseFile(text)
  if (!armor) return { code: 'bad_armor' }
  if (!signedByTrustedKey(armor.payload, armor.signature, keys)) return { code: 'bad_signature' }
  let p
  try {
    p = JSON.parse(Buffer.from(armor.payload, 'base64').toString('utf8'))
  } catch {
    return { code: 'malformed_payload' }
  }
  if (typeof p !== 'object' || p === null || Array.isArray(p)) return { code: 'malformed_payload' }
  if (p.v !== 1) return { code: 'unsupported_version' }
  const hwidPolicyOk =
    (p.hwid?.mode === 'bound' && Array.isArray(p.hwid.hwids) && p.hwid.hwids.length > 0 && p.hwid.hwids.every(nonEmpty)) ||
    p.hwid?.mode === 'any'
  const shaped =
    p.typ === 'authforge-license' &&
    ['appId', 'licenseKey', 'jti', 'kid', 'issuedAt'].every((field) => nonEmpty(p[field])) &&
    'expiresAt' in p &&
    (p.expiresAt === null || nonEmpty(p.expiresAt)) &&
    hwidPolicyOk
  if (!shaped) return { code: 'malformed_payload' }
  if (p.appId !== appId) return { code: 'wrong_app' }
  if (p.expiresAt !== null && !(Date.parse(p.expiresAt) > now)) return { code: 'expired' }
  if (p.hwid.mode === 'bound' && !p.hwid.hwids.includes(hwid)) return { code: 'hwid_mismatch' }
  return { code: 'ok', payload: p }
}

function checkOffline(s) {
  let text
  try {
    text = readFileSync(s['offline-file'], 'utf8')
  } catch (err) {
    throw new BadUsage(`cannot read the offline file: ${err.message}`)
  }
  const verdict = verifyLicenseFile(text, { appId: s['app-id'], keys: s.keys, hwid: s.hwid })
  if (verdict.code !== 'ok') throw new Refused(`offline file refused: ${verdict.code}`)
  const p = verdict.payload
  const machines = p.hwid.mode === 'any' ? 'any machine' : `this machine (1 of ${p.hwid.hwids.length} bound)`
  console.log(`offline file: ok, license ${p.licenseKey}, file expires ${p.expiresAt ?? 'never'}, valid on ${machines}`)
}

try {
  const s = readSettings()
  if (s.online) await checkOnline(s)
  if (s.offline) checkOffline(s)
  console.log('license: good')
} catch (err) {
  if (!(err instanceof Refused || err instanceof BadUsage)) throw err
  console.error(`license check failed: ${err.message}`)
  if (err instanceof BadUsage) console.error(USAGE)
  process.exit(err instanceof BadUsage ? 2 : 1)
}
