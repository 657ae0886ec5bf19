import { describe, expect, test } from 'bun:test'
import { eq, inArray } from 'drizzle-orm'
import { openDb } from '../../../src/db/client'
import { events, webhooks } from '../../../src/db/schema'
import { type Claimed, Claims, claimDue, fanOut, type Room } from '../../../src/delivery/dispatch/claim'
import { recordAttempts } from '../../../src/delivery/attempts'
import { sharedInfra, TEST_DATABASE_URL } from '../../support/helpers'
import { drainOutbox, outboxApp, pairs, pastThisMillisecond, room } from './outbox-rows'

await sharedInfra()

describe('fan-out', () => {
  test('marks events dispatched and owes one delivery per enabled, subscribed webhook, claimed already', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const subscribed = await o.hook(['license.created', 'license.revoked'])
    await o.hook(['license.created'], false)
    await o.hook(['license.deleted'])
    const ids = await o.emit('license.created', 2)

    const fanned = await fanOut(o.db, 10, room(10))
    expect(fanned.events).toBe(2)
    expect(fanned.fairLeft).toBe(0)
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
    expect((await fanOut(o.db, 10, room(10))).events).toBe(0)
  })

  // Two connections at once: PGlite has one.
  test.skipIf(!TEST_DATABASE_URL)("a webhook deleted while the fan-out runs is left out of it; every other webhook's deliveries are written", async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const [deleted, kept] = [await o.hook(['license.created']), await o.hook(['license.created'])]
    const [id] = await o.emit('license.created')
    const other = await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null })
    try {
      // The delete (its cascade over the webhook's deliveries, say) is under way when the fan-out starts.
      let deleting!: () => void
      const held = new Promise<void>((resolve) => (deleting = resolve))
      let ran!: () => void
      const deleteRan = new Promise<void>((resolve) => (ran = resolve))
      const deletion = other.db.transaction(async (tx) => {
        await tx.delete(webhooks).where(eq(webhooks.id, deleted))
        ran()
        await held
      })
      // Not a fixed wait: on a slow, busy host the other connection's first statement took longer than
      // 50 ms, and the fan-out ran before the delete.
      await deleteRan
      const fanning = fanOut(o.db, 10, room(10))
      await Bun.sleep(100)
      deleting()
      await deletion
      const fanned = await fanning
      expect(pairs(fanned.claimed)).toEqual([`${id} ${kept}`])
    } finally {
      await other.close()
    }
  })

  test('deliveries beyond the limit are written unclaimed, and the claim statement takes them', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = [await o.hook(['license.revoked']), await o.hook(['license.revoked']), await o.hook(['license.revoked'])]
    const [id] = await o.emit('license.revoked')

    const fanned = await fanOut(o.db, 1, room(1))
    expect(fanned).toMatchObject({ events: 1, fairLeft: 2 })
    expect(fanned.claimed).toHaveLength(1)
    const rest = (await claimDue(o.db, room(10), 120)).claimed
    expect(pairs([...fanned.claimed, ...rest])).toEqual(pairs(hooks.map((webhookId) => ({ eventId: id as number, webhookId }))))
    // All claimed and within the lease: nothing is due.
    expect((await claimDue(o.db, room(10), 120)).claimed).toEqual([])
  })
})

describe('claim', () => {
  test('two instances claiming at once never get the same delivery', async () => {
    const o = await outboxApp()
    await drainOutbox(o.db)
    const hooks = await Promise.all(Array.from({ length: 8 }, () => o.hook(['license.hwid_reset'])))
    const ids = await o.emit('license.hwid_reset', 3)
    // Every delivery owed, and only the first three (the limit) claimed by the fan-out.
    const fanned = await fanOut(o.db, 3, room(3))
    expect(fanned).toMatchObject({ events: 3, fairLeft: ids.length * hooks.length - 3 })

    // On PostgreSQL a second connection pool, as another instance would have; PGlite has one connection.
    const other = TEST_DATABASE_URL ? await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null }) : null
    try {
      const [mine, theirs] = await Promise.all([claimDue(o.db, room(12), 120).then((t) => t.claimed), claimDue(other?.db ?? o.db, room(12), 120).then((t) => t.claimed)])
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
    const fanned = await fanOut(o.db, 5, room(5))
    expect(fanned.claimed).toHaveLength(1)
    await pastThisMillisecond()

    expect((await claimDue(o.db, room(5), 120)).claimed).toEqual([])
    const takenOver = (await claimDue(o.db, room(5), 0)).claimed
    expect(pairs(takenOver)).toEqual([`${id} ${hook}`])

    await recordAttempts(o.db, [{ eventId: id, webhookId: hook, at: new Date(), status: 200 }])
    await pastThisMillisecond()
    expect((await claimDue(o.db, room(5), 0)).claimed).toEqual([])
    const [row] = await o.deliveriesOf([id as number])
    expect(row?.httpStatus).toBe(200)
  })
})

