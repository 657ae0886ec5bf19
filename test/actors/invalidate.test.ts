import { randomUUID } from 'node:crypto'
import { expect, test } from 'bun:test'
import { eq, sql } from 'drizzle-orm'
import { Invalidator, SWEEP_AFTER_SECONDS } from '../../src/actors/invalidate'
import { cacheInvalidations } from '../../src/db/schema'
import type { Store } from '../../src/store/store'
import { makeTestApp, type TestApp } from '../support/helpers'
import { decode, hwid, insertLicense, licenseEpochKey, validateOn } from '../support/client'
import { withOverrides } from '../support/overrides'

/** An instance of its own on the shared database and store, whose bumps fail while `down` is set. */
async function instanceCutOffFromStore(shared: Store) {
  const cut = { down: true }
  const bump = (epochKeys: readonly string[]) => (cut.down ? Promise.reject(new Error('store unreachable')) : shared.bump(epochKeys))
  return { cut, app: await makeTestApp({ store: withOverrides(shared, { bump }) }) }
}

const notedFor = (t: TestApp, appId: string) =>
  t.ctx.database.db.select().from(cacheInvalidations).where(eq(cacheInvalidations.appId, appId))

/** Dates the app's recorded invalidations `secondsAgo`, so the test depends neither on sleeps nor on its own pace. */
const notedAgo = (t: TestApp, appId: string, secondsAgo: number) =>
  t.ctx.database.db
    .update(cacheInvalidations)
    .set({ notedAt: sql`now() - make_interval(secs => ${secondsAgo})` })
    .where(eq(cacheInvalidations.appId, appId))
/** Ages the app's recorded invalidations past the sweep's wait, so the test need not sleep through it. */
const age = (t: TestApp, appId: string) => notedAgo(t, appId, SWEEP_AFTER_SECONDS + 1)

test('a revoke made by an instance that cannot reach the store reaches another instance through its sweep', async () => {
  const other = await makeTestApp()
  const { app: cutOff } = await instanceCutOffFromStore(other.ctx.store)
  const s = await other.seed()
  const licenseKey = await insertLicense(other.ctx, s.appId)
  const device = hwid()
  expect((await validateOn(other, s, licenseKey, device)).res.status).toBe(200)

  const revoked = await cutOff.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
  expect(revoked.status, JSON.stringify(revoked.body)).toBe(200)
  // The other instance's copy still looks fresh: the epoch that would say otherwise was never bumped.
  expect((await validateOn(other, s, licenseKey, device)).res.status).toBe(200)
  expect((await notedFor(other, s.appId)).map((row) => row.licenseKeys)).toEqual([[licenseKey]])

  // Too recent: the instance that made the change may still be bumping it. (Noted again now: on a busy
  // machine the steps above can take longer than the sweep's wait.)
  await notedAgo(other, s.appId, 0)
  expect(await other.ctx.actors.invalidator.sweep()).toBe(0)
  await age(other, s.appId)
  expect(await other.ctx.actors.invalidator.sweep()).toBeGreaterThanOrEqual(1)
  expect((await validateOn(other, s, licenseKey, device)).res.body).toEqual({ status: 'failed', error: 'revoked' })
  expect(await notedFor(other, s.appId)).toEqual([])
})

test('an app change and a seat binding are recorded in their own transactions, and swept when their instance is gone', async () => {
  const other = await makeTestApp()
  const { app: cutOff } = await instanceCutOffFromStore(other.ctx.store)
  const s = await other.seed()
  const licenseKey = await insertLicense(other.ctx, s.appId, { maxHwidSlots: 2 })
  const epochKey = await licenseEpochKey(other.ctx, s.appId, licenseKey)
  const first = await validateOn(other, s, licenseKey)
  expect(decode(first.res.body.payload).appVariables).toEqual({})
  // Its seat binding's record, bumped at once, is deleted in the background.
  await other.ctx.actors.invalidator.settled()
  const [before] = await other.ctx.store.epochs([epochKey])

  const put = await cutOff.req('PUT', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey, body: { tier: 'pro' } })
  expect(put.status, JSON.stringify(put.body)).toBe(200)
  expect((await validateOn(cutOff, s, licenseKey)).res.status).toBe(200)
  const noted = await notedFor(other, s.appId)
  expect(noted.map(({ app, licenseKeys }) => ({ app, licenseKeys }))).toEqual([
    { app: true, licenseKeys: [] },
    { app: false, licenseKeys: [licenseKey] },
  ])
  // The instance that made both changes stops here, without ever reaching the store again.
  expect(decode((await validateOn(other, s, licenseKey, first.device)).res.body.payload).appVariables).toEqual({})

  await age(other, s.appId)
  await other.ctx.actors.invalidator.sweep()
  expect((await other.ctx.store.epochs([epochKey]))[0]).toBeGreaterThan(before ?? 0)
  expect(await notedFor(other, s.appId)).toEqual([])
  const fresh = await validateOn(other, s, licenseKey, first.device)
  expect(decode(fresh.res.body.payload)).toMatchObject({ appVariables: { tier: 'pro' }, hwidCount: 2 })
})

