/**
 * Property tests of src/lib/ip.ts against references over the address's 128 bits (an IPv4 address
 * a.b.c.d being ::ffff:a.b.c.d): any spelling RFC 4291 allows canonicalises to the one RFC 5952 text, and
 * range membership is a compare of the first prefix bits.
 */
import { expect, test } from 'bun:test'
import fc from 'fast-check'
import { canonicalIp, IpRanges, limitSubject, parseCidr } from '../../src/lib/ip'

const SEED = 20261124
const RUNS = 2000

type Groups = readonly number[] // eight 16-bit groups

const isMapped = (g: Groups) => g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff
const dotted = (g: Groups) => [g[6]! >> 8, g[6]! & 0xff, g[7]! >> 8, g[7]! & 0xff].join('.')

/** RFC 5952: lower case, no leading zeros, the first longest run of two or more zero groups as "::". */
function rfc5952(g: Groups): string {
  let start = -1
  let length = 1
  for (let i = 0; i < 8; i++) {
    let j = i
    while (j < 8 && g[j] === 0) j++
    if (j - i > length) [start, length] = [i, j - i]
  }
  const hex = g.map((x) => x.toString(16))
  if (start < 0) return hex.join(':')
  return `${hex.slice(0, start).join(':')}::${hex.slice(start + length).join(':')}`
}

const canonical = (g: Groups) => (isMapped(g) ? dotted(g) : rfc5952(g))

const group = fc.oneof(fc.constant(0), fc.constant(0xffff), fc.integer({ min: 0, max: 0xffff }))
const ipv6Groups = fc.array(group, { minLength: 8, maxLength: 8 })
const embedding = (head: number[]) =>
  fc.tuple(fc.integer({ min: 0, max: 0xffff }), fc.integer({ min: 0, max: 0xffff })).map(([hi, lo]) => [...head, hi, lo])
// IPv4-mapped (the IPv4 address itself), IPv4-compatible and RFC 6145 IPv4-translated (both IPv6).
const ipv4Groups = embedding([0, 0, 0, 0, 0, 0xffff])
const anyGroups = fc.oneof(ipv6Groups, ipv4Groups, embedding([0, 0, 0, 0, 0, 0]), embedding([0, 0, 0, 0, 0xffff, 0]))

interface Spelling {
  upper: boolean[]
  pad: number[]
  dottedTail: boolean
  plainIpv4: boolean
  squeezeAt: number
  squeezeLength: number
  zone: boolean
  spaces: boolean
}

const spelling: fc.Arbitrary<Spelling> = fc.record({
  upper: fc.array(fc.boolean(), { minLength: 8, maxLength: 8 }),
  pad: fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 8, maxLength: 8 }),
  dottedTail: fc.boolean(),
  plainIpv4: fc.boolean(),
  squeezeAt: fc.integer({ min: 0, max: 7 }),
  squeezeLength: fc.integer({ min: 1, max: 8 }),
  zone: fc.boolean(),
  spaces: fc.boolean(),
})

/** One of the many texts of an address, as `s` picks: case, leading zeros, "::", a dotted tail, a zone. */
function spell(g: Groups, s: Spelling, options: { zone: boolean } = { zone: true }): string {
  let text: string
  if (isMapped(g) && s.plainIpv4) {
    text = dotted(g)
  } else {
    const hexCount = s.dottedTail ? 6 : 8
    const parts = g.slice(0, hexCount).map((x, i) => {
      const hex = x.toString(16).padStart(s.pad[i]!, '0')
      return s.upper[i] ? hex.toUpperCase() : hex
    })
    if (s.dottedTail) parts.push(dotted(g))
    const end = s.squeezeAt + s.squeezeLength
    const squeezable = end <= hexCount && g.slice(s.squeezeAt, end).every((x) => x === 0)
    text = squeezable
      ? `${parts.slice(0, s.squeezeAt).join(':')}::${parts.slice(end).join(':')}`
      : parts.join(':')
    if (options.zone && s.zone) text += '%eth0'
  }
  return s.spaces ? ` ${text}\t` : text
}

