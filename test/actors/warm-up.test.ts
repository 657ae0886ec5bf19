/**
 * The license cache is filled from PostgreSQL at start (actors/warm-up.ts): a license validated for the
 * first time then costs no PostgreSQL read, the fill stays within its share of CACHE_MAX_MB, and the
 * rule that makes caching safe holds for what it read.
 */
import { expect, test } from 'bun:test'
import { ACTOR_LIMITS, AppActors } from '../../src/actors/registry'
import type { CachedLicense } from '../../src/actors/load'
import { CacheWarmUp } from '../../src/actors/warm-up'
import { loadConfig } from '../../src/config'
import { licenses } from '../../src/db/schema'
import { generateLicenseKey } from '../../src/lib/crypto'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, sharedInfra, type TestApp } from '../support/helpers'
import { withOverrides } from '../support/overrides'
import { startServer } from '../support/server-process'
import { until } from '../support/servers'

const t = await makeTestApp()

const validate = (app: TestApp, s: { appId: string; appSecret: string }, licenseKey: string, h: string) =>
  app.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })

test('CACHE_WARM_UP is on unless set to false', () => {
  expect(loadConfig({}).cacheWarmUp).toBe(true)
  expect(loadConfig({ CACHE_WARM_UP: 'false' }).cacheWarmUp).toBe(false)
})

// An embedded server in either pass: run once.
test.skipIf(MODE !== 'embedded')('the server warms its cache at start', async () => {
  const server = await startServer({ DATABASE_URL: '', REDIS_URL: '' })
  try {
    expect(await until(async () => server.log().includes('"license cache warmed"'), (seen) => seen)).toBe(true)
  } finally {
    await server.stop()
  }
}, 60_000)

test('the warm-up caches the licenses, and a first validate of one reads no license from PostgreSQL', async () => {
  const s = await t.seed()
  const h = hwid()
  const licenseKeys = await Promise.all([1, 2, 3, 4, 5].map(() => insertLicense(t.ctx, s.appId, { hwids: [h] })))
  const w = await makeTestApp()
  await w.ctx.actors.startWarmUp().idle()
  for (const key of licenseKeys) expect(w.ctx.actors.cachedLicense(s.appId, key)?.value?.hwids).toEqual([h])
  const reads = w.ctx.actors.loads.licenses
  const res = await validate(w, s, licenseKeys[0]!, h)
  expect(res.status, JSON.stringify(res.body)).toBe(200)
  expect(w.ctx.actors.loads.licenses).toBe(reads)
})

test('the warm-up fills its share of the byte bound and pushes nothing out', async () => {
  const s = await t.seed()
  // More licenses than the bound holds, so the fill, not the table, ends the pass.
  await Promise.all(Array.from({ length: 120 }, () => insertLicense(t.ctx, s.appId)))
  const cacheBytes = 8 * 1024
  const actors = new AppActors({ ...t.ctx }, { ...ACTOR_LIMITS, cacheBytes })
  const warm = actors.startWarmUp()
  await warm.idle()
  const filled = actors.cachedBytes
  // Stopped at the fill, entries counted with their size: under the bound, so the bound evicted nothing.
  expect(filled).toBeLessThanOrEqual(0.9 * cacheBytes)
  expect(filled).toBeGreaterThan(0.5 * cacheBytes)
  // A second pass finds the cache full and adds nothing.
  warm.start()
  await warm.idle()
  expect(actors.cachedBytes).toBe(filled)
})

/** The shared store with a hook run once, just before or just after the first `snapshot` whose keys `match`. */
async function hookedStore(match: (epochKeys: readonly string[]) => boolean) {
  const { store } = await sharedInfra()
  const hook = { run: null as null | (() => Promise<void>), before: false }
  const once = async (epochKeys: readonly string[], before: boolean) => {
    const run = hook.run
    if (!run || hook.before !== before || !match(epochKeys)) return
    hook.run = null
    await run()
  }
  const watched = withOverrides(store, {
    snapshot: async (epochKeys) => {
      await once(epochKeys, true)
      const read = await store.snapshot(epochKeys)
      await once(epochKeys, false)
      return read
    },
  })
  return { store: watched, hook }
}

