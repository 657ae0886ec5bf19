import { isIP } from 'node:net'

// One parser for every address the server compares (the client's, the lists', the trusted proxies',
// a webhook target's): written any way, one address has one canonical form, so they all agree.

/** An address range (TRUSTED_PROXIES, the non-public ranges webhooks refuse), compared on canonical bytes. */
export interface Cidr {
  bytes: Uint8Array
  prefix: number
}

/** Parses "1.2.3.4", "10.0.0.0/8" or "::1/128" into canonical bytes and a prefix length. */
export function parseCidr(text: string): Cidr | null {
  const [addr, prefixText, ...rest] = text.trim().split('/')
  if (!addr || rest.length > 0) return null
  const bytes = ipBytes(addr)
  if (!bytes) return null
  const max = bytes.length * 8
  if (prefixText === undefined) return { bytes, prefix: max }
  if (!/^\d+$/.test(prefixText)) return null
  const prefix = Number(prefixText)
  return prefix <= max ? { bytes, prefix } : null
}

/** Canonical bytes of an IP address: IPv4-mapped IPv6 collapses to the 4 IPv4 bytes. */
export function ipBytes(text: string): Uint8Array | null {
  const kind = isIP(text)
  if (kind === 4) return Uint8Array.from(text.split('.').map(Number))
  if (kind !== 6) return null
  const [head = '', tail] = text.split('::') as [string, string | undefined]
  const parse = (part: string): number[] => {
    if (part === '') return []
    const out: number[] = []
    for (const group of part.split(':')) {
      if (group.includes('.')) {
        const v4 = group.split('.').map(Number)
        out.push(((v4[0] ?? 0) << 8) | (v4[1] ?? 0), ((v4[2] ?? 0) << 8) | (v4[3] ?? 0))
      } else out.push(parseInt(group, 16))
    }
    return out
  }
  const left = parse(head)
  const right = tail === undefined ? [] : parse(tail)
  const groups = [...left, ...new Array(8 - left.length - right.length).fill(0), ...right]
  const bytes = new Uint8Array(16)
  groups.forEach((g, i) => {
    bytes[i * 2] = g >> 8
    bytes[i * 2 + 1] = g & 0xff
  })
  const mapped = bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 0xff && bytes[11] === 0xff
  return mapped ? bytes.slice(12) : bytes
}

export function cidrContains(cidr: Cidr, ip: Uint8Array): boolean {
  if (cidr.bytes.length !== ip.length) return false
  let bits = cidr.prefix
  for (let i = 0; i < ip.length && bits > 0; i++, bits -= 8) {
    const mask = bits >= 8 ? 0xff : (0xff << (8 - bits)) & 0xff
    if (((cidr.bytes[i] ?? 0) & mask) !== ((ip[i] ?? 0) & mask)) return false
  }
  return true
}

/** Canonical text of an address: IPv4-mapped IPv6 becomes plain IPv4, IPv6 is compressed lower case. */
export function canonicalIp(text: string): string | null {
  const bytes = ipBytes(text.trim())
  if (!bytes) return null
  if (bytes.length === 4) return bytes.join('.')
  const groups: string[] = []
  for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] ?? 0) << 8) | (bytes[i + 1] ?? 0)).toString(16))
  // Compress the longest run of two or more zero groups, as RFC 5952 asks.
  let best = -1
  let bestLen = 0
  for (let i = 0; i < 8; ) {
    if (groups[i] !== '0') {
      i++
      continue
    }
    let j = i
    while (j < 8 && groups[j] === '0') j++
    if (j - i > bestLen && j - i >= 2) {
      best = i
      bestLen = j - i
    }
    i = j
  }
  if (best < 0) return groups.join(':')
  return `${groups.slice(0, best).join(':')}::${groups.slice(best + bestLen).join(':')}`
}
