import { sql } from 'drizzle-orm'
import { PgTransaction } from 'drizzle-orm/pg-core'
import type { DbOrTx } from '../db/client'
import { claimedColumns, rowsOf, writerClaims } from '../webhooks/dispatcher'
import { executePrepared } from '../webhooks/prepared'
import { MAX_WEBHOOKS_PER_APP } from './webhooks'

/** The subscribable event names (test.ping is sent by the test operation only). */
export const EVENT_NAMES = [
  'license.validated',
  'license.created',
  'license.revoked',
  'license.activated',
  'license.hwid_bound',
  'license.hwid_reset',
  'license.deleted',
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
 * The same statement fans each event out: one webhook_deliveries row per webhook of its app that is
 * enabled and subscribed now, and the event is marked dispatched, so the dispatcher only has to
 * claim and send (no second pass rewriting every event row). The webhooks are locked FOR KEY SHARE:
 * one deleted meanwhile is skipped instead of failing the caller's change on the foreign key.
 * Events no webhook wants stay undispatched for the dispatcher's own fan-out, which also serves rows
 * an older version wrote. One JSON parameter keeps the statement text fixed whatever the batch size.
 *
 * Outside a transaction the statement commits on its own, so when this process runs a dispatcher on
 * the same database the deliveries it has room for are inserted already claimed and handed to it
 * right away (validate's batches: no claim statement per delivery). Inside a transaction they are
 * inserted unclaimed, because the caller may still roll back; the claim statement picks them up.
 */
export async function recordEvents(tx: DbOrTx, list: readonly DomainEvent[]): Promise<void> {
  if (list.length === 0) return
  const rows = list.map((e) => ({ app_id: e.data.appId, event: e.event, data: e.data, occurred_at: e.occurredAt.toISOString() }))
  const claim = tx instanceof PgTransaction ? null : writerClaims(tx, list.length * MAX_WEBHOOKS_PER_APP)
  let result: unknown
  try {
    result = await executePrepared(tx, 'record_events', sql`
      WITH r AS (
        SELECT * FROM ROWS FROM (
          jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS (app_id uuid, event text, data jsonb, occurred_at timestamptz)
        ) WITH ORDINALITY AS r(app_id, event, data, occurred_at, n)
      ), hooks AS (
        SELECT w.id, w.app_id, w.events, w.url, w.secret_enc, w.enabled FROM webhooks w
        WHERE w.enabled AND w.app_id IN (SELECT app_id FROM r)
        FOR KEY SHARE
      ), inserted AS (
        INSERT INTO events (app_id, event, data, occurred_at, dispatched_at)
        SELECT r.app_id, r.event, r.data, r.occurred_at,
               CASE WHEN EXISTS (SELECT 1 FROM hooks h WHERE h.app_id = r.app_id AND r.event = ANY(h.events)) THEN now() END
        FROM r ORDER BY r.n
        RETURNING id, app_id, event, data, occurred_at
      ), pairs AS (
        SELECT i.id AS event_id, h.id AS webhook_id, row_number() OVER (ORDER BY i.id, h.id) AS k
        FROM inserted i JOIN hooks h ON h.app_id = i.app_id AND i.event = ANY(h.events)
      ), owed AS (
        INSERT INTO webhook_deliveries (event_id, webhook_id, claimed_at)
        SELECT event_id, webhook_id, CASE WHEN k <= ${claim?.room ?? 0} THEN now() END FROM pairs
        RETURNING event_id, webhook_id, claimed_at
      ), counts AS (
        SELECT count(*) FILTER (WHERE claimed_at IS NULL)::int AS unclaimed FROM owed
      )
      SELECT counts.unclaimed, c.* FROM counts LEFT JOIN (
        SELECT ${claimedColumns('o', 'i', 'h')}
        FROM owed o
        JOIN inserted i ON i.id = o.event_id
        JOIN hooks h ON h.id = o.webhook_id
        WHERE o.claimed_at IS NOT NULL
      ) c ON true`)
  } catch (err) {
    claim?.take([], false)
    throw err
  }
  if (!claim) return
  const returned = rowsOf(result)
  claim.take(
    returned.filter((r) => r.event_id !== null && r.event_id !== undefined),
    Number(returned[0]?.unclaimed ?? 1) === 0,
  )
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
