import { expect, test } from 'bun:test'
import { SessionTokens } from '../../src/signing/session'

const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
const tokens = new SessionTokens(Buffer.alloc(32, 7))
const NOW = Date.UTC(2026, 10, 24)
const issued = (hwid = 'hwid-1') => tokens.issue({ app: 'app-1', lic: 'AAAA-BBBB-CCCC-DDDD', hwid, ttl: 3600 }, null, NOW)

test('a token reads back as the session it was issued with, whatever characters the HWID holds', () => {
  for (const hwid of ['hwid-1', 'é€😀', 'x'.repeat(128)]) {
    const { token, session } = issued(hwid)
    expect(tokens.readFor('app-1', token, hwid, NOW)).toEqual(session)
  }
})

test('a token whose MAC is not exactly this key\'s MAC of its body is refused', () => {
  const { token } = issued()
  const [body, mac] = token.split('.') as [string, string]
  const other = new SessionTokens(Buffer.alloc(32, 8)).issue({ app: 'app-1', lic: 'AAAA-BBBB-CCCC-DDDD', hwid: 'hwid-1', ttl: 3600 }, null, NOW)
  const flipped = `${mac[0] === 'A' ? 'B' : 'A'}${mac.slice(1)}`
  for (const forged of [
    `${body}.${flipped}`,
    `${body}.${mac}A`,
    `${body}.${mac}${mac}`,
    `${body}.${mac.repeat(50)}`,
    `${body}.${mac.slice(0, -2)}`,
    `${body}.`,
    `${body}.${other.token.split('.')[1]}`,
    `${body.slice(0, -2)}.${mac}`,
    // What base64url decoding skips or ignores: the same MAC, spelled as it was never issued.
    `${body}.${mac}!!`,
    `${body}.${mac}==`,
    `${body}. ${mac}`,
    `${body}.${mac.slice(0, 20)}\n${mac.slice(20)}`,
    `${body}.${mac.slice(0, -1)}${BASE64URL[BASE64URL.indexOf(mac[42]!) ^ 1]}`,
  ]) {
    expect(tokens.read(forged, NOW)).toBeNull()
  }
  expect(tokens.read(token, NOW)).not.toBeNull()
  expect(tokens.read(token, NOW + 3600 * 1000)).toBeNull()
})
