import { expect, test } from 'bun:test'
import { AppActors } from '../../src/actors/registry'
import { licenseRecordBytes } from '../../src/actors/license-cache'
import { generateLicenseKey } from '../../src/lib/crypto'
import { insertLicense } from '../support/client'
import { makeTestApp } from '../support/helpers'

const t = await makeTestApp()
/** The record of each license these tests insert (a 19-character key under a UUID app id, nothing else). */
const LICENSE_BYTES = licenseRecordBytes(crypto.randomUUID(), generateLicenseKey(), {
  key: '',
  appId: '',
  status: 'active',
  expiresAt: null,
  maxHwidSlots: 1,
  unlimitedHwidSlots: false,
  hwids: [],
  label: null,
  variables: {},
})

test('the license bound holds across actors: the oldest entry of any app goes first', async () => {
  const actors = new AppActors(t.ctx, { apps: 10, cacheBytes: 3 * LICENSE_BYTES, absent: 2 })
  const [a, b] = await Promise.all([t.seed(), t.seed()])
  const first = await insertLicense(t.ctx, a.appId)
  const others = [await insertLicense(t.ctx, b.appId), await insertLicense(t.ctx, a.appId), await insertLicense(t.ctx, b.appId)]
  await actors.ensureLicense(a.appId, first)
  await actors.ensureLicense(b.appId, others[0]!)
  await actors.ensureLicense(a.appId, others[1]!)
  expect(actors.cachedLicense(a.appId, first)?.value?.key).toBe(first)
  await actors.ensureLicense(b.appId, others[2]!)
  expect(actors.cachedLicense(a.appId, first)).toBeUndefined()
  expect([
    actors.cachedLicense(b.appId, others[0]!)?.value?.key,
    actors.cachedLicense(a.appId, others[1]!)?.value?.key,
    actors.cachedLicense(b.appId, others[2]!)?.value?.key,
  ]).toEqual(others)
  // A forgotten entry frees its room: the next load pushes nothing out.
  actors.forgetLicense(b.appId, others[0]!)
  await actors.ensureLicense(a.appId, first)
  expect(actors.cachedLicense(a.appId, others[1]!)?.value?.key).toBe(others[1]!)
  expect(actors.cachedLicense(b.appId, others[2]!)?.value?.key).toBe(others[2]!)
})

test('made-up license keys are bounded apart and never push a real one out', async () => {
  const actors = new AppActors(t.ctx, { apps: 10, cacheBytes: 2 * LICENSE_BYTES, absent: 2 })
  const s = await t.seed()
  const real = await insertLicense(t.ctx, s.appId)
  await actors.ensureLicense(s.appId, real)
  const madeUp = Array.from({ length: 5 }, generateLicenseKey)
  for (const key of madeUp) await actors.ensureLicense(s.appId, key)
  expect(actors.cachedLicense(s.appId, real)?.value?.key).toBe(real)
  expect(madeUp.map((key) => actors.cachedLicense(s.appId, key) !== undefined)).toEqual([false, false, false, true, true])
  expect(actors.cachedLicense(s.appId, madeUp[4]!)?.value).toBeNull()
})

test('made-up app ids are kept apart from the actors of real apps', async () => {
  const actors = new AppActors(t.ctx, { apps: 2, cacheBytes: 2 ** 20, absent: 2 })
  const s = await t.seed()
  await actors.ensureApp(s.appId)
  const real = actors.of(s.appId)
  const madeUp = Array.from({ length: 5 }, () => crypto.randomUUID())
  for (const id of madeUp) await actors.ensureApp(id)
  expect(actors.cachedApp(s.appId)?.value?.id).toBe(s.appId)
  expect(actors.of(s.appId)).toBe(real)
  expect(madeUp.map((id) => actors.cachedApp(id)?.value)).toEqual([undefined, undefined, undefined, null, null])
  expect(actors.loads.apps).toBe(6)
})

test('past the app bound the oldest idle actor goes, never one with work queued', async () => {
  const actors = new AppActors(t.ctx, { apps: 2, cacheBytes: 2 ** 20, absent: 10 })
  const [a, b, c, d] = await Promise.all([t.seed(), t.seed(), t.seed(), t.seed()])
  for (const s of [a, b, c]) await actors.ensureApp(s.appId)
  expect(actors.cachedApp(a.appId)).toBeUndefined()
  expect(actors.cachedApp(b.appId)?.value?.id).toBe(b.appId)
  expect(actors.cachedApp(c.appId)?.value?.id).toBe(c.appId)

  // b is the oldest now, but busy: c goes instead, and b keeps the one actor its writes queue on.
  const busy = actors.of(b.appId)
  let release!: () => void
  const held = busy.mailbox.run(() => new Promise<void>((resolve) => (release = resolve)))
  await actors.ensureApp(d.appId)
  expect(actors.of(b.appId)).toBe(busy)
  expect(actors.cachedApp(c.appId)).toBeUndefined()
  expect(actors.cachedApp(d.appId)?.value?.id).toBe(d.appId)
  release()
  await held
})

test('a Developer API change to an app no client uses leaves no actor behind, so it never pushes out an app in use', async () => {
  const actors = new AppActors(t.ctx, { apps: 2, cacheBytes: 2 ** 20, absent: 2 })
  const [hot, b, c] = await Promise.all([t.seed(), t.seed(), t.seed()])
  const key = await insertLicense(t.ctx, hot.appId)
  await actors.ensureApp(hot.appId)
  await actors.ensureLicense(hot.appId, key)
  expect(await actors.write(b.appId, async () => 'done', () => ({ app: true }))).toBe('done')
  await actors.write(c.appId, async () => 'done', () => ({ app: true }))
  expect(actors.existing(b.appId)).toBeUndefined()
  expect(actors.existing(c.appId)).toBeUndefined()
  expect(actors.cachedApp(hot.appId)?.value?.id).toBe(hot.appId)
  expect(actors.cachedLicense(hot.appId, key)?.value?.key).toBe(key)
})

test('an app loaded under another spelling of its id gets no actor: the spelling reads as absent', async () => {
  const actors = new AppActors(t.ctx)
  const s = await t.seed()
  await actors.ensureApp(s.appId.toUpperCase())
  expect(actors.existing(s.appId.toUpperCase())).toBeUndefined()
  expect(actors.cachedApp(s.appId.toUpperCase())?.value).toBeNull()
})

test('a write to an app no client uses never lets an app in use go, even with the registry full', async () => {
  const actors = new AppActors(t.ctx, { apps: 1, cacheBytes: 2 ** 20, absent: 2 })
  const [hot, cold] = await Promise.all([t.seed(), t.seed()])
  await actors.ensureApp(hot.appId)
  let during: unknown
  await actors.write(cold.appId, async () => {
    during = actors.cachedApp(hot.appId)?.value?.id
  }, () => ({ app: true }))
  expect(during).toBe(hot.appId)
  expect(actors.cachedApp(hot.appId)?.value?.id).toBe(hot.appId)
  expect(actors.existing(cold.appId)).toBeUndefined()
})
