import { describe, expect, test } from 'bun:test'
import { and, eq, sql } from 'drizzle-orm'
import { AppActors } from '../../src/actors/registry'
import { events, licenses } from '../../src/db/schema'
import { PublicError } from '../../src/lib/errors'
import type { Context } from '../../src/context'
import { makeTestApp } from '../support/helpers'
import { hwid, insertLicense } from '../support/client'
import { connectionRefused } from '../support/pg-errors'

const t = await makeTestApp()

// The edge rejects these before they reach the binder; here they stand for any member whose data
// PostgreSQL refuses (NUL in text, a lone surrogate in the hwid_bound event's JSON).
describe.each([
  ['a NUL byte', 'a\u0000b'],
  ['a lone surrogate', 'x\ud800'],
])('a member whose HWID holds %s', (_, poison) => {
  test('fails alone: the other 60 first activations of its app bind', async () => {
    const s = await t.seed()
    const keys = await Promise.all(Array.from({ length: 60 }, () => insertLicense(t.ctx, s.appId)))
    const poisonedKey = await insertLicense(t.ctx, s.appId)

    // One synchronous burst: every bind joins the app's same batch.
    const outcomes = await Promise.allSettled([
      ...keys.slice(0, 30).map((key) => t.ctx.actors.bindSeat(s.appId, key, hwid())),
      t.ctx.actors.bindSeat(s.appId, poisonedKey, poison),
      ...keys.slice(30).map((key) => t.ctx.actors.bindSeat(s.appId, key, hwid())),
    ])

    const poisoned = outcomes.splice(30, 1)[0]
    expect(outcomes.filter((o) => o.status === 'fulfilled' && o.value === true)).toHaveLength(60)
    expect(poisoned?.status).toBe('rejected')
    const reason = poisoned?.status === 'rejected' ? poisoned.reason : null
    expect(reason).toBeInstanceOf(PublicError)
    expect((reason as PublicError).code).toBe('bad_request')

    const rows = await t.ctx.database.db
      .select({ key: licenses.key, seats: sql<number>`cardinality(${licenses.hwids})::int` })
      .from(licenses)
      .where(eq(licenses.appId, s.appId))
    const seats = new Map(rows.map((r) => [r.key, r.seats]))
    expect(keys.map((key) => seats.get(key))).toEqual(keys.map(() => 1))
    expect(seats.get(poisonedKey)).toBe(0)
    const bound = await t.ctx.database.db
      .select({ id: events.id })
      .from(events)
      .where(and(eq(events.appId, s.appId), eq(events.event, 'license.hwid_bound')))
    expect(bound).toHaveLength(60)
  })
})

test('while the database is unreachable every bind of the batch fails with system_error and nothing is bound', async () => {
  const s = await t.seed()
  const keys = await Promise.all(Array.from({ length: 5 }, () => insertLicense(t.ctx, s.appId)))
  const { db } = t.ctx.database
  const unreachable = new Proxy(db, {
    get: (target, name) => (name === 'transaction' ? () => Promise.reject(connectionRefused()) : Reflect.get(target, name)),
  })
  const down: Context = { ...t.ctx, actors: new AppActors({ ...t.ctx, database: { ...t.ctx.database, db: unreachable } }) }

  const outcomes = await Promise.allSettled(keys.map((key) => down.actors.bindSeat(s.appId, key, hwid())))
  for (const outcome of outcomes) {
    expect(outcome.status).toBe('rejected')
    const reason = outcome.status === 'rejected' ? outcome.reason : null
    expect(reason).toBeInstanceOf(PublicError)
    expect((reason as PublicError).code).toBe('system_error')
  }
  const rows = await db.select({ hwids: licenses.hwids }).from(licenses).where(eq(licenses.appId, s.appId))
  expect(rows.map((r) => r.hwids)).toEqual(keys.map(() => []))
  expect(await t.ctx.actors.bindSeat(s.appId, keys[0]!, hwid())).toBe(true)
})

/** A context whose database counts the transactions opened through it. */
/** Counts the transactions that update rows: the binds' (the invalidation records' deletes update none). */
function countingTransactions() {
  const { db } = t.ctx.database
  const counter = { transactions: 0 }
  const counted = new Proxy(db, {
    get: (target, name) =>
      name === 'transaction'
        ? (work: Parameters<typeof db.transaction>[0]) =>
            target.transaction((tx) => {
              let updated = false
              const watched = new Proxy(tx, {
                get: (inner, member) => {
                  if (member === 'update' && !updated) {
                    updated = true
                    counter.transactions++
                  }
                  return Reflect.get(inner, member)
                },
              })
              return work(watched)
            })
        : Reflect.get(target, name),
  })
  return { counter, ctx: { ...t.ctx, actors: new AppActors({ ...t.ctx, database: { ...t.ctx.database, db: counted } }) } }
}

test('a burst of binds of one app is written in one transaction', async () => {
  const s = await t.seed()
  const keys = await Promise.all(Array.from({ length: 20 }, () => insertLicense(t.ctx, s.appId)))
  const { counter, ctx } = countingTransactions()
  const bound = await Promise.all(keys.map((key) => ctx.actors.bindSeat(s.appId, key, hwid())))
  expect(bound).toEqual(keys.map(() => true))
  expect(counter.transactions).toBe(1)
})

test('binds arriving while a batch is written wait and travel together in the next one', async () => {
  const s = await t.seed()
  const keys = await Promise.all(Array.from({ length: 11 }, () => insertLicense(t.ctx, s.appId)))
  const { counter, ctx } = countingTransactions()
  const first = ctx.actors.bindSeat(s.appId, keys[0]!, hwid())
  await Bun.sleep(0)
  const rest = keys.slice(1).map((key) => ctx.actors.bindSeat(s.appId, key, hwid()))
  const bound: boolean[] = await Promise.all([first, ...rest])
  expect(bound).toEqual(keys.map(() => true))
  expect(counter.transactions).toBe(2)
})

test('racing HWIDs never take more seats than the license has, across two processes', async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
  const other = { actors: new AppActors(t.ctx) }
  const bound = await Promise.all(
    Array.from({ length: 30 }, (_, i) => (i % 2 ? t.ctx : other).actors.bindSeat(s.appId, licenseKey, hwid())),
  )
  expect(bound.filter(Boolean)).toHaveLength(3)
  const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
  expect(row?.hwids).toHaveLength(3)
  // The same HWID again is not a second seat.
  expect(await t.ctx.actors.bindSeat(s.appId, licenseKey, row!.hwids[0]!)).toBe(false)
})
