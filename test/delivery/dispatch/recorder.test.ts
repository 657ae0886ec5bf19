import { describe, expect, setSystemTime, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { webhooks } from '../../../src/db/schema'
import { claimDue, fanOut } from '../../../src/delivery/dispatch/claim'
import { Recorder } from '../../../src/delivery/dispatch/recorder'
import { sharedInfra } from '../../support/helpers'
import { until } from '../../support/webhooks-receiver'
import { drainOutbox, outboxApp, room } from './outbox-rows'

await sharedInfra()

/** Two claimed deliveries of one webhook. */
async function claimedPair() {
  const o = await outboxApp()
  await drainOutbox(o.db)
  const webhookId = await o.hook(['license.created'])
  const ids = await o.emit('license.created', 2)
  const fanned = await fanOut(o.db, 10, room(10))
  expect(fanned.claimed).toHaveLength(2)
  const [first, second] = ids.map((eventId) => ({ eventId, webhookId }))
  return { o, webhookId, ids, first: first!, second: second! }
}

async function lastDeliveryOf(o: Awaited<ReturnType<typeof claimedPair>>['o'], webhookId: string) {
  const [row] = await o.db.select().from(webhooks).where(eq(webhooks.id, webhookId))
  return { at: row?.lastDeliveryAt?.toISOString() ?? null, status: row?.lastDeliveryStatus ?? null }
}

describe('recorder', () => {
  test('a delivery already on the way is not taken twice, until its outcome is written', async () => {
    const { o, first } = await claimedPair()
    const recorder = new Recorder(o.db, () => {})
    expect(recorder.take(first)).toBe(true)
    expect(recorder.take(first)).toBe(false)
    recorder.record({ ...first, at: new Date(), status: 204 })
    expect(recorder.take(first)).toBe(false)
    recorder.stopping()
    await recorder.drain()
    expect(recorder.take(first)).toBe(true)
  })

  test('outcomes close their rows, and the webhook keeps the newest whatever the order they arrive in', async () => {
    const { o, webhookId, ids, first, second } = await claimedPair()
    const recorder = new Recorder(o.db, () => {})
    recorder.take(first)
    recorder.take(second)
    const newer = new Date('2026-02-01T00:00:02.000Z')
    const older = new Date('2026-02-01T00:00:01.000Z')
    recorder.record({ ...second, at: newer, status: 200 })
    recorder.record({ ...first, at: older, status: 0 })
    recorder.stopping()
    await recorder.drain()

    const rows = await o.deliveriesOf(ids)
    const byEvent = new Map(rows.map((r) => [r.eventId, r]))
    expect(byEvent.get(first.eventId)).toMatchObject({ attemptedAt: older, httpStatus: 0 })
    expect(byEvent.get(second.eventId)).toMatchObject({ attemptedAt: newer, httpStatus: 200 })
    expect(await lastDeliveryOf(o, webhookId)).toEqual({ at: newer.toISOString(), status: 200 })
  })

  test('a skipped delivery (webhook disabled meanwhile) is closed without touching the last delivery', async () => {
    const { o, webhookId, ids, first } = await claimedPair()
    const recorder = new Recorder(o.db, () => {})
    recorder.take(first)
    recorder.record({ ...first, at: new Date(), status: null })
    recorder.stopping()
    await recorder.drain()
    const [row] = (await o.deliveriesOf(ids)).filter((r) => r.eventId === first.eventId)
    expect(row?.attemptedAt).not.toBeNull()
    expect(row?.httpStatus).toBeNull()
    expect(await lastDeliveryOf(o, webhookId)).toEqual({ at: null, status: null })
  })

  test('while running, results wait a moment (to share a statement with those arriving meanwhile), then are written', async () => {
    const { o, ids, first, second } = await claimedPair()
    const recorder = new Recorder(o.db, () => {})
    const written = async () => (await o.deliveriesOf(ids)).filter((r) => r.attemptedAt !== null).length
    recorder.take(first)
    recorder.take(second)
    recorder.record({ ...first, at: new Date(), status: 200 })
    recorder.record({ ...second, at: new Date(), status: 200 })
    expect(await written()).toBe(0)
    await until(async () => (await written()) === 2, 'the batch to be written')
    recorder.stopping()
    await recorder.drain()
  })

  test('a hand-back clears the claim at drain, so the next claim takes it at once', async () => {
    const { o, ids, first, second } = await claimedPair()
    const recorder = new Recorder(o.db, () => {})
    recorder.take(first)
    recorder.take(second)
    recorder.handBack(first)
    // Handed back: no longer this instance's.
    expect(recorder.take(first)).toBe(true)
    recorder.handBack(first)
    recorder.stopping()
    await recorder.drain()

    const rows = await o.deliveriesOf(ids)
    const byEvent = new Map(rows.map((r) => [r.eventId, r]))
    expect(byEvent.get(first.eventId)).toMatchObject({ claimedAt: null, attemptedAt: null })
    expect(byEvent.get(second.eventId)?.claimedAt).not.toBeNull()
    const again = (await claimDue(o.db, room(10), 120)).claimed
    expect(again.map((c) => c.eventId)).toEqual([first.eventId])
  })

  /** A recorder holding one delivery's result, whose database is unreachable for `outageMs` from now. */
  async function recordingInOutage(outageMs: number) {
    const { o, ids, first } = await claimedPair()
    const outageUntil = performance.now() + outageMs
    const flaky = new Proxy(o.db, {
      get(target, prop, receiver) {
        if (performance.now() < outageUntil) throw new Error('the database is unreachable')
        return Reflect.get(target, prop, receiver)
      },
    })
    const recorder = new Recorder(flaky, () => {})
    recorder.take(first)
    recorder.record({ ...first, at: new Date(), status: 200 })
    const recorded = async () => (await o.deliveriesOf(ids)).find((r) => r.eventId === first.eventId)
    return { recorder, recorded }
  }

  test('a stop in a short database outage keeps trying to record what was sent: given up, it would be sent again once its lease ran out', async () => {
    const { recorder, recorded } = await recordingInOutage(3000)
    recorder.stopping()
    await recorder.drain()
    const row = await recorded()
    expect(row).toMatchObject({ httpStatus: 200 })
    expect(row?.attemptedAt).not.toBeNull()
  }, 20_000)

  test('a wall clock stepped forward during that stop does not cut its tries short', async () => {
    const { recorder, recorded } = await recordingInOutage(2000)
    recorder.stopping()
    // A VM resumed from a pause, an NTP step.
    setSystemTime(new Date(Date.now() + 3_600_000))
    try {
      await recorder.drain()
    } finally {
      setSystemTime()
    }
    expect(await recorded()).toMatchObject({ httpStatus: 200 })
  }, 20_000)
})
