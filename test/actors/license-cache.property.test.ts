/**
 * The license cache (src/actors/license-cache.ts) against a Map of what was last set: whatever it
 * answers is exactly what was set for that app and key, the newest entry is always found, the oldest go
 * first, and its bytes are the exact sum of the records it holds, within the bound, through growth,
 * compaction and eviction, for keys of any UTF-16 text.
 */
import { expect, test } from 'bun:test'
import fc from 'fast-check'
import type { Entry } from '../../src/actors/bounded'
import { LicenseCache, licenseRecordBytes } from '../../src/actors/license-cache'
import type { CachedLicense } from '../../src/actors/load'

const SEED = 20261129
const APPS = ['6f1c2a9e-4b4f-4f6e-9a53-1c3f8e2d7b10', '0b7d5e3a-9c21-4d8f-8e6a-2f4c9b1a3d55']

const text = (maxLength: number) => fc.string({ unit: fc.constantFrom('a', 'Z', 'é', '€', '😀', '-', '0'), maxLength })
// Keys come from requests: any code units, lone surrogates too, and a few spellings often enough to collide.
const key = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom('K1', 'K2', 'K3', 'K4', 'K5', 'K\ud800', 'K\udc00', 'K\ufffd') },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 12 }) },
)
const license: fc.Arbitrary<CachedLicense | null> = fc.option(
  fc.record({
    key: fc.constant(''),
    // A license looked up under another app than its own is cached there too (and refused by the plan).
    appId: fc.constantFrom(...APPS, ''),
    status: fc.constantFrom('active' as const, 'revoked' as const),
    expiresAt: fc.option(fc.integer({ min: 0, max: 4_102_444_800_000 }), { nil: null }),
    maxHwidSlots: fc.integer({ min: 0, max: 2 ** 31 }),
    unlimitedHwidSlots: fc.boolean(),
    // HWIDs, labels and variables come from PostgreSQL rows: well-formed text.
    hwids: fc.array(text(40), { maxLength: 4 }),
    label: fc.option(text(400), { nil: null }),
    variables: fc.oneof(fc.constant({}), fc.dictionary(text(8), fc.oneof(text(20), fc.integer(), fc.boolean()), { maxKeys: 3 })),
  }),
  { freq: 4 },
)
const command = fc.oneof(
  { weight: 24, arbitrary: fc.record({ op: fc.constant('set' as const), app: fc.constantFrom(...APPS), key, epoch: fc.nat(), value: license }) },
  { weight: 4, arbitrary: fc.record({ op: fc.constant('delete' as const), app: fc.constantFrom(...APPS), key }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('clear' as const) }) },
)

/** An entry as its key would read it back. */
const expected = (k: string, entry: Entry<CachedLicense>): Entry<CachedLicense> => ({
  epoch: entry.epoch,
  value: entry.value && { ...entry.value, key: k },
})

test('the cache answers what was last set or nothing, keeps the newest, drops the oldest first, counts its bytes exactly', () => {
  fc.assert(
    fc.property(fc.constantFrom(1_500, 6_000, 2 ** 30), fc.array(command, { minLength: 50, maxLength: 600 }), (maxBytes, commands) => {
      const cache = new LicenseCache(maxBytes, 5)
      // What was last set per app and key, in the order of setting (a Map keeps insertion order).
      let model = new Map<string, { app: string; key: string; entry: Entry<CachedLicense> }>()
      for (const c of commands) {
        if (c.op === 'clear') {
          cache.clear()
          model = new Map()
          continue
        }
        const id = `${c.app} ${c.key}`
        model.delete(id)
        if (c.op === 'delete') {
          cache.delete(c.app, c.key)
          expect(cache.get(c.app, c.key)).toBeUndefined()
          continue
        }
        const entry = { epoch: c.epoch, value: c.value }
        cache.set(c.app, c.key, entry)
        model.set(id, { app: c.app, key: c.key, entry })
        expect(cache.get(c.app, c.key)).toEqual(expected(c.key, entry))
        expect(cache.has(c.app, c.key)).toBe(true)
      }
      let bytes = 0
      let held = 0
      let present = 0
      for (const { app, key: k, entry } of model.values()) {
        const got = cache.get(app, k)
        expect(cache.has(app, k)).toBe(got !== undefined)
        // Oldest out first: once one license is held, every license set after it is held too.
        if (entry.value !== null && present > 0) expect(got).toBeDefined()
        if (got === undefined) continue
        held++
        expect(got).toEqual(expected(k, entry))
        if (entry.value === null) continue
        present++
        bytes += licenseRecordBytes(app, k, entry.value)
      }
      expect(cache.bytes).toBe(bytes)
      expect(cache.size).toBe(held)
      if (present > 1) expect(cache.bytes).toBeLessThanOrEqual(maxBytes)
    }),
    { seed: SEED, numRuns: 300 },
  )
})

const row = (i: number): CachedLicense => ({
  key: '',
  appId: APPS[i % 2]!,
  status: i % 3 === 0 ? 'revoked' : 'active',
  expiresAt: i % 2 === 0 ? null : 1_700_000_000_000 + i,
  maxHwidSlots: i % 5,
  unlimitedHwidSlots: i % 7 === 0,
  hwids: Array.from({ length: i % 4 }, (_, h) => `hwid-${i}-${h}`),
  label: i % 2 === 0 ? null : `label ${i}`,
  variables: i % 4 === 0 ? {} : { tier: i },
})

