import { createHash } from 'node:crypto'
import { badRequest } from '../../lib/errors'
import { characters, STORABLE } from '../../lib/model'

/** What a verified activation request asks for: a file for this machine, of this license if it names one. */
export interface ActivationRequest {
  hwid: string
  licenseKey: string | null
  /**
   * Why the license key the customer wrote in it cannot be used (too long, not UTF-8, NUL): the request
   * is refused for it only when the vendor gives no key of its own.
   */
  licenseKeyRefusal: string | null
  /** The app's id as the SDK spells it (any case): what it compares the file's `appId` with, exactly. */
  appId: string
}

const BEGIN = '-----BEGIN AUTHFORGE ACTIVATION REQUEST-----'
const END = '-----END AUTHFORGE ACTIVATION REQUEST-----'
const LICENSE_BEGIN = '-----BEGIN AUTHFORGE LICENSE-----'
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/
/** AuthForge's SDKs accept HWIDs up to 256 characters; this server's seats hold 128, as validate does. */
const MAX_HWID = 128


const refuse = (why: string) => badRequest(`Activation request refused: ${why}`)
const optionalText = (v: unknown) => v === undefined || typeof v === 'string'
/** A license key in the request longer than this is no key: refused, never echoed or looked up. */
const MAX_LICENSE_KEY = 64

/** A value from the payload, as a refusal may quote it: a short scalar as JSON, anything else by its kind (never a structure to walk). */
function brief(value: unknown): string {
  if (value === null || typeof value === 'number' || typeof value === 'boolean') return JSON.stringify(value)
  if (typeof value === 'string') return value.length <= 32 ? JSON.stringify(value) : `a string of ${value.length} characters`
  return Array.isArray(value) ? 'an array' : typeof value === 'object' ? 'an object' : 'none'
}

/** The `Checksum` header: the first 16 hex characters of SHA-256 of the base64 payload string. */
export const requestChecksum = (payloadBase64: string) =>
  createHash('sha256').update(payloadBase64, 'utf8').digest('hex').slice(0, 16)

const UTF8 = new TextDecoder('utf-8', { fatal: true })

/**
 * Reads an `.authforge-request` as AuthForge's SDKs write it, tolerating what e-mail does to it (CRLF,
 * a BOM, re-wrapped lines, text around the block), and checks it is this app's. Every refusal is a 400
 * whose message says which check failed.
 */
export function parseActivationRequest(text: string, appId: string): ActivationRequest {
  const lines = text.replace(/^\uFEFF/, '').replace(/\r\n?/g, '\n').split('\n').map((line) => line.trim())
  const begin = lines.indexOf(BEGIN)
  if (begin < 0) {
    if (lines.includes(LICENSE_BEGIN)) throw refuse('this is a license file (.authforge), not an activation request')
    throw refuse(`no ${BEGIN} block`)
  }
  const end = lines.indexOf(END, begin + 1)
  if (end < 0) throw refuse('the block is truncated (no END line)')
  const block = lines.slice(begin + 1, end)
  const blank = block.indexOf('')
  if (blank < 0) throw refuse('the block has no blank line between its headers and payload')
  const headers = new Map<string, string>()
  for (const line of block.slice(0, blank)) {
    const colon = line.indexOf(':')
    if (colon <= 0) throw refuse(`malformed header line ${brief(line)}`)
    headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim())
  }
  if (headers.get('version') !== '1') throw refuse(`unsupported version ${brief(headers.get('version') ?? null)}`)
  const payloadBase64 = block.slice(blank + 1).join('')
  if (payloadBase64 === '' || !BASE64.test(payloadBase64)) throw refuse('the payload is truncated or not base64')
  if (headers.get('checksum')?.toLowerCase() !== requestChecksum(payloadBase64)) {
    throw refuse('bad checksum (the request was altered or cut)')
  }
  const bytes = Buffer.from(payloadBase64, 'base64')
  let json: string
  let utf8 = true
  try {
    json = UTF8.decode(bytes)
  } catch {
    // The C++ SDK clips a machine name mid-character, or writes one in a Windows code page: fields this
    // server does not read. Read leniently, the payload is refused only where a field it uses is not UTF-8.
    utf8 = false
    json = bytes.toString('utf8')
  }
  let payload: Record<string, unknown>
  try {
    payload = JSON.parse(json)
  } catch {
    throw refuse('malformed payload (not JSON)')
  }
  if (typeof payload !== 'object' || payload === null || Array.isArray(payload)) throw refuse('malformed payload')
  if (payload.v !== 1) throw refuse(`unsupported version ${brief(payload.v)} in the payload`)
  const shaped =
    payload.typ === 'authforge-activation-request' &&
    typeof payload.appId === 'string' &&
    typeof payload.hwid === 'string' &&
    typeof payload.createdAt === 'string' &&
    ['machineName', 'os', 'sdk', 'licenseKey'].every((field) => optionalText(payload[field]))
  if (!shaped) throw refuse('malformed payload (typ, appId, hwid, createdAt or an optional field is missing or wrong)')
  // App ids are UUIDs, read under any spelling as validate reads them (canonicalAppId).
  const sameApp = (id: unknown) => typeof id === 'string' && id.toLowerCase() === appId
  if (!sameApp(headers.get('app-id')) || !sameApp(payload.appId)) throw refuse("it is another app's request")
  const hwid = payload.hwid as string
  // U+FFFD in place of bytes: bound and minted for, it would name a machine no SDK ever sends.
  if (!utf8 && hwid.includes('\uFFFD')) throw refuse('the HWID is not UTF-8')
  const length = characters(hwid)
  if (length < 1 || length > MAX_HWID) {
    throw refuse(`the HWID is ${length} characters; it must be 1 to ${MAX_HWID} (AuthForge allows 256; this server ${MAX_HWID})`)
  }
  // The payload is JSON, whose escapes can spell a NUL.
  if (!STORABLE.test(hwid)) throw refuse('the HWID holds NUL characters or unpaired surrogates')
  const licenseKey = (payload.licenseKey as string | undefined) || null
  return { hwid, licenseKey, licenseKeyRefusal: licenseKey && keyRefusal(licenseKey, utf8), appId: payload.appId as string }
}

/** Why a license key written in a request is none (never looked up, and quoted only by its length), or null. */
function keyRefusal(key: string, utf8: boolean): string | null {
  if (key.length > MAX_LICENSE_KEY) return `the license key is ${key.length} characters; a key is at most ${MAX_LICENSE_KEY}`
  if (!utf8 && key.includes('\uFFFD')) return 'the license key is not UTF-8'
  if (!STORABLE.test(key)) return 'the license key holds NUL characters or unpaired surrogates'
  return null
}
