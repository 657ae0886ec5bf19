/**
 * The scratch encoder (src/lib/scratch.ts) against the Buffer calls it replaces: the same text for
 * any string, lone surrogates and astral characters included, in and past the shared buffer's size,
 * and the same signature from signText as from signing the text's own Buffer.
 */
import { expect, test } from 'bun:test'
import fc from 'fast-check'
import { generateKeyPairSync, sign } from 'node:crypto'
import { signText } from '../../src/lib/crypto'
import { decodeUtf8Base64, utf8Base64, utf8Bytes } from '../../src/lib/scratch'

const SEED = 20261124
const RUNS = 2000
const encodings = ['base64', 'base64url'] as const
// Every UTF-16 code unit, unpaired surrogates included, and whole astral characters.
const text = fc.oneof(fc.string({ unit: 'binary', maxLength: 300 }), fc.string({ unit: fc.constantFrom('a', 'é', '€', '😀', '\ud800', '\udfff', '\0') }))

test('utf8Base64 and utf8Bytes give what Buffer.from(text, "utf8") does, for any text', () => {
  fc.assert(
    fc.property(text, fc.constantFrom(...encodings), (s, encoding) => {
      expect(utf8Base64(s, encoding)).toBe(Buffer.from(s, 'utf8').toString(encoding))
      expect(Buffer.compare(utf8Bytes(s), Buffer.from(s, 'utf8'))).toBe(0)
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

test('decodeUtf8Base64 reads any text, well-formed base64 or not, as Buffer.from(text, encoding) does', () => {
  const encoded = fc.oneof(
    text.map((s) => Buffer.from(s, 'utf8').toString('base64url')),
    text.map((s) => Buffer.from(s, 'utf8').toString('base64')),
    fc.string({ unit: fc.constantFrom('A', 'z', '0', '+', '/', '-', '_', '=', '.', ' ', 'é') }),
  )
  fc.assert(
    fc.property(encoded, fc.constantFrom(...encodings), (s, encoding) => {
      expect(decodeUtf8Base64(s, encoding)).toBe(Buffer.from(s, encoding).toString('utf8'))
    }),
    { seed: SEED, numRuns: RUNS },
  )
})

test('a text larger than the shared buffer is encoded whole, whether its characters fit the buffer or only its bytes', () => {
  const ascii = 'a'.repeat(40_000)
  expect(utf8Base64(ascii, 'base64')).toBe(Buffer.from(ascii, 'utf8').toString('base64'))
  const large = `${'é€😀'.repeat(30_000)}\ud800end`
  expect(utf8Base64(large, 'base64')).toBe(Buffer.from(large, 'utf8').toString('base64'))
  expect(decodeUtf8Base64(Buffer.from(large, 'utf8').toString('base64url'), 'base64url')).toBe(Buffer.from(large, 'utf8').toString('utf8'))
  expect(Buffer.compare(utf8Bytes(large), Buffer.from(large, 'utf8'))).toBe(0)
})

test('signText signs the UTF-8 of the text, as signing a Buffer of it does', () => {
  const { privateKey } = generateKeyPairSync('ed25519')
  fc.assert(
    fc.property(text, (s) => {
      expect(signText(s, privateKey)).toBe(sign(null, Buffer.from(s, 'utf8'), privateKey).toString('base64'))
    }),
    { seed: SEED, numRuns: 300 },
  )
})
