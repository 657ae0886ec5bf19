import { describe, expect, test } from 'bun:test'
import { inArray } from 'drizzle-orm'
import { openDb } from '../../../src/db/client'
import { events } from '../../../src/db/schema'
import { claimDue, fanOut } from '../../../src/delivery/dispatch/claim'
import { recordAttempts } from '../../../src/delivery/attempts'
import { sharedInfra, TEST_DATABASE_URL } from '../../support/helpers'
import { drainOutbox, outboxApp, pairs, pastThisMillisecond } from './outbox-rows'

await sharedInfra()

describe('fan-out', () => {
  test('marks events dispatched and owes one delivery per enabled, subscribed webhook, claimed already', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const subscribed = await o.hook(['license.created', 'license.revoked'])
    await o.hook(['license.created'], false)
    await o.hook(['license.deleted'])
    const ids = await o.emit('license.created', 2)

    const fanned = await fanOut(o.db, 10)
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
    expect((await fanOut(o.db, 10)).events).toBe(0)
  })

  test('deliveries beyond the limit are written unclaimed, and the claim statement takes them', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = [await o.hook(['license.revoked']), await o.hook(['license.revoked']), await o.hook(['license.revoked'])]
    const [id] = await o.emit('license.revoked')

    const fanned = await fanOut(o.db, 1)
    expect(fanned).toMatchObject({ events: 1, unclaimed: 2 })
    expect(fanned.claimed).toHaveLength(1)
    const rest = await claimDue(o.db, 10, 120)
    expect(pairs([...fanned.claimed, ...rest])).toEqual(pairs(hooks.map((webhookId) => ({ eventId: id as number, webhookId }))))
    // All claimed and within the lease: nothing is due.
    expect(await claimDue(o.db, 10, 120)).toEqual([])
  })
})

describe('claim', () => {
  test('two instances claiming at once never get the same delivery', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = await Promise.all(Array.from({ length: 8 }, () => o.hook(['license.hwid_reset'])))
    const ids = await o.emit('license.hwid_reset', 3)
    // Every delivery owed, and only the first three (the limit) claimed by the fan-out.
    const fanned = await fanOut(o.db, 3)
    expect(fanned).toMatchObject({ events: 3, unclaimed: ids.length * hooks.length - 3 })

    // On PostgreSQL a second connection pool, as another instance would have; PGlite has one connection.
    const other = TEST_DATABASE_URL ? await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null }) : null
    try {
      const [mine, theirs] = await Promise.all([claimDue(o.db, 12, 120), claimDue(other?.db ?? o.db, 12, 120)])
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
    const fanned = await fanOut(o.db, 5)
    expect(fanned.claimed).toHaveLength(1)
    await pastThisMillisecond()

    expect(await claimDue(o.db, 5, 120)).toEqual([])
    const takenOver = await claimDue(o.db, 5, 0)
    expect(pairs(takenOver)).toEqual([`${id} ${hook}`])

    await recordAttempts(o.db, [{ eventId: id, webhookId: hook, at: new Date(), status: 200 }])
    await pastThisMillisecond()
    expect(await claimDue(o.db, 5, 0)).toEqual([])
    const [row] = await o.deliveriesOf([id as number])
    expect(row?.httpStatus).toBe(200)
  })
})
