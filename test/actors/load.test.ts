import { heapStats } from 'bun:jsc'
import { expect, test } from 'bun:test'
import { licenseBytes } from '../../src/actors/load'
import { AppActors } from '../../src/actors/registry'
import { licenses } from '../../src/db/schema'
import { makeTestApp } from '../support/helpers'

const t = await makeTestApp()

/** Bytes the JavaScript heap holds after a full collection, strings' characters included. */
function heldBytes(): number {
  Bun.gc(true)
  const { heapSize, extraMemorySize } = heapStats()
  return heapSize + extraMemorySize
}

test('the byte estimate of a license entry covers what caching and answering for it keeps', async () => {
  const n = 10_000
  const s = await t.seed()
  // Keys spelled like real ones (19 characters), one 17-character HWID each.
  const keys = Array.from({ length: n }, (_, i) => `MEMO-${i.toString(16).padStart(4, '0')}-ABCD-EFGH`)
  for (let i = 0; i < n; i += 1_000) {
    const rows = keys.slice(i, i + 1_000).map((key) => ({ key, appId: s.appId, hwids: [`hwid-${key.slice(5, 17)}`] }))
    await t.ctx.database.db.insert(licenses).values(rows)
  }
  const actors = new AppActors(t.ctx, { apps: 10, cacheBytes: 2 ** 30, absent: 10 })
  await actors.ensureApp(s.appId)
  const app = actors.cachedApp(s.appId)!.value!
  const session = { token: 'x'.repeat(100), session: { exp: 2_000_000_000 } } as Parameters<typeof t.ctx.payloads.sign>[3]

  const appOnly = actors.cachedBytes
  const before = heldBytes()
  for (let i = 0; i < n; i += 1_000) {
    await Promise.all(keys.slice(i, i + 1_000).map((key) => actors.ensureLicense(s.appId, key)))
  }
  // Answering for each cached license must not keep anything the estimate does not count.
  for (let i = 0; i < n; i += 1_000) {
    await Promise.all(
      keys.slice(i, i + 1_000).map((key) => {
        const license = actors.cachedLicense(s.appId, key)!.value!
        return t.ctx.payloads.sign(app, license, license.hwids[0]!, session, undefined, Date.now())
      }),
    )
  }
  const held = heldBytes()
  const perEntry = (held - before) / n

  const estimate = licenseBytes(actors.cachedLicense(s.appId, keys[0]!)!.value!)
  expect(actors.cachedBytes - appOnly).toBe(n * estimate)
  expect(perEntry).toBeLessThanOrEqual(estimate)
  // High, not wildly so: a bound counting four times what entries hold would keep a quarter of what it may
  // (the estimate also covers the garbage of churning entries, which this test does not make). Measured by
  // what dropping the entries frees, two collections a moment apart (~410 bytes: the test keeps the keys):
  // the growth above also reads what the suite's other files freed meanwhile, as much as half of it.
  actors.startOver(actors.generation + 1)
  const freedPerEntry = (held - heldBytes()) / n
  expect(freedPerEntry).toBeGreaterThan(estimate / 4)
})
