/**
 * License misses of one turn are served together (actors/license-loads.ts): one store call, one
 * PostgreSQL query, each miss answered on its own; and the rule that makes caching safe still holds
 * across instances.
 */
import { expect, test } from 'bun:test'
import { LicenseLoads, NEXT_BATCH_AFTER_MS } from '../../src/actors/license-loads'
import type { CachedLicense } from '../../src/actors/load'
import { AppActors } from '../../src/actors/registry'
import { type EpochRead, shardOfKey, type Store } from '../../src/store/store'
import { generateLicenseKey } from '../../src/lib/crypto'
import { hwid, insertLicense, nonce } from '../support/client'
import { openDb } from '../../src/db/client'
import { makeTestApp, MODE, sharedInfra, TEST_DATABASE_URL } from '../support/helpers'
import { withOverrides } from '../support/overrides'

const t = await makeTestApp()

/** The shared store with `snapshotEach` and `authorize` calls counted, and a hook run after each snapshot and before each authorize. */
async function watchedStore() {
  const { store } = await sharedInfra()
  const seen = { snapshots: 0, afterSnapshot: null as null | (() => Promise<void>), beforeAuthorize: null as null | (() => Promise<void>) }
  const watched = withOverrides(store, {
    snapshotEach: async (reads) => {
      seen.snapshots++
      const read = await store.snapshotEach(reads)
      const hook = seen.afterSnapshot
      seen.afterSnapshot = null
      await hook?.()
      return read
    },
    authorize: async (input) => {
      const hook = seen.beforeAuthorize
      seen.beforeAuthorize = null
      await hook?.()
      return store.authorize(input)
    },
  })
  return { store: watched, seen }
}

test('the misses of one turn take one store call and one query, and one bad, limited or absent member fails none of the others', async () => {
  const { store, seen } = await watchedStore()
  const actors = new AppActors({ ...t.ctx, store })
  const s = await t.seed()
  const [real1, real2, guarded] = (await Promise.all([1, 2, 3].map(() => insertLicense(t.ctx, s.appId)))) as [string, string, string]
  const absent = generateLicenseKey()
  // A key PostgreSQL refuses as text: the batch's one query fails, and each key is then read alone.
  const bad = 'BAD\u0000KEY'
  const bucket = { key: `ls:rl:test:${crypto.randomUUID()}`, capacity: 1, refillPerSecond: 0.001 }
  const nowMs = Date.now()
  // Its one token goes first, so the guarded miss below finds the bucket empty.
  await store.snapshotEach([{ key: 'ls:test:any', admission: { ...bucket, nowMs } }])
  seen.snapshots = 0
  const results = await Promise.allSettled([
    actors.ensureLicense(s.appId, real1),
    actors.ensureLicense(s.appId, absent),
    actors.ensureLicense(s.appId, guarded, { ...bucket, nowMs }),
    actors.ensureLicense(s.appId, bad),
    actors.ensureLicense(s.appId, real2),
  ])
  expect(seen.snapshots).toBe(1)
  expect(results.map((r) => (r.status === 'fulfilled' ? r.value.kind : 'failed'))).toEqual(['ok', 'ok', 'limited', 'failed', 'ok'])
  expect(actors.cachedLicense(s.appId, real1)?.value?.key).toBe(real1)
  expect(actors.cachedLicense(s.appId, real2)?.value?.key).toBe(real2)
  expect(actors.cachedLicense(s.appId, absent)?.value).toBeNull()
  // The limited member loaded nothing.
  expect(actors.cachedLicense(s.appId, guarded)).toBeUndefined()
  expect(actors.cachedLicense(s.appId, bad)).toBeUndefined()
})

test('concurrent misses of one key share one store call and one row read', async () => {
  const { store, seen } = await watchedStore()
  const actors = new AppActors({ ...t.ctx, store })
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId)
  const before = actors.loads.licenses
  const reads = await Promise.all(Array.from({ length: 5 }, () => actors.ensureLicense(s.appId, key)))
  expect(reads.every((r) => r.kind === 'ok')).toBe(true)
  expect(seen.snapshots).toBe(1)
  expect(actors.loads.licenses - before).toBe(1)
})

test('a store that cannot be reached fails the batch as unavailable, and the next batch is served', async () => {
  const { store } = await sharedInfra()
  let down = true
  const flaky = withOverrides(store, {
    snapshotEach: (reads) => (down ? Promise.reject(new Error('connection lost')) : store.snapshotEach(reads)),
  })
  const actors = new AppActors({ ...t.ctx, store: flaky })
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId)
  await expect(actors.ensureLicense(s.appId, key)).rejects.toThrow('store unavailable')
  down = false
  expect(await actors.ensureLicense(s.appId, key)).toMatchObject({ kind: 'ok' })
  expect(actors.cachedLicense(s.appId, key)?.value?.key).toBe(key)
})