test('a change its own instance bumped leaves nothing to sweep', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  expect((await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })).status).toBe(200)
  const listed = await t.req('POST', `/v1/apps/${s.appId}/security/blacklist`, { apiKey: s.apiKey, body: { type: 'hwid', value: hwid() } })
  expect(listed.status, JSON.stringify(listed.body)).toBe(200)
  await t.ctx.actors.invalidator.settled()
  expect(await notedFor(t, s.appId)).toEqual([])
})

test('a sweep that cannot reach the store keeps what it read, for the next sweep', async () => {
  const other = await makeTestApp()
  const { app: cutOff, cut } = await instanceCutOffFromStore(other.ctx.store)
  const s = await other.seed()
  expect((await cutOff.req('PUT', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey, body: { a: 1 } })).status).toBe(200)
  await age(other, s.appId)
  await expect(cutOff.ctx.actors.invalidator.sweep()).rejects.toThrow('store unreachable')
  expect(await notedFor(other, s.appId)).toHaveLength(1)
  cut.down = false
  expect(await cutOff.ctx.actors.invalidator.sweep()).toBeGreaterThanOrEqual(1)
  expect(await notedFor(other, s.appId)).toEqual([])
})

test("a sweep bumps every shard it can reach: a dead shard's changes, however many, hold up no other shard's", async () => {
  const t = await makeTestApp()
  const [dead, alive] = [randomUUID(), randomUUID()]
  const shards = new Map<string, string>([[dead, '{s0}'], [alive, '{s1}']])
  const bumped: string[] = []
  const store = withOverrides(t.ctx.store, {
    bump: async (epochKeys: readonly string[]) => {
      if (epochKeys.some((key) => key.startsWith('ls:{s0}:'))) throw new Error('cluster master down')
      bumped.push(...epochKeys)
    },
  })
  // Other tests' apps are gone: no shard, as for an app that does not exist.
  const invalidator = new Invalidator(t.ctx.database, store, async (appId) => {
    const shard = shards.get(appId)
    return shard ? [shard] : []
  })
  // More changes of the dead shard than one page of the sweep, ahead of the live shard's.
  await t.ctx.database.db.insert(cacheInvalidations).values(Array.from({ length: 600 }, () => ({ appId: dead, app: true, licenseKeys: [] })))
  await t.ctx.database.db.insert(cacheInvalidations).values({ appId: alive, app: false, licenseKeys: ['AAAA-BBBB-CCCC-DDDD'] })
  for (const appId of [dead, alive]) await age(t, appId)

  await expect(invalidator.sweep()).rejects.toThrow('cluster master down')
  expect(bumped).toEqual(['ls:{s1}:ep:lic:AAAA-BBBB-CCCC-DDDD'])
  expect(await notedFor(t, alive)).toEqual([])
  expect(await notedFor(t, dead)).toHaveLength(600)
  await t.ctx.database.db.delete(cacheInvalidations).where(eq(cacheInvalidations.appId, dead))
})

test('sweeps slower than their interval do not pile up: a tick is skipped while one runs, and a stop waits for that one alone', async () => {
  const t = await makeTestApp()
  const invalidator = new Invalidator(t.ctx.database, t.ctx.store, async () => [])
  let sweeps = 0
  // Each sweep as slow as a PostgreSQL that answers late: seven times the interval.
  invalidator.sweep = async () => {
    sweeps++
    await Bun.sleep(350)
    return 0
  }
  const sweeper = invalidator.startSweeper(50)
  await Bun.sleep(1_000)
  const stopping = performance.now()
  await sweeper.stop()
  expect(performance.now() - stopping).toBeLessThan(500)
  expect(sweeps).toBeGreaterThanOrEqual(2)
  expect(sweeps).toBeLessThanOrEqual(4)
})

test('a stop waits for a sweep that PostgreSQL holds up only so long, then lets it go', async () => {
  const t = await makeTestApp()
  const invalidator = new Invalidator(t.ctx.database, t.ctx.store, async () => [])
  let started = false
  invalidator.sweep = () => {
    started = true
    return new Promise<number>(() => {})
  }
  const sweeper = invalidator.startSweeper(10, 200)
  while (!started) await Bun.sleep(10)
  const stopping = performance.now()
  await sweeper.stop()
  expect(performance.now() - stopping).toBeWithin(150, 1_000)
})
