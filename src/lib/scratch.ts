/**
 * Text encoded to UTF-8 in one buffer reused by every call on this thread, for bytes that are only read
 * back at once (as base64, or by a signature): a signed response encodes three texts, and a Buffer
 * allocated for each is memory the collector must find and free, which a closed in-process loop of
 * validates measured at 3–6 µs a request, several times what the encoding itself costs. Synchronous
 * use only: the next call overwrites the bytes.
 */
const buffer = Buffer.allocUnsafe(64 * 1024)

/** Room for the UTF-8 of `text`: the scratch buffer, or for a text too large for it (rare: big variables) one of its own. */
function roomFor(text: string): Buffer {
  // A UTF-16 code unit is at most 3 bytes of UTF-8; only a long text is measured exactly.
  if (text.length * 3 <= buffer.length) return buffer
  const bytes = Buffer.byteLength(text, 'utf8')
  return bytes <= buffer.length ? buffer : Buffer.allocUnsafe(bytes)
}

/** Writes `text` as UTF-8 at the start of the scratch buffer; returns the bytes' view. */
export function utf8Bytes(text: string): Buffer {
  const bytes = roomFor(text)
  return bytes.subarray(0, bytes.write(text, 0, 'utf8'))
}

/** The UTF-8 bytes of `text` in base64 or base64url, as Buffer.from(text).toString(encoding) gives them. */
export function utf8Base64(text: string, encoding: 'base64' | 'base64url'): string {
  const bytes = roomFor(text)
  return bytes.toString(encoding, 0, bytes.write(text, 0, 'utf8'))
}

/** The text whose UTF-8 bytes `encoded` holds, as Buffer.from(encoded, encoding).toString('utf8') reads it. */
export function decodeUtf8Base64(encoded: string, encoding: 'base64' | 'base64url'): string {
  // Four characters carry at most three bytes.
  const bytes = encoded.length <= buffer.length ? buffer : Buffer.allocUnsafe(encoded.length)
  return bytes.toString('utf8', 0, bytes.write(encoded, 0, encoding))
}