// Another instance revokes while this one warms up: wherever the revoke falls, this one never serves the row it read before.
// (Just before the epoch read is where rows read ahead of their epochs would be cached stale.)
for (const when of ['just before the epoch read', 'between the epoch read and the row read', 'after the warm-up'] as const) {
  test(`a revoke by another instance ${when} is never served stale`, async () => {
    const s = await t.seed()
    const h = hwid()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: [h] })
    const { store, hook } = await hookedStore((epochKeys) => epochKeys.some((key) => key.endsWith(licenseKey)))
    const a = await makeTestApp({ store })
    const revoke = async () => {
      const put = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
      expect(put.status).toBe(200)
    }
    if (when !== 'after the warm-up') {
      hook.run = revoke
      hook.before = when === 'just before the epoch read'
    }
    await a.ctx.actors.startWarmUp().idle()
    if (when === 'after the warm-up') {
      expect(a.ctx.actors.cachedLicense(s.appId, licenseKey)?.value?.status).toBe('active')
      await revoke()
    } else {
      expect(hook.run).toBeNull()
    }
    expect((await validate(a, s, licenseKey, h)).body.error).toBe('revoked')
  })
}

/** CacheWarmUp over `keys` of one app, in pages of 1,000, with every call counted and hooks to steer it. */
function fakeWarmUp(licenseKeys: string[], timing = { retryMs: 10, passEveryMs: 0 }) {
  const seen = { pages: 0, kept: [] as string[], generation: 1, down: false, afterPage: null as null | ((last: boolean) => void) }
  const warm = new CacheWarmUp(
    {
      keyPage: async (after, limit) => {
        if (seen.down) throw new Error('connection refused')
        seen.pages++
        const page = licenseKeys.filter((key) => key > after).slice(0, limit)
        seen.afterPage?.(page.length === 0)
        return page.map((key) => ({ key, appId: 'app-1' }))
      },
      snapshot: async (epochKeys) => ({ generation: seen.generation, epochs: epochKeys.map(() => 0) }),
      rows: async (keys) => new Map(keys.map((key) => [key, { key, appId: 'app-1', hwids: [], label: null, variables: {} } as unknown as CachedLicense])),
      shardOfApp: async () => '',
      adopt: () => {},
      keepIfMissing: (_, key) => seen.kept.push(key) > 0,
      hasRoom: () => true,
      generation: () => seen.generation,
    },
    timing,
  )
  return { warm, seen }
}

const keysOf = (n: number) => Array.from({ length: n }, (_, i) => `K-${String(i).padStart(5, '0')}`)

test('a pass that failed (PostgreSQL unreachable at start) is tried again', async () => {
  const { warm, seen } = fakeWarmUp(['K-1'])
  seen.down = true
  warm.start()
  await warm.idle()
  expect(seen.kept).toEqual([])
  seen.down = false
  expect(await until(async () => seen.kept.length, (n) => n > 0, 2_000)).toBe(1)
  await warm.stop()
})

test('a pass that failed before caching anything does not take a turn: PostgreSQL coming up late is retried at the retry pace', async () => {
  const { warm, seen } = fakeWarmUp(['K-1'], { retryMs: 10, passEveryMs: 60_000 })
  seen.down = true
  warm.start()
  // Several failed attempts, more than the pacing's burst.
  await Bun.sleep(100)
  seen.down = false
  expect(await until(async () => seen.kept.length, (n) => n > 0, 2_000)).toBe(1)
  await warm.stop()
})

test('a start() just as a pass ends is never lost, however late in that pass it lands', async () => {
  for (let steps = 0; steps < 12; steps++) {
    const { warm, seen } = fakeWarmUp(['K-1'])
    let asked = false
    seen.afterPage = (last) => {
      if (!last || asked) return
      asked = true
      // Lands `steps` microtasks after the pass read its last (empty) page.
      const later = (n: number): void => (n === 0 ? warm.start() : queueMicrotask(() => later(n - 1)))
      later(steps)
    }
    warm.start()
    await warm.idle()
    await Bun.sleep(1)
    await warm.idle()
    // Two passes of two pages each: the one asked for was run.
    expect(seen.pages, `a start() ${steps} microtasks after the last page`).toBe(4)
  }
})

test('a generation change read by the warm-up mid-pass restarts the pass once, under the new generation', async () => {
  const licenseKeys = keysOf(2_500)
  const { warm, seen } = fakeWarmUp(licenseKeys)
  let pages = 0
  seen.afterPage = () => {
    if (++pages === 2) seen.generation = 2
  }
  warm.start()
  await warm.idle()
  // Page 1 cached under generation 1, page 2 found generation 2: the pass began again and cached all.
  expect(seen.kept.length).toBe(1_000 + licenseKeys.length)
  expect(seen.pages).toBe(2 + 4)
})