test('every spelling of an address canonicalises to its RFC 5952 text, IPv4-mapped to the IPv4 address', () => {
  fc.assert(
    fc.property(anyGroups, fc.array(spelling, { minLength: 1, maxLength: 4 }), (g, spellings) => {
      const expected = canonical(g)
      expect<string | null>(canonicalIp(expected)).toBe(expected)
      for (const s of spellings) expect<string | null>(canonicalIp(spell(g, s))).toBe(expected)
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

const octets = fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 4, maxLength: 4 })

test('IPv4 with a leading zero, fewer than four parts or a hexadecimal part is no address', () => {
  fc.assert(
    fc.property(octets, fc.integer({ min: 0, max: 3 }), fc.integer({ min: 1, max: 3 }), (o, at, parts) => {
      const leadingZero = o.map((x, i) => (i === at ? `0${x}` : `${x}`)).join('.')
      const shortened = [...o.slice(0, parts - 1), o.slice(parts - 1).reduce((n, x) => n * 256 + x, 0)].join('.')
      const hexadecimal = o.map((x, i) => (i === at ? `0x${x.toString(16)}` : `${x}`)).join('.')
      for (const text of [leadingZero, shortened, hexadecimal, `::ffff:${leadingZero}`]) {
        expect<string | null>(canonicalIp(text)).toBeNull()
      }
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

const bit = (g: Groups, i: number) => (g[i >> 4]! >> (15 - (i & 15))) & 1
const inRange = (network: Groups, prefix: number, address: Groups) => {
  for (let i = 0; i < prefix; i++) if (bit(network, i) !== bit(address, i)) return false
  return true
}

/** `groups` with every bit after its first `shared` taken from `noise`. */
const sharing = (groups: Groups, noise: Groups, shared: number) =>
  groups.map((x, i) => {
    const keep = Math.min(16, Math.max(0, shared - i * 16))
    const mask = keep === 0 ? 0 : (0xffff << (16 - keep)) & 0xffff
    return (x & mask) | (noise[i]! & ~mask & 0xffff)
  })

/** A range and an address that shares its first `shared` bits, so that about half the cases fall inside. */
const rangeCase = fc
  .record({
    network: anyGroups,
    prefix: fc.integer({ min: 0, max: 128 }),
    noise: anyGroups,
    shared: fc.integer({ min: 0, max: 128 }),
    rangeSpelling: spelling,
    addressSpelling: spelling,
  })
  .map((c) => {
    const address = sharing(c.network, c.noise, c.shared)
    // The IPv4 spelling of a mapped range counts its prefix from bit 96.
    const asIpv4 = isMapped(c.network) && c.rangeSpelling.plainIpv4 && c.prefix >= 96
    const networkText = spell(c.network, { ...c.rangeSpelling, plainIpv4: asIpv4, spaces: false }, { zone: false })
    return {
      ...c,
      address,
      rangeText: `${networkText}/${asIpv4 ? c.prefix - 96 : c.prefix}`,
      addressText: spell(address, c.addressSpelling),
    }
  })

test('range membership agrees with a compare of the first prefix bits', () => {
  fc.assert(
    fc.property(fc.array(rangeCase, { minLength: 1, maxLength: 3 }), (cases) => {
      const ranges = IpRanges.of(cases.map((c) => c.rangeText))
      for (const c of cases) {
        const address = canonicalIp(c.addressText)!
        expect(IpRanges.of([c.rangeText]).has(address)).toBe(inRange(c.network, c.prefix, c.address))
        expect(ranges.has(address)).toBe(cases.some((r) => inRange(r.network, r.prefix, c.address)))
      }
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

test('a range parses to one form however it is spelled, an IPv4-mapped one of /96 or more as IPv4', () => {
  fc.assert(
    fc.property(anyGroups, fc.integer({ min: 0, max: 128 }), spelling, (g, prefix, s) => {
      const text = `${spell(g, { ...s, plainIpv4: false, spaces: false }, { zone: false })}/${prefix}`
      expect(parseCidr(text)).toEqual(
        isMapped(g) && prefix >= 96
          ? { address: dotted(g), prefix: prefix - 96, family: 'ipv4' }
          : { address: rfc5952(g), prefix, family: 'ipv6' },
      )
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

test("per-IP limits count an IPv6 address as its /64 and an IPv4 one as itself: two addresses share a subject exactly when they should", () => {
  // The second address keeps the first's first `shared` bits, so about half the pairs share their /64.
  const pair = fc
    .record({ a: anyGroups, noise: anyGroups, shared: fc.integer({ min: 0, max: 128 }) })
    .map(({ a, noise, shared }) => ({ a, b: sharing(a, noise, shared) }))
  fc.assert(
    fc.property(pair, ({ a, b }) => {
      const [subjectA, subjectB] = [a, b].map((g) => limitSubject(canonicalIp(canonical(g))!))
      const same = isMapped(a) || isMapped(b) ? canonical(a) === canonical(b) : inRange(a, 64, b)
      expect(subjectA === subjectB).toBe(same)
      if (isMapped(a)) expect(subjectA).toBe(dotted(a))
    }),
    { seed: SEED, numRuns: RUNS },
  )
})
