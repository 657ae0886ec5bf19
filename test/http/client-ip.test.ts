import { expect, test } from 'bun:test'
import { ClientAddresses } from '../../src/http/client-ip'
import { parseCidr } from '../../src/lib/ip'

const proxies = ['10.0.0.0/8', '::1'].map((text) => parseCidr(text)!)

test('without trusted proxies the peer is the client, whatever X-Forwarded-For says', () => {
  const addresses = new ClientAddresses([])
  expect(addresses.of('::ffff:203.0.113.7', '198.51.100.1')).toBe('203.0.113.7')
  expect(addresses.of(null, null)).toBe('0.0.0.0')
})

test('behind trusted proxies the right-most hop that is not one of them is the client', () => {
  const addresses = new ClientAddresses(proxies)
  expect(addresses.of('10.0.0.2', '198.51.100.1, 203.0.113.9, 10.0.0.5')).toBe('203.0.113.9')
  expect(addresses.of('::1', '2001:DB8::0:1')).toBe('2001:db8::1')
  // Only proxies all the way: the peer stays the client.
  expect(addresses.of('10.0.0.2', '10.0.0.3')).toBe('10.0.0.2')
  // A hop that is no address ends the walk at the peer rather than trust what lies beyond it.
  expect(addresses.of('10.0.0.2', '198.51.100.1, junk')).toBe('10.0.0.2')
  // A peer that is not a trusted proxy cannot speak for anyone else.
  expect(addresses.of('198.51.100.1', '203.0.113.9')).toBe('198.51.100.1')
})

test('the peer kept from the last request is replaced when another peer comes', () => {
  const addresses = new ClientAddresses([])
  expect(addresses.of('::ffff:192.0.2.1', null)).toBe('192.0.2.1')
  expect(addresses.of('::ffff:192.0.2.1', null)).toBe('192.0.2.1')
  expect(addresses.of('2001:db8::2', null)).toBe('2001:db8::2')
  expect(addresses.of('::ffff:192.0.2.1', null)).toBe('192.0.2.1')
})

test('proxies and hops are compared canonically, however they are written', () => {
  const addresses = new ClientAddresses(['::ffff:10.0.0.0/104', '2001:DB8::/32'].map((text) => parseCidr(text)!))
  // A mapped peer inside a proxy range written as mapped IPv6, and a hop that is a proxy in another spelling.
  expect(addresses.of('::ffff:10.0.0.2', '198.51.100.1, 2001:db8:0:0::7')).toBe('198.51.100.1')
  expect(addresses.of('10.0.0.2', '0:0:0:0:0:FFFF:C633:6401')).toBe('198.51.100.1')
  // An octal-looking hop is no address (inet_aton would read 010 as 8): the walk ends at the peer.
  expect(addresses.of('10.0.0.2', '010.0.0.1')).toBe('10.0.0.2')
  expect(addresses.of('10.0.0.2', 'fe80::1%eth0')).toBe('fe80::1')
})

test("a hop written with the client's port, as some load balancers write it, is that address", () => {
  const addresses = new ClientAddresses(proxies)
  expect(addresses.of('10.0.0.2', '203.0.113.9:5555')).toBe('203.0.113.9')
  expect(addresses.of('10.0.0.2', '[2001:DB8::1]:5555, 10.0.0.5:443')).toBe('2001:db8::1')
  expect(addresses.of('10.0.0.2', '[2001:db8::1]')).toBe('2001:db8::1')
  // Still no address, so the walk ends at the peer: a port alone, an IPv4 address in brackets, a bad port.
  for (const hop of ['203.0.113.9:', '[203.0.113.9]:80', '203.0.113.9:123456', '2001:db8::1:5555:1:2:3:4:5'])
    expect(addresses.of('10.0.0.2', hop)).toBe('10.0.0.2')
})

test('a hop no address could be, however long, is read in time linear in its length, and is no address', () => {
  const addresses = new ClientAddresses(proxies)
  // Each took about half a second when the bracketed pattern backtracked over the colons.
  const started = performance.now()
  for (const hop of [`[${':'.repeat(15_900)}`, `[${':'.repeat(15_900)}]`, `${'1'.repeat(16_000)}`, `[${'::1'.repeat(5_000)}]:80`])
    expect(addresses.of('10.0.0.2', `203.0.113.9, ${hop}`)).toBe('10.0.0.2')
  expect(performance.now() - started).toBeLessThan(100)
})

test('a peer that is no address is named as it came and speaks for no one', () => {
  const addresses = new ClientAddresses([parseCidr('0.0.0.0/0')!])
  expect(addresses.of('not-an-ip', '203.0.113.9')).toBe('not-an-ip')
})
