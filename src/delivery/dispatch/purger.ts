import { sql } from 'drizzle-orm'
import type { PurgeJob } from '../../db/purger'
import { pendingQueues } from './claim'

/**
 * Events older than the retention whose deliveries are all attempted, with their deliveries (no
 * foreign key cascades them), in one statement. Ids grow with time, so each batch looks at the next
 * `limit` events by id through the primary key instead of scanning a table that can be large, and goes
 * on past those that must stay (a delivery still owed to a receiver that stopped answering): the next
 * batch looks on from the last of them, until it reaches events within the retention.
 */
export const oldWebhookEvents = (retentionDays: number): PurgeJob => ({
  what: 'old webhook events',
  batch: (limit, after) => sql`
    WITH win AS (
      SELECT id, dispatched_at FROM events ${after === null ? sql`` : sql`WHERE id > ${after}::bigint`} ORDER BY id LIMIT ${limit}
    ), gone AS (
      DELETE FROM events e USING win
      WHERE e.id = win.id
        AND win.dispatched_at < now() - make_interval(days => ${retentionDays})
        AND NOT EXISTS (
          SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.attempted_at IS NULL
        )
      RETURNING e.id
    ), deliveries AS (
      DELETE FROM webhook_deliveries d USING gone WHERE d.event_id = gone.id
    ), last AS (
      SELECT id, dispatched_at FROM win ORDER BY id DESC LIMIT 1
    )
    SELECT (SELECT count(*) FROM gone)::int AS n,
      (SELECT id::text FROM last
       WHERE (SELECT count(*) FROM win) = ${limit} AND dispatched_at < now() - make_interval(days => ${retentionDays})) AS next`,
})

/**
 * Deliveries still owed to a webhook that is gone. A webhook's delete takes its own with it
 * (deleteWebhook); these are left by an instance of a version before migration 0008, whose deletes
 * counted on a foreign key's cascade, still running in a rolling upgrade. Never claimed (the claims
 * join webhooks) and holding their events back from the purge above, they would stay for good.
 */
export const ownerlessDeliveries: PurgeJob = {
  what: 'deliveries owed to deleted webhooks',
  batch: (limit) => sql`
    WITH RECURSIVE ${pendingQueues}, doomed AS (
      SELECT d.event_id, d.webhook_id FROM queues q
      JOIN webhook_deliveries d ON d.webhook_id = q.webhook_id AND d.attempted_at IS NULL
      WHERE NOT EXISTS (SELECT 1 FROM webhooks w WHERE w.id = q.webhook_id)
      LIMIT ${limit}
    ), gone AS (
      DELETE FROM webhook_deliveries d USING doomed x
      WHERE d.event_id = x.event_id AND d.webhook_id = x.webhook_id AND d.attempted_at IS NULL
      RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone)::int AS n,
      CASE WHEN (SELECT count(*) FROM gone) = ${limit} THEN 'more' END AS next`,
}