describe("sharing the slots between accounts", () => {
  /** Two accounts' apps, each with a webhook: `busy`'s events are the older. */
  async function twoAccounts() {
    const busy = await outboxApp()
    const other = await outboxApp()
    await drainOutbox(busy.db)
    return { busy, other, busyHook: await busy.hook(['license.created']), otherHook: await other.hook(['license.created']) }
  }
  const owners = (claimed: { eventId: number }[], ids: number[]) => claimed.filter((c) => ids.includes(c.eventId)).length

  test("a fan-out claims each account's deliveries within its share first, and past it only what borrow leaves", async () => {
    const { busy, other } = await twoAccounts()
    const busyIds = await busy.emit('license.created', 5)
    const otherIds = await other.emit('license.created', 2)
    // 6 free, 2 of one account's before the rest are borrowed, 4 in all once borrowing: the busy
    // account's first 2 and the other's 2, then 0 more of the busy one's.
    const fanned = await fanOut(busy.db, 10, room(6, { share: 2, borrow: 4 }))
    expect(fanned.events).toBe(7)
    expect(owners(fanned.claimed, busyIds)).toBe(2)
    expect(owners(fanned.claimed, otherIds)).toBe(2)
    expect(fanned).toMatchObject({ fairLeft: 0, borrowedLeft: 3, pastShare: [busy.s.accountId] })
    expect(fanned.claimed.every((c) => c.accountId === (busyIds.includes(c.eventId) ? busy.s.accountId : other.s.accountId))).toBe(true)
  })

  test('an account alone takes every free slot but the reserve', async () => {
    const { busy } = await twoAccounts()
    await busy.emit('license.created', 12)
    const fanned = await fanOut(busy.db, 12, room(0))
    expect(fanned).toMatchObject({ events: 12, claimed: [] })
    // 8 free of which 2 are the reserve: 2 within the share and 4 past it.
    const taken = await claimDue(busy.db, room(8, { share: 2, borrow: 6 }), 120)
    expect(taken.claimed).toHaveLength(6)
    expect(taken).toMatchObject({ fairLeft: 0, borrowedLeft: 2 })
  })

  test("a claim finds another account's due deliveries behind the backlog of an account with its share on the way", async () => {
    const { busy, other } = await twoAccounts()
    await busy.emit('license.created', 30)
    const otherIds = await other.emit('license.created', 2)
    // Written unclaimed: no slot was free.
    expect((await fanOut(busy.db, 100, room(0))).events).toBe(32)
    const held = new Map([[busy.s.accountId, 2]])
    // The 4 oldest due deliveries are the busy account's, and it may not borrow: the other's come through.
    const taken = await claimDue(busy.db, room(4, { share: 2, borrow: 0, held }), 120)
    expect(taken.claimed.map((c) => c.eventId)).toEqual(otherIds)
    expect(taken).toMatchObject({ fairLeft: 0, borrowedLeft: 4, pastShare: [busy.s.accountId] })
    // Borrowing again, the busy account's oldest follow.
    const next = await claimDue(busy.db, room(4, { share: 2, borrow: 4, held }), 120)
    expect(next.claimed).toHaveLength(4)
    expect(next.claimed.every((c) => c.accountId === busy.s.accountId)).toBe(true)
  })
})

describe('the pass', () => {
  /** An outlet with a fixed room that keeps what it is sent. */
  function outlet(r: Room, worthBorrowing = false) {
    const sent: Claimed[] = []
    return { sent, room: () => r, worthClaiming: () => true, worthBorrowing: () => worthBorrowing, send: (c: Claimed) => void sent.push(c) }
  }

  test("after a full fan-out of an account's events past its share, the next wake-up reaches the other accounts' events behind them", async () => {
    const busy = await outboxApp()
    const other = await outboxApp()
    await drainOutbox(busy.db)
    await busy.hook(['license.created'])
    await other.hook(['license.created'])
    await busy.emit('license.created', 5)
    const otherIds = await other.emit('license.created')
    // A receiver is slow and the busy account has its share out: nothing of its can be claimed.
    const out = outlet(room(2, { share: 1, borrow: 0, held: new Map([[busy.s.accountId, 1]]) }))
    const claims = new Claims(busy.db, 500, 120)
    // Two events taken (as many as slots are free), both the busy account's: the next waits for room to borrow.
    await claims.pass(out)
    expect(out.sent).toEqual([])
    expect(claims.ready(out)).toBe(false)
    claims.committed()
    await claims.pass(out)
    expect(out.sent.map((c) => c.eventId)).toEqual(otherIds)
  })

  test('a full fan-out of events no webhook wants goes on at the pace of the free slots', async () => {
    const busy = await outboxApp()
    await drainOutbox(busy.db)
    const ids = await busy.emit('license.deleted', 4)
    const out = outlet(room(2, { share: 1, borrow: 0, held: new Map([[busy.s.accountId, 1]]) }))
    const claims = new Claims(busy.db, 500, 120)
    expect(await claims.pass(out)).toBe(true)
    expect(claims.ready(out)).toBe(true)
    await claims.pass(out)
    const dispatched = await busy.db.select().from(events).where(inArray(events.id, ids))
    expect(dispatched.every((e) => e.dispatchedAt !== null)).toBe(true)
  })
})
