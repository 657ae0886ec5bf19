import { sql } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'

/** One finished attempt: a delivery of an outbox event, or a test ping (no eventId). */
export interface Attempt {
  webhookId: string
  eventId?: number
  at: Date
  /** HTTP status, 0 for no response, null when skipped because the webhook was disabled meanwhile. */
  status: number | null
}

/**
 * Records attempts in two set-based statements: each delivery row is closed, and each webhook's
 * lastDelivery* moves forward to its newest attempt (never backwards when results arrive out of order).
 */
export async function recordAttempts(db: DbOrTx, attempts: readonly Attempt[]): Promise<void> {
  if (attempts.length === 0) return
  const deliveries = attempts
    .filter((a) => a.eventId !== undefined)
    .map((a) => ({ event_id: a.eventId, webhook_id: a.webhookId, at: a.at.toISOString(), status: a.status }))
  const latest = new Map<string, { webhook_id: string; at: string; status: number }>()
  for (const a of attempts) {
    if (a.status === null) continue
    const seen = latest.get(a.webhookId)
    if (!seen || seen.at <= a.at.toISOString()) {
      latest.set(a.webhookId, { webhook_id: a.webhookId, at: a.at.toISOString(), status: a.status })
    }
  }
  const run = async (tx: DbOrTx) => {
    if (deliveries.length > 0) {
      await tx.execute(sql`
        UPDATE webhook_deliveries AS d SET attempted_at = r.at, http_status = r.status
        FROM jsonb_to_recordset(${JSON.stringify(deliveries)}::jsonb)
          AS r(event_id bigint, webhook_id text, at timestamptz, status integer)
        WHERE d.event_id = r.event_id AND d.webhook_id = r.webhook_id`)
    }
    if (latest.size > 0) {
      await tx.execute(sql`
        UPDATE webhooks AS w SET last_delivery_at = r.at, last_delivery_status = r.status
        FROM jsonb_to_recordset(${JSON.stringify([...latest.values()])}::jsonb)
          AS r(webhook_id text, at timestamptz, status integer)
        WHERE w.id = r.webhook_id AND (w.last_delivery_at IS NULL OR w.last_delivery_at <= r.at)`)
    }
  }
  if (deliveries.length > 0 && latest.size > 0) await db.transaction(run)
  else await run(db)
}
