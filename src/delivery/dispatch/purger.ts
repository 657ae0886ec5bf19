import { sql } from 'drizzle-orm'
import type { PurgeJob } from '../../db/purger'

/**
 * Events older than the retention whose deliveries are all attempted, with their deliveries (no
 * foreign key cascades them), in one statement. Ids grow with time, so each batch looks only at the
 * oldest rows through the primary key instead of scanning a table that can be large.
 */
export const oldWebhookEvents = (retentionDays: number): PurgeJob => ({
  what: 'old webhook events',
  batch: (limit) => sql`
    WITH oldest AS (SELECT id FROM events ORDER BY id LIMIT ${limit}),
    gone AS (
      DELETE FROM events e USING oldest
      WHERE e.id = oldest.id
        AND e.dispatched_at < now() - make_interval(days => ${retentionDays})
        AND NOT EXISTS (
          SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.attempted_at IS NULL
        )
      RETURNING e.id
    ), deliveries AS (
      DELETE FROM webhook_deliveries d USING gone WHERE d.event_id = gone.id
    )
    SELECT count(*)::int AS n FROM gone`,
})
