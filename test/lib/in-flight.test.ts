import { expect, test } from 'bun:test'
import { InFlightLimit } from '../../src/lib/in-flight'

test('each key has its own limit; leaving makes room once, however often it is called', () => {
  const limit = new InFlightLimit(2)
  const a1 = limit.enter('a')
  const a2 = limit.enter('a')
  expect(a1).not.toBeNull()
  expect(a2).not.toBeNull()
  expect(limit.enter('a')).toBeNull()
  expect(limit.enter('b')).not.toBeNull()
  a1!()
  a1!()
  expect(limit.enter('a')).not.toBeNull()
  expect(limit.enter('a')).toBeNull()
})