test('on a cluster a shard whose node fails fails its own misses alone', async () => {
  const kept: string[] = []
  const calls: string[][] = []
  const loads = new LicenseLoads({
    store: {
      snapshotEach: async (reads: readonly EpochRead[]) => {
        calls.push(reads.map((r) => shardOfKey(r.key)))
        if (reads.some((r) => shardOfKey(r.key) === '{s1}')) throw new Error('the node of {s1} is down')
        return { generation: 1, reads: reads.map(() => ({ kind: 'ok' as const, epoch: 0 })) }
      },
    } as unknown as Store,
    load: async (keys) => new Map(keys.map((key) => [key, { key } as CachedLicense])),
    loadOne: async (key) => ({ key }) as CachedLicense,
    keep: (_appId, licenseKey) => kept.push(licenseKey),
  })
  const results = await Promise.allSettled([
    loads.ensure('app-a', '{s0}', 'KEY-A'),
    loads.ensure('app-b', '{s1}', 'KEY-B'),
    loads.ensure('app-c', '{s2}', 'KEY-C'),
    loads.ensure('app-a', '{s0}', 'KEY-D'),
  ])
  expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled'])
  expect(String((results[1] as PromiseRejectedResult).reason)).toContain('store unavailable')
  expect(kept.sort()).toEqual(['KEY-A', 'KEY-C', 'KEY-D'])
  // One call per shard, as on a cluster snapshotEach would send anyway.
  expect(calls.sort()).toEqual([['{s0}', '{s0}'], ['{s1}'], ['{s2}']])
})

// Two instances on one database and one store, as two server processes are: B revokes, A must never
// answer from the row it read before, wherever the revoke falls in A's batched miss.
for (const when of ['between the epoch read and the row read', 'between the row read and its use'] as const) {
  test(`a revoke by another instance ${when} is never served stale`, async () => {
    const { store, seen } = await watchedStore()
    const a = await makeTestApp({ store })
    const b = await makeTestApp()
    const s = await b.seed()
    const h = hwid()
    const licenseKey = await insertLicense(b.ctx, s.appId, { hwids: [h] })
    const validate = () => a.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
    // The app is cached first, so the next miss is the license's alone.
    await a.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: generateLicenseKey(), hwid: h, nonce: nonce() } })
    const revoke = async () => {
      const put = await b.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
      expect(put.status).toBe(200)
    }
    if (when === 'between the epoch read and the row read') seen.afterSnapshot = revoke
    else seen.beforeAuthorize = revoke
    const reply = await validate()
    expect(seen.afterSnapshot ?? seen.beforeAuthorize).toBeNull()
    expect(reply.body.error).toBe('revoked')
    expect((await validate()).body.error).toBe('revoked')
  })
}

test('a batch whose query is held up lets the next batch go after a while, and answers its own misses when it ends', async () => {
  const { store } = await sharedInfra()
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId)
  let queries = 0
  let release = () => {}
  const loads = new LicenseLoads(
    {
      store,
      // The first query is held up (a connection gone silent, a pool full of long writes) until released.
      load: async (keys) => {
        if (++queries === 1) await new Promise<void>((resolve) => (release = resolve))
        return new Map(keys.map((k) => [k, { key: k } as unknown as CachedLicense]))
      },
      loadOne: async () => null,
      keep: () => {},
    },
    100,
  )
  const shard = shardOfKey('')
  const started = performance.now()
  let heldAnswered = false
  const held = loads.ensure(s.appId, shard, generateLicenseKey()).then((read) => {
    heldAnswered = true
    return read
  })
  await Bun.sleep(10)
  expect(await loads.ensure(s.appId, shard, key)).toMatchObject({ kind: 'ok' })
  expect(performance.now() - started).toBeLessThan(1_000)
  expect(heldAnswered).toBe(false)
  release()
  expect(await held).toMatchObject({ kind: 'ok' })
})

test("a miss waits for the writes that hold every connection (PGlite's one, a full pool), however long, rather than fail", async () => {
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId)
  // PostgreSQL: a pool of one connection, which the write below holds.
  const database = MODE === 'postgres' ? await openDb({ databaseUrl: TEST_DATABASE_URL!, dataDir: null, poolSize: 1 }) : t.ctx.database
  const actors = new AppActors({ ...t.ctx, database })
  try {
    let release = () => {}
    let began!: () => void
    const held = new Promise<void>((resolve) => (began = resolve))
    const holding = database.db.transaction(
      () =>
        new Promise<void>((resolve) => {
          release = resolve
          began()
        }),
    )
    // The connection is taken once the transaction's body runs: a fixed wait could start the miss first.
    await held
    const miss = actors.ensureLicense(s.appId, key)
    setTimeout(() => release(), NEXT_BATCH_AFTER_MS + 500)
    expect(await miss).toMatchObject({ kind: 'ok' })
    await holding
    expect(actors.cachedLicense(s.appId, key)?.value?.key).toBe(key)
  } finally {
    if (database !== t.ctx.database) await database.close()
  }
}, 10_000)