test('after the start and one refill, passes wait their turn: a store that keeps reconnecting gets one pass per interval', async () => {
  const { warm, seen } = fakeWarmUp(['K-1'], { retryMs: 10, passEveryMs: 300 })
  const pass = async () => {
    warm.start()
    await warm.idle()
    return seen.pages
  }
  const firstAt = performance.now()
  // Each pass reads two pages (the key, then an empty page).
  expect(await pass()).toBe(2)
  expect(await pass()).toBe(4)
  expect(await pass()).toBe(4)
  // Asked again meanwhile: still one pass, when its turn comes.
  await Bun.sleep(100)
  expect(await pass()).toBe(4)
  expect(await until(async () => seen.pages, (n) => n > 4, 2_000)).toBe(6)
  // Its turn: one interval after the first pass (the burst let the second go at once).
  expect(performance.now() - firstAt).toBeGreaterThanOrEqual(290)
  await Bun.sleep(100)
  expect(seen.pages).toBe(6)
  await warm.stop()
})

test('stop() ends a pass after its current page', async () => {
  const { warm, seen } = fakeWarmUp(keysOf(5_000))
  let stopping: Promise<void> | null = null
  seen.afterPage = () => {
    stopping ??= warm.stop()
  }
  warm.start()
  await warm.idle()
  await stopping
  expect(seen.pages).toBe(1)
  warm.start()
  await warm.idle()
  expect(seen.pages).toBe(1)
})

test('the warm-up caches licenses of more apps than the app bound: their entries need no actor', async () => {
  const seeded = await Promise.all(
    Array.from({ length: 12 }, async () => {
      const { appId } = await t.seed()
      return { appId, keys: [await insertLicense(t.ctx, appId), await insertLicense(t.ctx, appId)] }
    }),
  )
  const actors = new AppActors({ ...t.ctx }, { ...ACTOR_LIMITS, apps: 10 })
  await actors.startWarmUp().idle()
  for (const { appId, keys } of seeded) for (const key of keys) expect(actors.cachedLicense(appId, key)?.value?.key).toBe(key)
  expect(seeded.filter(({ appId }) => actors.existing(appId)).length).toBe(0)
})

test('a generation the warm-up reads mid-pass is adopted at once: the pass starts over once, not again at its first entry', async () => {
  const { store } = await sharedInfra()
  const countPages = (bumpFrom: number) => {
    const seen = { snapshots: 0, onThird: undefined as undefined | (() => void) }
    const watched = withOverrides(store, {
      snapshot: async (epochKeys) => {
        const read = await store.snapshot(epochKeys)
        // From the bumpFrom-th call on, as if the store had lost its data in between.
        if (++seen.snapshots === 3) seen.onThird?.()
        return seen.snapshots >= bumpFrom ? { ...read, generation: read.generation + 1 } : read
      },
    })
    return { actors: new AppActors({ ...t.ctx, store: watched }), seen }
  }
  // More than one page of licenses, so the change lands mid-pass.
  const s = await t.seed()
  await t.ctx.database.db.insert(licenses).values(Array.from({ length: 1_500 }, () => ({ key: generateLicenseKey(), appId: s.appId })))
  const plain = countPages(Number.POSITIVE_INFINITY)
  await plain.actors.startWarmUp().idle()
  const pages = plain.seen.snapshots
  expect(pages).toBeGreaterThan(1)
  const bumped = countPages(2)
  // A request's late new_generation answer for the generation the warm-up adopted lands during its second pass.
  bumped.seen.onThird = () => bumped.actors.startOver(bumped.actors.generation)
  await bumped.actors.startWarmUp().idle()
  // Page 1, then page 2 under the new generation (cut short), then every page once more.
  expect(bumped.seen.snapshots).toBe(2 + pages)
  expect(bumped.actors.cachedBytes).toBe(plain.actors.cachedBytes)
})

test('a late new_generation answer for the generation already adopted empties nothing', async () => {
  await insertLicense(t.ctx, (await t.seed()).appId)
  const actors = new AppActors({ ...t.ctx })
  await actors.startWarmUp().idle()
  const bytes = actors.cachedBytes
  expect(bytes).toBeGreaterThan(0)
  actors.startOver(actors.generation)
  expect(actors.cachedBytes).toBe(bytes)
})
