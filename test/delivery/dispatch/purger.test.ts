import { afterEach, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { sql } from 'drizzle-orm'
import type { Db } from '../../../src/db/client'
import { Purger } from '../../../src/db/purger'
import { oldWebhookEvents, ownerlessDeliveries } from '../../../src/delivery/dispatch/purger'
import { rowsOf } from '../../../src/delivery/prepared'
import { deleteWebhook } from '../../../src/webhooks/service'
import { sharedInfra } from '../../support/helpers'
import { until } from '../../support/servers'
import { outboxApp } from './outbox-rows'

const { database } = await sharedInfra()

// The purge looks at events by id from the oldest: negative ids, below any the sequence hands out, put these
// rows first whatever earlier tests left in the shared database.
async function clearNegative(db: Db) {
  await db.execute(sql`DELETE FROM webhook_deliveries WHERE event_id < 0`)
  await db.execute(sql`DELETE FROM events WHERE id < 0`)
}
afterEach(() => clearNegative(database.db))

async function eventIdsBelowZero(db: Db): Promise<number[]> {
  return rowsOf(await db.execute(sql`SELECT id::float8 AS id FROM events WHERE id < 0 ORDER BY id`)).map((r) => Number(r.id))
}

async function addEvent(db: Db, id: number, dispatchedDaysAgo: number | null) {
  await db.execute(sql`
    INSERT INTO events (id, app_id, event, data, occurred_at, dispatched_at)
    VALUES (${id}, ${randomUUID()}, 'license.created', '{}'::jsonb, now() - interval '30 days',
            CASE WHEN ${dispatchedDaysAgo}::int IS NULL THEN NULL ELSE now() - make_interval(days => ${dispatchedDaysAgo}::int) END)`)
}

/** Events `from` to `to` (ids), dispatched 30 days ago and owing nothing: each purgeable. */
async function addPurgeable(db: Db, from: number, to: number) {
  await db.execute(sql`
    INSERT INTO events (id, app_id, event, data, occurred_at, dispatched_at)
    SELECT g, ${randomUUID()}, 'license.created', '{}'::jsonb, now(), now() - interval '30 days'
    FROM generate_series(${from}::int, ${to}::int) AS g`)
}

async function addDelivery(db: Db, eventId: number, webhookId: string, attempted: boolean) {
  await db.execute(sql`
    INSERT INTO webhook_deliveries (event_id, webhook_id, claimed_at, attempted_at, http_status)
    VALUES (${eventId}, ${webhookId}, now(), CASE WHEN ${attempted} THEN now() END, CASE WHEN ${attempted} THEN 200 END)`)
}

test('old events whose deliveries were all attempted go, with their deliveries; every other event stays', async () => {
  const o = await outboxApp()
  await clearNegative(o.db)
  const hook = await o.hook(['license.created'])
  await addEvent(o.db, -10, 8) // attempted: goes
  await addDelivery(o.db, -10, hook, true)
  await addEvent(o.db, -9, 8) // a delivery still owed: stays
  await addDelivery(o.db, -9, hook, false)
  await addEvent(o.db, -8, 1) // within the retention: stays
  await addEvent(o.db, -7, null) // never dispatched: stays
  await addEvent(o.db, -6, 8) // no webhook subscribed: goes

  await new Purger(o.db, oldWebhookEvents(7)).purge()
  expect(await eventIdsBelowZero(o.db)).toEqual([-9, -8, -7])
  const deliveries = rowsOf(await o.db.execute(sql`SELECT event_id::float8 AS id FROM webhook_deliveries WHERE event_id < 0`))
  expect(deliveries.map((r) => Number(r.id))).toEqual([-9])
})

test("a deleted webhook's deliveries still owed go with it, its attempted ones with their events' purge", async () => {
  const o = await outboxApp()
  await clearNegative(o.db)
  const [hook, kept] = [await o.hook(['license.created']), await o.hook(['license.created'])]
  await addEvent(o.db, -10, 8)
  await addDelivery(o.db, -10, hook, true)
  await addDelivery(o.db, -10, kept, true)
  await addEvent(o.db, -9, 8)
  await addDelivery(o.db, -9, hook, false)
  await addDelivery(o.db, -9, kept, false)
  const deliveries = async () =>
    rowsOf(await o.db.execute(sql`SELECT event_id::float8 AS id, webhook_id FROM webhook_deliveries WHERE event_id < 0 ORDER BY event_id, webhook_id = ${kept}`))
      .map((r) => [Number(r.id), r.webhook_id === kept ? 'kept' : 'deleted'])

  await deleteWebhook(o.t.ctx, o.s.accountId, o.s.appId, hook)
  expect(await deliveries()).toEqual([[-10, 'deleted'], [-10, 'kept'], [-9, 'kept']])
  await new Purger(o.db, oldWebhookEvents(7)).purge()
  expect(await eventIdsBelowZero(o.db)).toEqual([-9])
  expect(await deliveries()).toEqual([[-9, 'kept']])
})

test("deliveries owed to a webhook deleted by a version before 0008 (a delete counting on a cascade) go, and then their events", async () => {
  const o = await outboxApp()
  await clearNegative(o.db)
  const [hook, kept] = [await o.hook(['license.created']), await o.hook(['license.created'])]
  await addEvent(o.db, -10, 8)
  for (const id of [hook, kept]) await addDelivery(o.db, -10, id, false)
  // More than a batch of the deleted webhook's (the test's batch is 2).
  for (const id of [-9, -8, -7]) {
    await addEvent(o.db, id, 8)
    await addDelivery(o.db, id, hook, false)
  }
  // What deleteWebhook of the version before 0008 runs.
  await o.db.execute(sql`DELETE FROM webhooks WHERE id = ${hook} AND app_id = ${o.s.appId}`)

  await new Purger(o.db, ownerlessDeliveries, { rows: 2, batches: 10, againMs: 1_000 }).purge()
  const owed = rowsOf(await o.db.execute(sql`SELECT webhook_id FROM webhook_deliveries WHERE event_id < 0 AND attempted_at IS NULL`))
  expect(owed.map((r) => r.webhook_id)).toEqual([kept])
  await new Purger(o.db, oldWebhookEvents(7)).purge()
  expect(await eventIdsBelowZero(o.db)).toEqual([-10])
})

test('a purge goes on batch after batch while they come back full, and a stopped one ends', async () => {
  const { db } = database
  await clearNegative(db)
  // More than one batch (5 000) of purgeable events, and one that stays after them.
  await addPurgeable(db, -20000, -14951)
  await addEvent(db, -5, null)

  const stopped = new Purger(db, oldWebhookEvents(7))
  await stopped.stop()
  await stopped.purge()
  expect(await eventIdsBelowZero(db)).toHaveLength(5_051)

  await new Purger(db, oldWebhookEvents(7)).purge()
  expect(await eventIdsBelowZero(db)).toEqual([-5])
})

test.each([1, 5_000])('events owing a delivery at the front (%i) do not hold back the purge of those behind them', async (stuck) => {
  const o = await outboxApp()
  await clearNegative(o.db)
  const hook = await o.hook(['license.created'])
  const first = -(stuck + 20_000)
  await addPurgeable(o.db, first, -1)
  await o.db.execute(sql`
    INSERT INTO webhook_deliveries (event_id, webhook_id, claimed_at)
    SELECT g, ${hook}, now() FROM generate_series(${first}::int, ${first + stuck - 1}::int) AS g`)

  await new Purger(o.db, oldWebhookEvents(7)).purge()
  const left = await eventIdsBelowZero(o.db)
  expect(left).toHaveLength(stuck)
  expect(left.at(-1)).toBe(first + stuck - 1)
})

test('a purge stopped by its most batches with rows left is followed by another, from where it stopped', async () => {
  const { db } = database
  await clearNegative(db)
  await addPurgeable(db, -100, -1)
  const purger = new Purger(db, oldWebhookEvents(7), { rows: 10, batches: 2, againMs: 20 })
  try {
    await purger.purge()
    expect(await eventIdsBelowZero(db)).toHaveLength(80)
    expect(await until(() => eventIdsBelowZero(db), (ids) => ids.length === 0)).toEqual([])
  } finally {
    await purger.stop()
  }
})
