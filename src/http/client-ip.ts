import { type Cidr, cidrContains, ipBytes } from '../config'

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

// Keep-alive connections repeat the same peer request after request: its canonical text is kept.
let lastPeer = ''
let lastPeerCanonical = ''

function canonicalPeer(peer: string): string {
  if (peer !== lastPeer) {
    lastPeerCanonical = canonicalIp(peer) ?? peer
    lastPeer = peer
  }
  return lastPeerCanonical
}

function trusted(ip: string, proxies: readonly Cidr[]): boolean {
  const bytes = ipBytes(ip)
  return bytes !== null && proxies.some((c) => cidrContains(c, bytes))
}

/**
 * The caller's address: the socket peer, unless that peer is a trusted proxy; then the right-most
 * X-Forwarded-For hop that is not itself a trusted proxy.
 */
export function clientIp(peer: string | null, forwardedFor: string | null, proxies: readonly Cidr[]): string {
  const socket = peer ? canonicalPeer(peer) : '0.0.0.0'
  if (!forwardedFor || proxies.length === 0 || !trusted(socket, proxies)) return socket
  const hops = forwardedFor.split(',').map((h) => h.trim()).filter(Boolean)
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = canonicalIp(hops[i] ?? '')
    if (hop === null) return socket
    if (!trusted(hop, proxies)) return hop
  }
  return socket
}
