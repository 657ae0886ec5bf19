import { afterAll, describe, expect, test } from 'bun:test'
import { MemoryStore } from '../../src/store/memory'
import { RedisStore } from '../../src/store/redis'
import type { Store } from '../../src/store/store'
import { TEST_REDIS_URL } from '../support/helpers'

interface Backend {
  name: string
  store: () => Store
}

const backends: Backend[] = [{ name: 'MemoryStore', store: () => memory }]
const memory = new MemoryStore()
let redis: RedisStore | undefined
if (TEST_REDIS_URL) {
  redis = new RedisStore(TEST_REDIS_URL)
  backends.push({ name: 'RedisStore', store: () => redis as RedisStore })
}

// Every key of this file starts with its run's prefix, so it can share a Redis DB and clean up after itself.
const RUN = `ls:test:contract:${crypto.randomUUID()}:`
let n = 0
const fresh = (what: string) => `${RUN}${what}:${++n}`

afterAll(async () => {
  if (!redis) return
  const found = await redis.redis.keys(`${RUN}*`)
  if (found.length > 0) await redis.redis.del(...found)
  await redis.close()
})

const T0 = Date.UTC(2030, 0, 1)

describe.each(backends)('$name', ({ store }) => {
  describe('take: a token bucket that refills continuously', () => {
    test('a fresh bucket holds its capacity and a take leaves capacity - cost', async () => {
      const key = fresh('take')
      expect(await store().take(key, 5, 1, T0)).toEqual({ ok: true, remaining: 4, retryAfterMs: 0 })
      expect(await store().take(key, 5, 1, T0, 3)).toEqual({
        ok: true,
        remaining: 1,
        retryAfterMs: 0,
      })
    })

    test('an empty bucket refuses, says when a token is back, and a refused take costs nothing', async () => {
      const key = fresh('take')
      for (let i = 0; i < 3; i++) expect((await store().take(key, 3, 50, T0)).ok).toBe(true)
      // 50 per second: one token every 20 ms.
      expect(await store().take(key, 3, 50, T0)).toEqual({
        ok: false,
        remaining: 0,
        retryAfterMs: 20,
      })
      expect(await store().take(key, 3, 50, T0 + 10)).toEqual({
        ok: false,
        remaining: 0,
        retryAfterMs: 10,
      })
      expect(await store().take(key, 3, 50, T0 + 20)).toEqual({
        ok: true,
        remaining: 0,
        retryAfterMs: 0,
      })
    })

    test('a cost above the tokens on hand waits for all of it', async () => {
      const key = fresh('take')
      expect((await store().take(key, 4, 2, T0, 4)).ok).toBe(true)
      expect(await store().take(key, 4, 2, T0 + 500, 2)).toEqual({
        ok: false,
        remaining: 1,
        retryAfterMs: 500,
      })
      expect(await store().take(key, 4, 2, T0 + 1000, 2)).toEqual({
        ok: true,
        remaining: 0,
        retryAfterMs: 0,
      })
    })

    test('an instance whose clock is behind refills nothing, and sets no one back to refill it again', async () => {
      const key = fresh('take')
      expect((await store().take(key, 2, 1, T0, 2)).ok).toBe(true)
      // Another instance, its clock a second behind, then this one again: the bucket keeps the latest
      // time it saw. Moved back, the next take would refill the skew's worth, and alternating
      // instances would earn that again on every round trip.
      // Its wait counts the second until its clock reaches the time kept.
      expect(await store().take(key, 2, 1, T0 - 1_000)).toEqual({ ok: false, remaining: 0, retryAfterMs: 2_000 })
      expect(await store().take(key, 2, 1, T0)).toEqual({ ok: false, remaining: 0, retryAfterMs: 1_000 })
      expect(await store().take(key, 2, 1, T0 + 1_000)).toEqual({ ok: true, remaining: 0, retryAfterMs: 0 })
    })

    test('refill never passes capacity, however long the bucket idles', async () => {
      const key = fresh('take')
      await store().take(key, 10, 5, T0)
      expect(await store().take(key, 10, 5, T0 + 3_600_000)).toEqual({
        ok: true,
        remaining: 9,
        retryAfterMs: 0,
      })
    })

    test('fractions accumulate: 20 per minute gives one token every 3 seconds', async () => {
      const key = fresh('take')
      const rate = 20 / 60
      for (let i = 0; i < 20; i++) expect((await store().take(key, 20, rate, T0)).ok).toBe(true)
      expect((await store().take(key, 20, rate, T0 + 1000)).ok).toBe(false)
      expect((await store().take(key, 20, rate, T0 + 2000)).ok).toBe(false)
      expect((await store().take(key, 20, rate, T0 + 3000)).ok).toBe(true)
    })

    test('a clock that steps back adds no tokens', async () => {
      const key = fresh('take')
      for (let i = 0; i < 2; i++) await store().take(key, 2, 1, T0)
      expect((await store().take(key, 2, 1, T0 - 60_000)).ok).toBe(false)
    })

    test('buckets are independent per key', async () => {
      const a = fresh('take')
      const b = fresh('take')
      expect((await store().take(a, 1, 1, T0)).ok).toBe(true)
      expect((await store().take(a, 1, 1, T0)).ok).toBe(false)
      expect((await store().take(b, 1, 1, T0)).ok).toBe(true)
    })

    test('concurrent takes never hand out more than the capacity', async () => {
      const key = fresh('take')
      const results = await Promise.all(
        Array.from({ length: 50 }, () => store().take(key, 20, 1, T0)),
      )
      expect(results.filter((r) => r.ok)).toHaveLength(20)
    })
  })

  describe('epochs and bump', () => {
    test('a key never bumped is at epoch 0', async () => {
      expect(await store().epochs([fresh('ep'), fresh('ep')])).toEqual([0, 0])
      expect(await store().epochs([])).toEqual([])
    })

    test('bump moves every listed key past its value and leaves the others', async () => {
      const [a, b, c] = [fresh('ep'), fresh('ep'), fresh('ep')]
      await store().bump([a, b])
      const [a1, b1] = (await store().epochs([a, b])) as [number, number]
      expect(a1).toBeGreaterThan(0)
      expect(b1).toBeGreaterThan(0)
      await store().bump([a])
      await store().bump([])
      const [a2, b2, c2] = (await store().epochs([a, b, c])) as [number, number, number]
      expect(a2).toBeGreaterThan(a1)
      expect([b2, c2]).toEqual([b1, 0])
    })

    test('concurrent bumps are all counted', async () => {
      const key = fresh('ep')
      await store().bump([key])
      const [first] = (await store().epochs([key])) as [number]
      await Promise.all(Array.from({ length: 24 }, () => store().bump([key])))
      expect((await store().epochs([key]))[0]).toBeGreaterThanOrEqual(first + 24)
    })
  })

  test('ping answers true', async () => {
    expect(await store().ping()).toBe(true)
  })
})
