import { expect, test } from 'bun:test'
import { and, eq } from 'drizzle-orm'
import postgres from 'postgres'
import { apps, events, licenses } from '../../src/db/schema'
import { hwid, insertLicense, licenseEpochKey, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'

const t = await makeTestApp()

function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => (open = resolve))
  return { open, opened }
}

test("one app's changes run one at a time, in the order they were asked", async () => {
  const s = await t.seed()
  const actor = t.ctx.actors.of(s.appId)
  const log: string[] = []
  const held = gate()
  const change = (name: string, wait?: Promise<void>) =>
    actor.write(
      async () => {
        log.push(`start ${name}`)
        await wait
        log.push(`end ${name}`)
        return name
      },
      () => ({}),
    )
  const all = Promise.all([change('first', held.opened), change('second'), change('third')])
  await Bun.sleep(20)
  expect(log).toEqual(['start first'])
  held.open()
  expect(await all).toEqual(['first', 'second', 'third'])
  expect(log).toEqual(['start first', 'end first', 'start second', 'end second', 'start third', 'end third'])
  expect(t.ctx.actors.of(s.appId)).toBe(actor)
})

test("one app's mailbox held does not hold another app's changes", async () => {
  const [a, b] = await Promise.all([t.seed(), t.seed()])
  const held = gate()
  // Held outside a transaction: embedded PGlite has one connection, which a held transaction would hold too.
  const slow = t.ctx.actors.of(a.appId).mailbox.run(() => held.opened)
  const other = await t.ctx.actors.of(b.appId).write(async () => 'done while a waits', () => ({}))
  expect(other).toBe('done while a waits')
  expect(t.ctx.actors.of(a.appId).idle).toBe(false)
  held.open()
  await slow
})

test("a list write drops the actor's copy: the next check sees it after exactly one reload", async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  const device = hwid()
  const validate = () =>
    t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: device, nonce: nonce() },
    })
  expect((await validate()).status).toBe(200)
  expect(t.ctx.actors.cachedApp(s.appId)?.value?.hwidBlacklist.has(device)).toBe(false)

  const added = await t.req('POST', `/v1/apps/${s.appId}/security/blacklist`, {
    apiKey: s.apiKey,
    body: { type: 'hwid', value: device },
  })
  expect(added.status).toBe(200)
  expect(t.ctx.actors.cachedApp(s.appId)).toBeUndefined()

  const before = { ...t.ctx.actors.loads }
  const blocked = await validate()
  expect(blocked.body.error).toBe('blocked')
  expect(t.ctx.actors.loads.apps - before.apps).toBe(1)
  expect(t.ctx.actors.cachedApp(s.appId)?.value?.hwidBlacklist.has(device)).toBe(true)
})

test('a license change drops that license from its actor and moves its epoch', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  await t.ctx.actors.ensureLicense(s.appId, licenseKey)
  expect(t.ctx.actors.cachedLicense(s.appId, licenseKey)?.value?.status).toBe('active')
  const [epoch] = await t.ctx.store.epochs([await licenseEpochKey(t.ctx, s.appId, licenseKey)])

  const put = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
  expect(put.status).toBe(200)
  expect(t.ctx.actors.cachedLicense(s.appId, licenseKey)).toBeUndefined()
  expect((await t.ctx.store.epochs([await licenseEpochKey(t.ctx, s.appId, licenseKey)]))[0]).toBeGreaterThan(epoch ?? 0)
  await t.ctx.actors.ensureLicense(s.appId, licenseKey)
  expect(t.ctx.actors.cachedLicense(s.appId, licenseKey)?.value?.status).toBe('revoked')
})

test('selfban revokes and lists in one go, and drops what it changed', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  await t.ctx.actors.ensureApp(s.appId)
  await t.ctx.actors.ensureLicense(s.appId, licenseKey)
  const want = { revokeLicense: true, blacklistHwid: true, blacklistIp: true, hwid: hwid(), ip: '198.51.100.4', sessionHwid: false }
  expect(await t.ctx.actors.selfban(s.appId, licenseKey, want)).toEqual({
    revokeLicense: true,
    blacklistHwid: true,
    blacklistIp: true,
  })
  expect(t.ctx.actors.cachedApp(s.appId)).toBeUndefined()
  expect(t.ctx.actors.cachedLicense(s.appId, licenseKey)).toBeUndefined()
  const [app] = await t.ctx.database.db.select().from(apps).where(eq(apps.id, s.appId))
  expect(app?.hwidBlacklist).toEqual([want.hwid])
  expect(app?.ipBlacklist).toEqual([want.ip])
  const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
  expect(row?.status).toBe('revoked')
  // Its event is the one a revoke through the API records, with the reason beside it.
  const revoked = await t.ctx.database.db.select({ data: events.data }).from(events).where(and(eq(events.appId, s.appId), eq(events.event, 'license.revoked')))
  expect(revoked.map((e) => e.data)).toEqual([{ licenseKey, appId: s.appId, status: 'revoked', reason: 'selfban' }])
  // Done already: a second selfban changes nothing and says so.
  expect(await t.ctx.actors.selfban(s.appId, licenseKey, want)).toEqual({
    revokeLicense: false,
    blacklistHwid: false,
    blacklistIp: false,
  })
})

