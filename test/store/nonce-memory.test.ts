import { describe, expect, test } from 'bun:test'
import { heapStats } from 'bun:jsc'
import { randomBytes, randomUUID } from 'node:crypto'
import { MemoryStore } from '../../src/store/memory'
import { NonceMemory } from '../../src/store/nonce-memory'
import { keys } from '../../src/store/store'
import { request } from './request'

const DAY = 86_400_000
const WEEK = 7 * DAY

describe('nonces remembered in process', () => {
  test('a claim is refused for at least its TTL, and forgotten within a seventh of it more', () => {
    const nonces = new NonceMemory()
    const start = Date.parse('2031-01-01T05:00:00Z')
    expect(nonces.claim('ls:nonce:app:a', WEEK, start)).toBe(true)
    for (const later of [0, 1, DAY, WEEK - 1]) expect(nonces.claim('ls:nonce:app:a', WEEK, start + later)).toBe(false)
    expect(nonces.claim('ls:nonce:app:a', WEEK, start + WEEK + DAY)).toBe(true)
    // Another key, and the same key under another TTL, are claims of their own.
    expect(nonces.claim('ls:nonce:app:b', WEEK, start)).toBe(true)
    expect(nonces.claim('ls:nonce:app:b', 60_000, start)).toBe(true)
  })

  test('generations past their time are dropped whole, as claims arrive', () => {
    const nonces = new NonceMemory()
    const start = Date.parse('2031-01-01T00:00:00Z')
    for (let i = 0; i < 1000; i++) nonces.claim(`n${i}`, WEEK, start + i)
    expect(nonces.size).toBe(1000)
    nonces.claim('later', WEEK, start + WEEK + 2 * DAY)
    expect(nonces.size).toBe(1)
  })

  test('past its bound the oldest generation is forgotten early, and said so', () => {
    const forgotten: number[] = []
    const nonces = new NonceMemory((count) => forgotten.push(count), 100)
    const start = Date.parse('2031-01-01T00:00:00Z')
    for (let day = 0; day < 3; day++) for (let i = 0; i < 60; i++) expect(nonces.claim(`d${day}n${i}`, WEEK, start + day * DAY)).toBe(true)
    expect(nonces.size).toBeLessThanOrEqual(100)
    expect(forgotten).toEqual([60, 60])
    // The newest are still refused; the first day's were the ones forgotten.
    expect(nonces.claim('d2n59', WEEK, start + 2 * DAY)).toBe(false)
    expect(nonces.claim('d0n0', WEEK, start + 2 * DAY)).toBe(true)
  })

  test('the in-process store holds a claimed nonce in tens of bytes, not hundreds', async () => {
    const heapBytes = () => {
      Bun.gc(true)
      return heapStats().heapSize
    }
    const store = new MemoryStore()
    const now = Date.parse('2031-01-01T00:00:00Z')
    const { generation } = await store.snapshot([])
    const appId = randomUUID()
    const before = heapBytes()
    const n = 100_000
    for (let i = 0; i < n; i++) {
      const answer = await store.authorize(request(generation, now, { nonce: { key: keys.nonce('', appId, randomBytes(64).toString('hex')), ttlSeconds: WEEK / 1000 }, deny: true }))
      if (answer.kind !== 'denied') throw new Error(answer.kind)
    }
    // About 50 (the hash table's growth moves it); each was about 300 as an entry of the store's generic map.
    expect((heapBytes() - before) / n).toBeLessThan(150)
    await store.close()
  })
})
