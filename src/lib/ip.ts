import { BlockList, isIP } from 'node:net'
import ipaddr from 'ipaddr.js'

// One parser for every address the server compares (the client's, the lists', the trusted proxies',
// a webhook target's): written any way, one address has one canonical form, so they all agree.
//
// Each part is done by the tool that does it best:
// - node:net's isIP decides what is an address at all. It takes only dotted decimal without leading
//   zeros and RFC 4291 IPv6 text, where ipaddr.js would also read "010.1.1.1" as octal 8.1.1.1 and
//   "127.1" as 127.0.0.1, and Bun's BlockList "010.0.0.1" as 10.0.0.1: with them one address could be
//   written in forms that canonicalise apart, past a list entry.
// - The WHATWG URL host serialiser writes IPv6 the RFC 5952 way (lower case, no leading zeros, the
//   first longest zero run as "::"), natively: this runs per request, where ipaddr.js's regular
//   expressions take about 2 µs for an IPv6 address against 0.3 µs.
// - ipaddr.js reads IPv6 ending in dotted decimal, says whether an address is IPv4-mapped and which
//   IPv4 address it maps, off that path.
// - node:net's BlockList matches ranges, natively, on canonical text only.

/** Text canonicalIp returned: the only text IpRanges compares, so no raw spelling reaches a range check. */
export type CanonicalIp = string & { readonly canonicalIp: unique symbol }

const IPV4_MAPPED = ipaddr.parseCIDR('::ffff:0:0/96')

// ipaddr.js reads "::1.2.3.4" (IPv4-compatible, RFC 4291 2.5.5.1) as "::ffff:1.2.3.4", which would make
// it the IPv4 address while "::102:304", the same 16 bytes, stays IPv6. Spelled "::0:1.2.3.4" it is read
// as written.
const IPV4_COMPATIBLE = /^::(?=\d+\.\d+\.\d+\.\d+$)/

/** RFC 5952 text of an address isIP took as IPv6, without its zone (which names an interface of one host). */
function ipv6Text(address: string): string | null {
  const zone = address.indexOf('%')
  const bare = zone < 0 ? address : address.slice(0, zone)
  // Bun's URL parser refuses some valid forms ending in dotted decimal ("::0:0:0:ffff:1.2.3.4"):
  // ipaddr.js reads every such form, all hex ones being left to the faster serialiser.
  if (bare.includes('.')) {
    const spelled = bare.replace(IPV4_COMPATIBLE, '::0:')
    return ipaddr.IPv6.isValid(spelled) ? ipaddr.IPv6.parse(spelled).toString() : null
  }
  const host = URL.parse(`http://[${bare}]`)?.hostname
  return host ? host.slice(1, -1) : null
}

/**
 * The IPv4 address an IPv4-mapped IPv6 address in RFC 5952 text maps, else null. RFC 5952 writes every
 * mapped address as ::ffff:…, its five zero groups being the longest run: the prefix test keeps the
 * parse to those.
 */
function mappedIpv4(text: string): string | null {
  if (!text.startsWith('::ffff:')) return null
  const address = ipaddr.IPv6.parse(text)
  return address.match(IPV4_MAPPED) ? address.toIPv4Address().toString() : null
}

/**
 * Canonical text of an address, or null when the text is none: IPv4 in dotted decimal, IPv4-mapped
 * IPv6 as that IPv4 address, other IPv6 in RFC 5952 form without a zone. Surrounding spaces are ignored.
 */
export function canonicalIp(text: string): CanonicalIp | null {
  const address = text.trim()
  const kind = isIP(address)
  // What isIP accepts as IPv4 has no leading zeros and no other spelling: it is canonical already.
  if (kind === 4) return address as CanonicalIp
  if (kind !== 6) return null
  // How a dual-stack listener reports every IPv4 peer: answered without the serialiser.
  if (address.startsWith('::ffff:')) {
    const embedded = address.slice(7)
    if (isIP(embedded) === 4) return embedded as CanonicalIp
  }
  const ipv6 = ipv6Text(address)
  if (ipv6 === null) return null
  return (mappedIpv4(ipv6) ?? ipv6) as CanonicalIp
}

/**
 * What a per-IP limit counts a canonical address as: an IPv4 address itself, an IPv6 address its /64.
 * An IPv6 host is handed a whole /64 (SLAAC needs one; RFC 6177), so counted per address one host
 * would hold 2^64 buckets and pass every per-IP limit. Only the first four groups are spelled out;
 * every address of one /64 gives the same text.
 */
export function limitSubject(ip: string): string {
  if (!ip.includes(':')) return ip
  const gap = ip.indexOf('::')
  const head = (gap < 0 ? ip : ip.slice(0, gap)).split(':').filter(Boolean)
  const tail = gap < 0 ? [] : ip.slice(gap + 2).split(':').filter(Boolean)
  const groups = [...head, ...Array<string>(8 - head.length - tail.length).fill('0'), ...tail]
  return `${groups.slice(0, 4).join(':')}::/64`
}

/** An address range (a TRUSTED_PROXIES entry, a range webhooks refuse) as BlockList takes it. */
export interface Cidr {
  address: string
  prefix: number
  family: 'ipv4' | 'ipv6'
}

/**
 * Parses "1.2.3.4", "10.0.0.0/8" or "::1/128". An IPv4-mapped range of at least /96 is the IPv4 range
 * it maps ("::ffff:10.0.0.0/104" is 10.0.0.0/8). A zone is refused: it is no part of a range.
 */
export function parseCidr(text: string): Cidr | null {
  const [addressText = '', prefixText, ...rest] = text.trim().split('/')
  if (rest.length > 0 || addressText.includes('%')) return null
  const kind = isIP(addressText)
  if (kind === 0) return null
  const max = kind === 4 ? 32 : 128
  if (prefixText !== undefined && !/^\d{1,3}$/.test(prefixText)) return null
  const prefix = prefixText === undefined ? max : Number(prefixText)
  if (prefix > max) return null
  if (kind === 4) return { address: addressText, prefix, family: 'ipv4' }
  const ipv6 = ipv6Text(addressText)
  if (ipv6 === null) return null
  const ipv4 = prefix >= 96 ? mappedIpv4(ipv6) : null
  return ipv4 === null ? { address: ipv6, prefix, family: 'ipv6' } : { address: ipv4, prefix: prefix - 96, family: 'ipv4' }
}

/**
 * A set of address ranges. Since an IPv4-mapped IPv6 address is the IPv4 address, an IPv6 range that
 * holds ::ffff:0:0/96 (::/0, say) holds every IPv4 address too.
 */
export class IpRanges {
  readonly #list = new BlockList()
  readonly size: number

  constructor(ranges: readonly Cidr[]) {
    for (const range of ranges) this.#list.addSubnet(range.address, range.prefix, range.family)
    this.size = ranges.length
  }

  /** Ranges written in code: a typo is a programming error, thrown at start. */
  static of(texts: readonly string[]): IpRanges {
    return new IpRanges(
      texts.map((text) => {
        const range = parseCidr(text)
        if (!range) throw new Error(`bad built-in range ${text}`)
        return range
      }),
    )
  }

  has(ip: CanonicalIp): boolean {
    return this.#list.check(ip, ip.includes(':') ? 'ipv6' : 'ipv4')
  }
}
