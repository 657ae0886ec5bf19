import { sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'
import { executePrepared } from './prepared'

/** One finished attempt: a delivery of an outbox event, or a test ping (no eventId). */
export interface Attempt {
  webhookId: string
  eventId?: number
  at: Date
  /** HTTP status, 0 for no response, null when skipped because the webhook was disabled meanwhile. */
  status: number | null
}

/**
 * Records attempts in one statement: each delivery row is closed, and each webhook's lastDelivery* (its
 * time and status, of one attempt) become the newest attempt of the batch, the one recorded last,
 * whatever its clock said: ordered by the attempts' times, an instance whose clock is behind (or one
 * stepped back) recorded none of its attempts for as long as the difference.
 */
export async function recordAttempts(db: DbOrTx, attempts: readonly Attempt[]): Promise<void> {
  if (attempts.length === 0) return
  const rows = attempts.map((a) => ({
    event_id: a.eventId ?? null,
    webhook_id: a.webhookId,
    at: a.at.toISOString(),
    status: a.status,
  }))
  await executePrepared(db, 'record_webhook_attempts', sql`
    WITH r AS (
      SELECT * FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
        AS r(event_id bigint, webhook_id text, at timestamptz, status integer)
    ), closed AS (
      UPDATE webhook_deliveries AS d SET attempted_at = r.at, http_status = r.status
      FROM r WHERE r.event_id IS NOT NULL AND d.event_id = r.event_id AND d.webhook_id = r.webhook_id
    ), latest AS (
      SELECT DISTINCT ON (webhook_id) webhook_id, at, status FROM r
      WHERE status IS NOT NULL
      ORDER BY webhook_id, at DESC
    )
    UPDATE webhooks AS w SET last_delivery_at = latest.at, last_delivery_status = latest.status
    FROM latest
    WHERE w.id = latest.webhook_id`)
}
