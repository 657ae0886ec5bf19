import { sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { executePrepared, rowsOf } from './prepared'

/** The subscribable event names (test.ping is sent by the test operation only). */
export const EVENT_NAMES = [
  'license.validated',
  'license.created',
  'license.revoked',
  'license.activated',
  'license.hwid_bound',
  'license.hwid_reset',
  'license.deleted',
  'license.offline_issued',
] as const
export type EventName = (typeof EVENT_NAMES)[number]

export interface EventData extends Record<string, unknown> {
  licenseKey: string
  appId: string
}

export interface DomainEvent {
  event: EventName
  data: EventData
  occurredAt: Date
}

/**
 * Writes events to the outbox inside the caller's transaction, so an event exists exactly when the
 * change that caused it committed. Delivery reads the outbox; call `EventBus.notify()` after commit.
 *
 * Only the event rows are written: the dispatcher fans each one out (one webhook_deliveries row per
 * webhook of its app that is enabled and subscribed then) when it has room to send them. Under a
 * saturated CPU the dispatcher gives way to API requests, and then license.validated costs the
 * database one row per login instead of an event, a delivery row and the statement joining them.
 * One JSON parameter keeps the statement text fixed (prepared once) whatever the batch size. Returns
 * the events' ids, which no other row is ever given (a sequence never hands a value out twice, a crash
 * included): a write whose COMMIT's answer was lost is known to have committed by finding them.
 */
export async function recordEvents(tx: DbOrTx, list: readonly DomainEvent[]): Promise<number[]> {
  if (list.length === 0) return []
  const rows = list.map((e) => ({ app_id: e.data.appId, event: e.event, data: e.data, occurred_at: e.occurredAt.toISOString() }))
  const inserted = await executePrepared(tx, 'record_events', sql`
    INSERT INTO events (app_id, event, data, occurred_at)
    SELECT r.app_id, r.event, r.data, r.occurred_at
    FROM ROWS FROM (
      jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS (app_id uuid, event text, data jsonb, occurred_at timestamptz)
    ) WITH ORDINALITY AS r(app_id, event, data, occurred_at, n)
    ORDER BY r.n
    RETURNING id`)
  return rowsOf(inserted).map((row) => Number(row.id))
}

/** Wakes in-process consumers of the outbox (the webhook dispatcher) right after a commit. */
export class EventBus {
  readonly #listeners = new Set<() => void>()

  subscribe(listener: () => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  notify(): void {
    for (const listener of this.#listeners) listener()
  }
}