test('tens of thousands of entries: the table grows and the arena compacts without losing or mixing up one', () => {
  const cache = new LicenseCache(2 ** 30, 10)
  const n = 30_000
  const keyOf = (i: number) => `KEY-${i.toString(36).padStart(6, '0')}`
  for (let i = 0; i < n; i++) cache.set(APPS[i % 2]!, keyOf(i), { epoch: i, value: row(i) })
  // Every other one dropped, then each kept one written again: dead records pile up until a compaction.
  for (let i = 0; i < n; i += 2) cache.delete(APPS[i % 2]!, keyOf(i))
  for (let round = 0; round < 6; round++) for (let i = 1; i < n; i += 2) cache.set(APPS[i % 2]!, keyOf(i), { epoch: i + round, value: row(i) })
  for (let i = 0; i < n; i++) {
    const got = cache.get(APPS[i % 2]!, keyOf(i))
    if (i % 2 === 0) expect(got).toBeUndefined()
    else expect(got).toEqual({ epoch: i + 5, value: { ...row(i), key: keyOf(i) } })
    // Under the other app the key names nothing.
    expect(cache.get(APPS[(i + 1) % 2]!, keyOf(i))).toBeUndefined()
  }
  expect(cache.size).toBe(n / 2)
})

test('a table kept nearly half full through churn finds every entry, wherever its probe run wraps', () => {
  const cache = new LicenseCache(2 ** 30, 10)
  const held = new Map<string, number>()
  let next = 0
  // Just under the size at which the smallest table doubles: long probe runs, many across its end.
  for (; next < 2_000; next++) held.set(`KEY-${next}`, next)
  for (const [k, i] of held) cache.set(APPS[0]!, k, { epoch: i, value: row(i) })
  for (let step = 0; step < 40_000; step++) {
    const victim = `KEY-${next - 2_000 + (step % 7)}`
    if (held.delete(victim)) cache.delete(APPS[0]!, victim)
    const k = `KEY-${next}`
    held.set(k, next)
    cache.set(APPS[0]!, k, { epoch: next++, value: row(0) })
    while (held.size > 2_000) {
      const [oldest] = held.keys()
      held.delete(oldest!)
      cache.delete(APPS[0]!, oldest!)
    }
    if (step % 1_000 === 0) for (const [key, epoch] of held) expect(cache.get(APPS[0]!, key)?.epoch).toBe(epoch)
  }
  for (const [key, epoch] of held) expect(cache.get(APPS[0]!, key)?.epoch).toBe(epoch)
})

test('a full cache writing on keeps about its bound, the newest entries, and its bytes exact', () => {
  const maxBytes = 256 * 1024
  const cache = new LicenseCache(maxBytes, 10)
  const keyOf = (i: number) => `KEY-${i}`
  const n = 50_000
  for (let i = 0; i < n; i++) cache.set(APPS[0]!, keyOf(i), { epoch: i, value: row(i) })
  expect(cache.bytes).toBeLessThanOrEqual(maxBytes)
  // At least the three quarters a compaction keeps, from the newest back, without a gap.
  expect(cache.bytes).toBeGreaterThan(0.7 * maxBytes)
  let bytes = 0
  let i = n - 1
  for (; i >= 0 && cache.has(APPS[0]!, keyOf(i)); i--) bytes += licenseRecordBytes(APPS[0]!, keyOf(i), row(i))
  expect(bytes).toBe(cache.bytes)
  for (; i >= 0; i--) expect(cache.has(APPS[0]!, keyOf(i))).toBe(false)
})

test('app entries beside the licenses take their room from the oldest licenses', () => {
  let apps = 0
  const cache = new LicenseCache(10_000, 10, () => apps)
  for (let i = 0; i < 40; i++) cache.set(APPS[0]!, `KEY-${i}`, { epoch: 0, value: row(i) })
  const before = cache.bytes
  apps = 5_000
  cache.trim()
  expect(cache.bytes + apps).toBeLessThanOrEqual(10_000)
  expect(cache.bytes).toBeLessThan(before)
  expect(cache.has(APPS[0]!, 'KEY-39')).toBe(true)
})

test('a license larger than the whole bound is held, alone, and reads back whole, 70,000 HWIDs and all', () => {
  const cache = new LicenseCache(64 * 1024, 10)
  cache.set(APPS[0]!, 'small', { epoch: 1, value: row(1) })
  const huge = { ...row(2), unlimitedHwidSlots: true, hwids: Array.from({ length: 70_000 }, (_, i) => `hwid-${i}`) }
  cache.set(APPS[0]!, 'huge', { epoch: 2, value: huge })
  expect(cache.get(APPS[0]!, 'huge')).toEqual({ epoch: 2, value: { ...huge, key: 'huge' } })
  expect(cache.has(APPS[0]!, 'small')).toBe(false)
  expect(cache.bytes).toBe(licenseRecordBytes(APPS[0]!, 'huge', huge))
  // The next one pushes it out and the cache goes on as before.
  cache.set(APPS[0]!, 'small', { epoch: 3, value: row(1) })
  expect(cache.has(APPS[0]!, 'huge')).toBe(false)
  expect(cache.get(APPS[0]!, 'small')?.epoch).toBe(3)
})
