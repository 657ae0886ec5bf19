import { describe, expect, test } from 'bun:test'
import { canonicalIp, cidrContains, ipBytes, parseCidr } from '../../src/lib/ip'

describe('canonicalIp', () => {
  test.each([
    ['127.0.0.1', '127.0.0.1'],
    [' 10.1.2.3 ', '10.1.2.3'],
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['::FFFF:7f00:1', '127.0.0.1'],
    ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
    ['2001:db8:0:1:0:0:0:1', '2001:db8:0:1::1'],
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'],
    ['::', '::'],
    ['::1', '::1'],
  ])('%s is %s', (text, canonical) => {
    expect(canonicalIp(text)).toBe(canonical)
  })

  test.each(['', 'localhost', '1.2.3', '1.2.3.4/8', '::g'])('%p is no address', (text) => {
    expect(canonicalIp(text)).toBeNull()
  })
})

describe('CIDR ranges', () => {
  test('an address alone is a range of one', () => {
    const one = parseCidr('192.168.1.1')
    expect(one).toEqual({ bytes: Uint8Array.from([192, 168, 1, 1]), prefix: 32 })
    expect(cidrContains(one!, ipBytes('192.168.1.1')!)).toBe(true)
    expect(cidrContains(one!, ipBytes('192.168.1.2')!)).toBe(false)
  })

  test('a prefix matches its range, in either family, and an IPv4-mapped address as IPv4', () => {
    const ten = parseCidr('10.0.0.0/8')!
    expect(cidrContains(ten, ipBytes('10.255.0.1')!)).toBe(true)
    expect(cidrContains(ten, ipBytes('::ffff:10.0.0.1')!)).toBe(true)
    expect(cidrContains(ten, ipBytes('11.0.0.1')!)).toBe(false)
    const v6 = parseCidr('2001:db8::/33')!
    expect(cidrContains(v6, ipBytes('2001:db8:7fff::1')!)).toBe(true)
    expect(cidrContains(v6, ipBytes('2001:db8:8000::1')!)).toBe(false)
    expect(cidrContains(v6, ipBytes('10.0.0.1')!)).toBe(false)
  })

  test.each(['10.0.0.0/33', '::/129', '10.0.0.0/x', '10.0.0.0/8/8', 'example.com/8', ''])('%p is refused', (text) => {
    expect(parseCidr(text)).toBeNull()
  })
})
