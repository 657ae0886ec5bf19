import { describe, expect, test } from 'bun:test'
import { inArray } from 'drizzle-orm'
import { openDb } from '../../../src/db/client'
import { events } from '../../../src/db/schema'
import { claimDue, fanOut } from '../../../src/delivery/dispatch/claim'
import { recordAttempts } from '../../../src/delivery/attempts'
import { sharedInfra, TEST_DATABASE_URL } from '../../support/helpers'
import { drainOutbox, OPEN, outboxApp, pairs, pastThisMillisecond } from './outbox-rows'

await sharedInfra()

describe('fan-out', () => {
  test('marks events dispatched and owes one delivery per enabled, subscribed webhook, claimed already', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const subscribed = await o.hook(['license.created', 'license.revoked'])
    await o.hook(['license.created'], false)
    await o.hook(['license.deleted'])
    const ids = await o.emit('license.created', 2)

    const fanned = await fanOut(o.db, 10, OPEN)
    expect(fanned.events).toBe(2)
    expect(fanned.unclaimed).toBe(0)
    expect(pairs(fanned.claimed)).toEqual(pairs(ids.map((eventId) => ({ eventId, webhookId: subscribed }))))
    const first = fanned.claimed.find((c) => c.eventId === ids[0])
    expect(first).toMatchObject({ event: 'license.created', url: `https://receiver.invalid/${subscribed}`, secretEnc: 'sealed', enabled: true })
    expect(first?.occurredAt.toISOString()).toBe('2026-01-01T00:00:00.000Z')
    expect(JSON.parse(first?.data ?? '')).toEqual({ licenseKey: 'KEY-0', appId: o.s.appId })

    const rows = await o.deliveriesOf(ids)
    expect(pairs(rows)).toEqual(pairs(fanned.claimed))
    expect(rows.every((r) => r.claimedAt !== null && r.attemptedAt === null)).toBe(true)
    const marked = await o.db.select().from(events).where(inArray(events.id, ids))
    expect(marked.every((e) => e.dispatchedAt !== null)).toBe(true)
    // Dispatched events are not fanned out again.
    expect((await fanOut(o.db, 10, OPEN)).events).toBe(0)
  })

  test('deliveries beyond the limit are written unclaimed, and the claim statement takes them', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = [await o.hook(['license.revoked']), await o.hook(['license.revoked']), await o.hook(['license.revoked'])]
    const [id] = await o.emit('license.revoked')

    const fanned = await fanOut(o.db, 1, OPEN)
    expect(fanned).toMatchObject({ events: 1, unclaimed: 2 })
    expect(fanned.claimed).toHaveLength(1)
    const rest = await claimDue(o.db, 10, 120, OPEN)
    expect(pairs([...fanned.claimed, ...rest])).toEqual(pairs(hooks.map((webhookId) => ({ eventId: id as number, webhookId }))))
    // All claimed and within the lease: nothing is due.
    expect(await claimDue(o.db, 10, 120, OPEN)).toEqual([])
  })
})

describe('claim', () => {
  test('two instances claiming at once never get the same delivery', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = await Promise.all(Array.from({ length: 8 }, () => o.hook(['license.hwid_reset'])))
    const ids = await o.emit('license.hwid_reset', 3)
    // Every delivery owed, and only the first three (the limit) claimed by the fan-out.
    const fanned = await fanOut(o.db, 3, OPEN)
    expect(fanned).toMatchObject({ events: 3, unclaimed: ids.length * hooks.length - 3 })

    // On PostgreSQL a second connection pool, as another instance would have; PGlite has one connection.
    const other = TEST_DATABASE_URL ? await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null }) : null
    try {
      const [mine, theirs] = await Promise.all([claimDue(o.db, 12, 120, OPEN), claimDue(other?.db ?? o.db, 12, 120, OPEN)])
      const all = pairs([...fanned.claimed, ...mine, ...theirs])
      expect(new Set(all).size).toBe(all.length)
      expect(all).toEqual(pairs(ids.flatMap((eventId) => hooks.map((webhookId) => ({ eventId, webhookId })))))
    } finally {
      await other?.close()
    }
  })

  test('a claim older than the lease is taken over; an attempted delivery never is', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hook = await o.hook(['license.activated'])
    const [id] = await o.emit('license.activated')
    const fanned = await fanOut(o.db, 5, OPEN)
    expect(fanned.claimed).toHaveLength(1)
    await pastThisMillisecond()

    expect(await claimDue(o.db, 5, 120, OPEN)).toEqual([])
    const takenOver = await claimDue(o.db, 5, 0, OPEN)
    expect(pairs(takenOver)).toEqual([`${id} ${hook}`])

    await recordAttempts(o.db, [{ eventId: id, webhookId: hook, at: new Date(), status: 200 }])
    await pastThisMillisecond()
    expect(await claimDue(o.db, 5, 0, OPEN)).toEqual([])
    const [row] = await o.deliveriesOf([id as number])
    expect(row?.httpStatus).toBe(200)
  })
})

describe('fairness between accounts', () => {
  /** One account with ten deliveries owed, then another with two: the first's are the older. */
  async function twoAccounts() {
    const busy = await outboxApp()
    const quiet = await outboxApp()
    await drainOutbox(busy.db)
    const busyHook = await busy.hook(['license.revoked'])
    const quietHook = await quiet.hook(['license.revoked'])
    const busyIds = await busy.emit('license.revoked', 10)
    const quietIds = await quiet.emit('license.revoked', 2)
    const owed = (ids: number[], webhookId: string) => ids.map((eventId) => ({ eventId, webhookId }))
    return { busy, quiet, db: busy.db, busyOwed: owed(busyIds, busyHook), quietOwed: owed(quietIds, quietHook) }
  }

  test('a fan-out claims at most perAccount of one account\'s deliveries and none of a saturated account\'s', async () => {
    const { busy, db, busyOwed, quietOwed } = await twoAccounts()
    const fanned = await fanOut(db, 100, { saturated: [], perAccount: 3 })
    expect(pairs(fanned.claimed)).toEqual(pairs([...busyOwed.slice(0, 3), ...quietOwed]))
    expect(fanned.unclaimed).toBe(7)
    // Saturated, the busy account is left out of the claim below too.
    expect(await claimDue(db, 100, 120, { saturated: [busy.s.accountId], perAccount: 3 })).toEqual([])
    expect(pairs(await claimDue(db, 100, 120, { saturated: [], perAccount: 3 }))).toEqual(pairs(busyOwed.slice(3, 6)))
  })

  test('a claim takes another account\'s deliveries beside the oldest account\'s first few, and none of a saturated account\'s', async () => {
    const { busy, quiet, db, busyOwed, quietOwed } = await twoAccounts()
    // Fanned out with both saturated: every delivery written unclaimed.
    const fanned = await fanOut(db, 100, { saturated: [busy.s.accountId, quiet.s.accountId], perAccount: 3 })
    expect([fanned.claimed, fanned.unclaimed]).toEqual([[], 12])
    expect(await claimDue(db, 5, 120, { saturated: [busy.s.accountId, quiet.s.accountId], perAccount: 3 })).toEqual([])
    expect(pairs(await claimDue(db, 5, 120, { saturated: [], perAccount: 3 }))).toEqual(pairs([...busyOwed.slice(0, 3), ...quietOwed]))
    expect(pairs(await claimDue(db, 5, 120, { saturated: [], perAccount: 3 }))).toEqual(pairs(busyOwed.slice(3, 6)))
  })
})
