import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'
import { canonicalIp, IpRanges } from '../lib/ip'
import { Deadline } from '../lib/with-timeout'

/**
 * Where a webhook may point. Shared by the API (create/update) and the delivery worker, which checks
 * again right before sending because DNS answers change between the two.
 */

export const MAX_WEBHOOK_URL_LENGTH = 2048

// IPv6 outside 2000::/3 is never globally routable unicast: ::/8 (unspecified, loopback, IPv4-compatible
// and the RFC 6145 IPv4-translated ::ffff:0:0:0/96), 64:ff9b::/96 and 64:ff9b:1::/48 (NAT64, which
// would reach the IPv4 address they embed), 100::/64 (discard), 5f00::/16 (SRv6), fc00::/7 (unique
// local), fe80::/10 (link-local), fec0::/10 (site-local), ff00::/8 (multicast) and the unassigned rest.
// IPv4 is all admitted here, the IPv4-mapped form included, and judged by NON_PUBLIC below.
const ROUTABLE = IpRanges.of(['0.0.0.0/0', '2000::/3'])

// Inside those: loopback, RFC 1918, CGNAT, link-local (cloud metadata lives at 169.254.169.254),
// documentation, benchmarking, multicast, reserved; 2001::/23 (IETF protocols, Teredo among them, which
// embeds an IPv4 address), 2002::/16 (6to4, likewise) and the IPv6 documentation prefixes.
const NON_PUBLIC = IpRanges.of([
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.88.99.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '224.0.0.0/4',
  '240.0.0.0/4',
  '2001::/23',
  '2001:db8::/32',
  '2002::/16',
  '3fff::/20',
])

/** True when the address is globally routable unicast (IPv4-mapped IPv6 is judged as its IPv4). */
export function isPublicAddress(address: string): boolean {
  const ip = canonicalIp(address)
  return ip !== null && ROUTABLE.has(ip) && !NON_PUBLIC.has(ip)
}

export class TargetError extends Error {}

/** Parses and shape-checks a webhook URL: HTTPS, a host, no credentials. */
export function parseTargetUrl(text: string): URL {
  if (text.length > MAX_WEBHOOK_URL_LENGTH) {
    throw new TargetError(`url must be at most ${MAX_WEBHOOK_URL_LENGTH} characters`)
  }
  let url: URL
  try {
    url = new URL(text)
  } catch {
    throw new TargetError('url is not a valid URL')
  }
  // Stored and sent as parsed: non-ASCII and spaces percent-encoded, host names in punycode.
  if (url.href.length > MAX_WEBHOOK_URL_LENGTH) {
    throw new TargetError(`url must be at most ${MAX_WEBHOOK_URL_LENGTH} characters once normalized (non-ASCII characters percent-encoded)`)
  }
  if (url.protocol !== 'https:') throw new TargetError('url must use https://')
  if (!url.hostname) throw new TargetError('url has no host')
  // Nothing listens on port 0: every delivery would fail, and a test ping answer ok with status 0.
  if (url.port === '0') throw new TargetError('url port must be from 1 to 65535')
  // Credentials in a URL would be echoed by every list response; receivers authenticate by signature.
  if (url.username || url.password) throw new TargetError('url must not contain credentials')
  return url
}

/** The URL's host without IPv6 brackets. */
function hostOf(url: URL): string {
  return url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname
}

/**
 * Resolves the host and refuses it when any address it resolves to is not public: a name with one
 * public and one private record would otherwise reach the private one half the time. Returns the
 * vetted addresses, so the caller can connect to one of them rather than resolve again.
 */
export async function resolvePublicTarget(url: URL, timeoutMs = 5_000): Promise<string[]> {
  const host = hostOf(url)
  let addresses: string[]
  if (isIP(host)) {
    addresses = [host]
  } else {
    let deadline: Deadline | undefined
    const timeout = new Promise<never>((_, reject) => {
      deadline = new Deadline(() => reject(new TargetError(`url host ${host} did not resolve in time`)), timeoutMs)
    })
    try {
      const found = await Promise.race([lookup(host, { all: true, verbatim: true }), timeout])
      addresses = found.map((a) => a.address)
    } catch (err) {
      if (err instanceof TargetError) throw err
      throw new TargetError(`url host ${host} does not resolve`)
    } finally {
      deadline?.clear()
    }
  }
  if (addresses.length === 0) throw new TargetError(`url host ${host} does not resolve`)
  if (!addresses.every(isPublicAddress)) {
    throw new TargetError(`url host ${host} resolves to a loopback, private or otherwise non-public address`)
  }
  return addresses
}

export async function assertPublicTarget(url: URL, timeoutMs = 5_000): Promise<void> {
  await resolvePublicTarget(url, timeoutMs)
}

/**
 * The same request aimed at a vetted address: the URL names the IP, while the Host header and the
 * TLS server name (SNI and certificate check) keep the original host. Without this, fetch would
 * resolve the name again and a DNS answer changed in between (rebinding) could reach a private host.
 * Throws a TargetError when the address cannot be pinned.
 */
export function pinnedTarget(url: URL, address: string): { url: URL; host: string; serverName: string } | null {
  const host = hostOf(url)
  if (isIP(host)) return null
  const pinned = new URL(url)
  pinned.hostname = isIP(address) === 6 ? `[${address}]` : address
  // The setter ignores a host it cannot parse (an address with a zone id): sent by the name, the
  // request would be resolved again, to whatever the name then says. Pinned, or not sent.
  if (pinned.hostname === url.hostname) throw new TargetError('the vetted address cannot be connected to by itself')
  return { url: pinned, host: url.host, serverName: host }
}

/** Shape check plus, unless private targets are allowed, the address check. */
export async function checkTarget(text: string, allowPrivate: boolean): Promise<URL> {
  const url = parseTargetUrl(text)
  if (!allowPrivate) await assertPublicTarget(url)
  return url
}
