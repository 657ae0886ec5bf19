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
import type { Store } from '../../src/store/store'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, sharedInfra, type TestApp } from '../support/helpers'
import { startServer } from '../support/server-process'
import { until } from '../support/servers'

const t = await makeTestApp()

const validate = (app: TestApp, s: { appId: string; appSecret: string }, licenseKey: string, h: string) =>
  app.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })

test('CACHE_WARM_UP is on unless set to false', () => {
  expect(loadConfig({}).cacheWarmUp).toBe(true)
  expect(loadConfig({ CACHE_WARM_UP: 'false' }).cacheWarmUp).toBe(false)
})

test('the server warms its cache at start', async () => {
  const server = await startServer({ DATABASE_URL: '', REDIS_URL: '' })
  try {
    expect(await until(async () => server.log().includes('"license cache warmed"'), (seen) => seen)).toBe(true)
  } finally {
    await server.stop()
  }
}, 60_000)

test('the warm-up caches the licenses, and a first validate of one reads nothing from PostgreSQL', async () => {
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
  const cacheBytes = 64 * 1024
  const actors = new AppActors({ ...t.ctx }, { ...ACTOR_LIMITS, cacheBytes })
  const warm = actors.startWarmUp()
  await warm.idle()
  const filled = actors.cachedBytes
  // Stopped at the fill, with at most one entry (about 1 KB) over it: under the bound, so the bound evicted nothing.
  expect(filled).toBeGreaterThanOrEqual(0.9 * cacheBytes)
  expect(filled).toBeLessThan(0.9 * cacheBytes + 2_000)
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
  const watched = new Proxy(store, {
    get(target, prop) {
      if (prop === 'snapshot') {
        return async (epochKeys: readonly string[]) => {
          await once(epochKeys, true)
          const read = await target.snapshot(epochKeys)
          await once(epochKeys, false)
          return read
        }
      }
      const value = Reflect.get(target, prop, target)
      return typeof value === 'function' ? value.bind(target) : value
    },
  }) as Store
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

test('a pass that failed (PostgreSQL unreachable at start) is tried again', async () => {
  let down = true
  const kept: string[] = []
  const license = { key: 'K-1', appId: 'app-1' } as CachedLicense
  const warm = new CacheWarmUp(
    {
      keyPage: async (after) => {
        if (down) throw new Error('connection refused')
        return after === '' ? [{ key: license.key, appId: license.appId }] : []
      },
      snapshot: async (epochKeys) => ({ generation: 1, epochs: epochKeys.map(() => 0) }),
      rows: async () => new Map([[license.key, license]]),
      shardOfApp: async () => '',
      keepIfMissing: (_, key) => kept.push(key) > 0,
      hasRoom: () => true,
      generation: () => 1,
    },
    10,
  )
  warm.start()
  await warm.idle()
  expect(kept).toEqual([])
  down = false
  expect(await until(async () => kept.length, (n) => n > 0, 2_000)).toBe(1)
  await warm.stop()
})