test("a session's selfban whose HWID no longer holds a seat (released on another instance meanwhile) changes nothing", async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['someone-else'] })
  const want = { revokeLicense: true, blacklistHwid: true, blacklistIp: true, hwid: hwid(), ip: '198.51.100.6', sessionHwid: true }
  await expect(t.ctx.actors.selfban(s.appId, licenseKey, want)).rejects.toThrow('session_expired')
  const [app] = await t.ctx.database.db.select().from(apps).where(eq(apps.id, s.appId))
  expect(app?.hwidBlacklist).toEqual([])
  expect(app?.ipBlacklist).toEqual([])
  const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
  expect(row?.status).toBe('active')
})

// Another process's offline mint of the same license, in the mint's lock order (the app row FOR SHARE,
// then the license FOR UPDATE), held open around this process's selfban: PostgreSQL can only order
// the two if both take the rows in that order, else it aborts one of them as a deadlock.
test.skipIf(MODE !== 'postgres')('a selfban and another process\'s offline mint of one license queue, never deadlock', async () => {
  const s = await t.seed()
  const h = hwid()
  const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: [h] })
  // A session's: the seat check locks the license too.
  const want = { revokeLicense: true, blacklistHwid: true, blacklistIp: true, hwid: h, ip: '198.51.100.5', sessionHwid: true }
  const minting = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
  try {
    let selfban!: Promise<unknown>
    await minting.begin(async (sql) => {
      await sql`SELECT id FROM apps WHERE id = ${s.appId} FOR SHARE`
      selfban = t.ctx.actors.selfban(s.appId, licenseKey, want)
      // Long enough for the selfban to take whatever lock it takes first and wait on the next.
      await Bun.sleep(300)
      await sql`SELECT key FROM licenses WHERE key = ${licenseKey} FOR UPDATE`
    })
    expect(await selfban).toEqual({ revokeLicense: true, blacklistHwid: true, blacklistIp: true })
  } finally {
    await minting.end()
  }
})

test("a new store generation empties every actor's state; entries read under an older one are refused", async () => {
  const { ctx } = await makeTestApp()
  const s = await t.seed()
  const licenseKey = await insertLicense(ctx, s.appId)
  await ctx.actors.ensureApp(s.appId)
  await ctx.actors.ensureLicense(s.appId, licenseKey)
  const generation = ctx.actors.generation
  expect(ctx.actors.cachedApp(s.appId)?.value?.id).toBe(s.appId)

  ctx.actors.startOver(generation + 1)
  expect(ctx.actors.generation).toBe(generation + 1)
  expect(ctx.actors.cachedApp(s.appId)).toBeUndefined()
  expect(ctx.actors.cachedLicense(s.appId, licenseKey)).toBeUndefined()

  await ctx.actors.reloadApp(s.appId, 0, generation)
  await ctx.actors.reloadLicense(s.appId, licenseKey, 0, generation)
  expect(ctx.actors.cachedApp(s.appId)).toBeUndefined()
  expect(ctx.actors.cachedLicense(s.appId, licenseKey)).toBeUndefined()

  await ctx.actors.reloadApp(s.appId, 3, generation + 1)
  expect(ctx.actors.cachedApp(s.appId)?.epoch).toBe(3)
  // A read under a newer generation than the registry's starts it over first.
  await ctx.actors.reloadLicense(s.appId, licenseKey, 5, generation + 2)
  expect(ctx.actors.generation).toBe(generation + 2)
  expect(ctx.actors.cachedApp(s.appId)).toBeUndefined()
  expect(ctx.actors.cachedLicense(s.appId, licenseKey)?.epoch).toBe(5)
  // An older generation than the current one never empties anything.
  ctx.actors.startOver(generation)
  expect(ctx.actors.generation).toBe(generation + 2)
  expect(ctx.actors.cachedLicense(s.appId, licenseKey)?.epoch).toBe(5)
})
