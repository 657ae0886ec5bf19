import { describe, expect, test } from 'bun:test'
import { poolSizePerProcess, REQUEST_POOL_SIZE } from '../../src/db/client'

describe('the request pool shared among server processes', () => {
  test('one process keeps the whole pool', () => {
    expect(poolSizePerProcess(1)).toBe(REQUEST_POOL_SIZE)
  })

  test('one per core: the server as a whole holds about the same, each process at least 4', () => {
    expect(poolSizePerProcess(2)).toBe(8)
    expect(poolSizePerProcess(3)).toBe(6)
    for (const n of [2, 3, 4]) expect(n * poolSizePerProcess(n)).toBeLessThan(REQUEST_POOL_SIZE + n)
    expect(poolSizePerProcess(8)).toBe(4)
    expect(poolSizePerProcess(64)).toBe(4)
  })
})
