import { describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { SealError, Sealer } from '../../src/lib/crypto'
import { notOpening } from '../../src/signing/key-check'

const sealer = new Sealer(randomBytes(32))

describe('a sealed value that is not as seal() wrote it is a SealError, named as not opening', () => {
  const [version, iv, tag, body] = sealer.seal('a secret').split('.') as [string, string, string, string]
  test.each([
    ['a cut tag', [version, iv, 'AAAA', body]],
    ['a tag of 12 bytes (GCM takes those)', [version, iv, Buffer.alloc(12).toString('base64url'), body]],
    ['a cut IV', [version, iv.slice(0, 4), tag, body]],
    ['no IV', [version, '', tag, body]],
    ['another version', ['v2', iv, tag, body]],
  ])('%s', (_name, parts) => {
    const damaged = parts.join('.')
    expect(() => sealer.open(damaged)).toThrow(SealError)
    expect(notOpening({ keys: [{ id: 'key_x', sealed: damaged }], hooks: [] }, sealer)).toEqual(['signing key key_x'])
  })

  test('what seal() wrote opens', () => {
    expect(sealer.open(sealer.seal('a secret')).toString()).toBe('a secret')
  })
})
