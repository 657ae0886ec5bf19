import { randomUUID } from 'node:crypto'
import { inArray } from 'drizzle-orm'
import type { Db } from '../../../src/db/client'
import { events, webhookDeliveries, webhooks } from '../../../src/db/schema'
import { claimDue, type Claimed, fanOut, type Room } from '../../../src/delivery/dispatch/claim'
import type { EventName } from '../../../src/delivery/outbox'
import { recordAttempts } from '../../../src/delivery/attempts'
import { makeTestApp } from '../../support/helpers'

/** An app of its own on the shared test database, with helpers writing outbox rows for it directly. */
export async function outboxApp() {
  const t = await makeTestApp()
  const s = await t.seed()
  const db = t.ctx.database.db

  /** A webhook row (no receiver: these tests never send). */
  async function hook(subscribed: EventName[], enabled = true): Promise<string> {
    const id = `wh_test_${randomUUID()}`
    await db.insert(webhooks).values({ id, appId: s.appId, url: `https://receiver.invalid/${id}`, events: subscribed, enabled, secretEnc: 'sealed' })
    return id
  }

  /** Events as recordEvents writes them (undispatched), oldest first; returns their ids. */
  async function emit(event: EventName, count = 1): Promise<number[]> {
    const rows = Array.from({ length: count }, (_, i) => ({
      appId: s.appId,
      event,
      data: { licenseKey: `KEY-${i}`, appId: s.appId },
      occurredAt: new Date(Date.UTC(2026, 0, 1, 0, 0, i)),
    }))
    const ids = await db.insert(events).values(rows).returning({ id: events.id })
    return ids.map((r) => r.id).sort((a, b) => a - b)
  }

  /** This app's delivery rows of the given events. */
  function deliveriesOf(eventIds: number[]) {
    return db.select().from(webhookDeliveries).where(inArray(webhookDeliveries.eventId, eventIds))
  }

  return { t, s, db, hook, emit, deliveriesOf }
}

/**
 * Fans out and closes (as skipped) whatever earlier test files left in the shared database, so a
 * test's statements see only its own rows.
 */
export async function drainOutbox(db: Db): Promise<void> {
  const close = (claimed: Claimed[]) =>
    recordAttempts(db, claimed.map((c) => ({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(), status: null })))
  for (;;) {
    const fanned = await fanOut(db, 1_000, room(1_000))
    await close(fanned.claimed)
    if (fanned.events < 1_000) break
  }
  for (;;) {
    const { claimed } = await claimDue(db, room(1_000), 0)
    await close(claimed)
    if (claimed.length < 1_000) break
  }
}

/** Lets now() move past the claims just written (timestamps are kept to the millisecond). */
export const pastThisMillisecond = () => Bun.sleep(5)

/** "eventId webhookId" pairs, sorted: what a set of claims or rows covers. */
export function pairs(rows: readonly { eventId: number; webhookId: string }[]): string[] {
  return rows.map((r) => `${r.eventId} ${r.webhookId}`).sort()
}

/** Room for `free` deliveries, every one within its account's share unless `shared` says otherwise. */
export function room(free: number, shared: Partial<Room> = {}): Room {
  return { free, borrow: free, share: 1_000_000, held: new Map(), ...shared }
}
