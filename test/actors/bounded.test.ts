import { expect, test } from 'bun:test'
import { heapStats } from 'bun:jsc'
import { type Entry, type Held, type Holder, SharedBound } from '../../src/actors/bounded'

/** A holder as the actors are one: a Map of entries the bound may empty. */
function holder() {
  const entries = new Map<string, Entry<string>>()
  const h: Holder & { entries: typeof entries } = {
    entries,
    evicted(key: string, entry: Held) {
      if (entries.get(key) === entry) entries.delete(key)
    },
  }
  return h
}

const put = (bound: SharedBound, h: ReturnType<typeof holder>, key: string, value: string | null, bytes: number) =>
  h.entries.set(key, bound.hold(h, key, { epoch: 0, value }, bytes))

test('the byte bound holds across holders, the oldest entries out first however many it takes', () => {
  const bound = new SharedBound(1_000, 10)
  const [a, b] = [holder(), holder()]
  put(bound, a, 'a1', 'x', 300)
  put(bound, b, 'b1', 'x', 300)
  put(bound, a, 'a2', 'x', 300)
  expect(bound.bytes).toBe(900)
  // 600 more: the two oldest go (a1, then b1), a2 stays.
  put(bound, b, 'b2', 'x', 600)
  expect([...a.entries.keys(), ...b.entries.keys()]).toEqual(['a2', 'b2'])
  expect(bound.bytes).toBe(900)
  // A replaced or released entry frees its room at once.
  bound.release(a.entries.get('a2'))
  a.entries.delete('a2')
  expect(bound.bytes).toBe(600)
  put(bound, a, 'a3', 'x', 400)
  expect([...a.entries.keys(), ...b.entries.keys()]).toEqual(['a3', 'b2'])
})

test('absent entries are bounded apart by count and never push a present one out', () => {
  const bound = new SharedBound(1_000, 3)
  const h = holder()
  put(bound, h, 'real', 'x', 1_000)
  for (let i = 0; i < 50; i++) put(bound, h, `made-up-${i}`, null, 1_000)
  expect(h.entries.get('real')?.value).toBe('x')
  expect([...h.entries.keys()]).toEqual(['real', 'made-up-47', 'made-up-48', 'made-up-49'])
  expect(bound.bytes).toBe(1_000)
  bound.clear()
  expect(h.entries.size).toBe(0)
  expect(bound.bytes).toBe(0)
})

test('entries replaced again and again keep the count and the order right: the oldest live one goes next', () => {
  const bound = new SharedBound(1_000, 10)
  const h = holder()
  for (let i = 0; i < 10; i++) put(bound, h, `k${i}`, 'x', 100)
  // Every entry but k0 reloaded many times over (each reload goes to the back of the line).
  for (let round = 0; round < 2_000; round++) {
    const key = `k${1 + (round % 9)}`
    bound.release(h.entries.get(key))
    put(bound, h, key, 'x', 100)
  }
  expect(bound.bytes).toBe(1_000)
  expect(bound.size).toBe(10)
  put(bound, h, 'new', 'x', 100)
  expect(h.entries.has('k0')).toBe(false)
  put(bound, h, 'newer', 'x', 100)
  // The last reloads went k3, k4, …, k9, k1, k2 (rounds 1991 to 1999): k3 is the oldest now.
  expect(h.entries.has('k3')).toBe(false)
  expect(h.entries.has('k4')).toBe(true)
  expect(h.entries.size).toBe(10)
  expect(bound.bytes).toBe(1_000)
})

test('entries evicted at the bound leave nothing behind: a cache churning at it for millions of entries stays small', () => {
  const bound = new SharedBound(1_000, 10)
  const h = holder()
  const heap = () => {
    Bun.gc(true)
    return heapStats().heapSize
  }
  put(bound, h, 'warm', 'x', 600)
  const before = heap()
  // Each entry pushes the one before it out.
  for (let i = 0; i < 3_000_000; i++) put(bound, h, String(i % 100), 'x', 600)
  // One slot a churned entry (8 bytes each) would be 24 MB.
  expect(heap() - before).toBeLessThan(8 * 2 ** 20)
  expect(bound.size).toBe(1)
})
