import { describe, expect, test } from 'bun:test'
import { canonicalIp, IpRanges, limitSubject, parseCidr } from '../../src/lib/ip'

const canonical = (text: string): string | null => canonicalIp(text)

describe('canonicalIp', () => {
  test.each([
    ['127.0.0.1', '127.0.0.1'],
    [' 10.1.2.3 ', '10.1.2.3'],
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['::FFFF:7f00:1', '127.0.0.1'],
    ['0:0:0:0:0:ffff:127.0.0.1', '127.0.0.1'],
    // Bun's URL parser refuses this valid form.
    ['::0:0:0:ffff:127.0.0.1', '127.0.0.1'],
    ['::ffff:127.0.0.1%eth0', '127.0.0.1'],
    ['2001:DB8:0:0:0:0:0:1', '2001:db8::1'],
    ['2001:0db8:0000::0001', '2001:db8::1'],
    ['2001:db8:0:1:0:0:0:1', '2001:db8:0:1::1'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'],
    ['fe80::1%eth0', 'fe80::1'],
    // IPv4-compatible (deprecated) and IPv4-translated addresses are IPv6, spelled by their bytes.
    ['::1.2.3.4', '::102:304'],
    ['::0:1.2.3.4', '::102:304'],
    ['::ffff:0:1.2.3.4', '::ffff:0:102:304'],
    ['::', '::'],
    ['::1', '::1'],
  ])('%s is %s', (text, expected) => {
    expect(canonical(text)).toBe(expected)
  })

  // What inet_aton or ipaddr.js alone would read as an address: octal, shortened, hexadecimal and
  // integer IPv4, so a listed address cannot be written past its entry.
  test.each([
    '',
    'localhost',
    '1.2.3',
    '1.2.3.4/8',
    '::g',
    '010.1.1.1',
    '10.1.1.01',
    '127.1',
    '0x7f.0.0.1',
    '2130706433',
    '1.2.3.256',
    '::ffff:010.1.1.1',
    '00001::1',
    '1::2::3',
    '[::1]',
    '1.2.3.4%eth0',
  ])('%p is no address', (text) => {
    expect(canonical(text)).toBeNull()
  })
})

const ranges = (...texts: string[]) => IpRanges.of(texts)
const has = (set: IpRanges, text: string) => set.has(canonicalIp(text)!)

describe('limitSubject', () => {
  test.each([
    ['192.0.2.1', '192.0.2.1'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['2001:db8:1:2::6', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['2001:db8:1::', '2001:db8:1:0::/64'],
    ['1:2:3:4:5::', '1:2:3:4::/64'],
    ['::1', '0:0:0:0::/64'],
    ['::', '0:0:0:0::/64'],
    ['fe80::1:2:3:4', 'fe80:0:0:0::/64'],
  ])('%s counts as %s', (ip, subject) => {
    expect(limitSubject(ip)).toBe(subject)
  })
})

describe('CIDR ranges', () => {
  test('an address alone is a range of one', () => {
    expect(parseCidr('192.168.1.1')).toEqual({ address: '192.168.1.1', prefix: 32, family: 'ipv4' })
    const one = ranges('192.168.1.1')
    expect(has(one, '192.168.1.1')).toBe(true)
    expect(has(one, '192.168.1.2')).toBe(false)
  })

  test('a prefix matches its range, in either family, and an IPv4-mapped address as IPv4', () => {
    const ten = ranges('10.0.0.0/8')
    expect(has(ten, '10.255.0.1')).toBe(true)
    expect(has(ten, '::ffff:10.0.0.1')).toBe(true)
    expect(has(ten, '11.0.0.1')).toBe(false)
    expect(has(ten, '::a00:1')).toBe(false)
    const v6 = ranges('2001:db8::/33')
    expect(has(v6, '2001:db8:7fff::1')).toBe(true)
    expect(has(v6, '2001:db8:8000::1')).toBe(false)
    expect(has(v6, '10.0.0.1')).toBe(false)
  })

  test('an IPv4-mapped range is the IPv4 range; an IPv6 range holding the mapped block holds IPv4', () => {
    expect(parseCidr('::ffff:10.0.0.0/104')).toEqual({ address: '10.0.0.0', prefix: 8, family: 'ipv4' })
    expect(parseCidr('::FFFF:0:0/96')).toEqual({ address: '0.0.0.0', prefix: 0, family: 'ipv4' })
    expect(has(ranges('::/0'), '192.0.2.1')).toBe(true)
    expect(has(ranges('::/96'), '192.0.2.1')).toBe(false)
    expect(has(ranges('::/96'), '::1.2.3.4')).toBe(true)
  })

  test('a range written with host bits set covers its whole network', () => {
    expect(has(ranges('10.1.2.3/8'), '10.200.0.1')).toBe(true)
    expect(has(ranges('2001:db8::1/32'), '2001:db8:ffff::')).toBe(true)
  })

  test.each([
    '10.0.0.0/33',
    '::/129',
    '10.0.0.0/x',
    '10.0.0.0/8/8',
    '10.0.0.0/',
    '10.0.0.0/+8',
    '10.0.0.0/0008',
    'example.com/8',
    '010.0.0.0/8',
    '10.0/8',
    'fe80::%eth0/10',
    '',
  ])('%p is refused', (text) => {
    expect(parseCidr(text)).toBeNull()
  })
})
