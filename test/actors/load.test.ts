import { heapStats } from 'bun:jsc'
import { expect, test } from 'bun:test'
import { licenseRecordBytes } from '../../src/actors/license-cache'
import { AppActors } from '../../src/actors/registry'
import { licenses } from '../../src/db/schema'
import { makeTestApp } from '../support/helpers'

const t = await makeTestApp()

/** What the JavaScript heap holds after a full collection: bytes (its size counts strings' characters and buffers) and objects. */
function held(): { bytes: number; objects: number } {
  Bun.gc(true)
  const { heapSize, objectCount } = heapStats()
  return { bytes: heapSize, objects: objectCount }
}

/** held() once it has stopped falling: what earlier test files left to be freed (servers closing) is gone. */
async function quietHeld(): Promise<{ bytes: number; objects: number }> {
  let last = held()
  for (let i = 0; i < 20; i++) {
    await Bun.sleep(50)
    const now = held()
    if (now.bytes >= last.bytes - 64 * 1024) return now
    last = now
  }
  return last
}

test("a cached license is counted at its record's exact size and holds no objects on the heap", async () => {
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
  const before = await quietHeld()
  for (let i = 0; i < n; i += 1_000) {
    await Promise.all(keys.slice(i, i + 1_000).map((key) => actors.ensureLicense(s.appId, key)))
  }
  // Answering for each cached license must not keep anything either.
  for (let i = 0; i < n; i += 1_000) {
    await Promise.all(
      keys.slice(i, i + 1_000).map((key) => {
        const license = actors.cachedLicense(s.appId, key)!.value!
        return t.ctx.payloads.sign(app, license, license.hwids[0]!, session, undefined, Date.now())
      }),
    )
  }
  const after = held()

  const record = licenseRecordBytes(s.appId, keys[0]!, actors.cachedLicense(s.appId, keys[0]!)!.value!)
  expect(actors.cachedBytes - appOnly).toBe(n * record)
  // Held as objects, each license was six or seven of them for the collector to walk.
  expect((after.objects - before.objects) / n).toBeLessThan(0.5)
  // The arena keeps room to grow (up to as much again as its records) and the table a few slots a license.
  expect((after.bytes - before.bytes) / n).toBeLessThanOrEqual(2 * record + 64)
})
