import { sql } from 'drizzle-orm'
import type { PurgeJob } from '../../db/purger'

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
