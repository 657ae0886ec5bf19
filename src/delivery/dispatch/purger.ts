import { sql } from 'drizzle-orm'
import type { Db } from '../../db/client'
import { errorFields, log } from '../../lib/log'
import { rowsOf } from '../prepared'

const PURGE_EVERY_MS = 10 * 60_000
const PURGE_BATCH = 5_000
const PURGE_MAX_BATCHES = 100

/**
 * Deletes events older than the retention whose deliveries are all attempted, with their deliveries:
 * at start and every ten minutes, one purge at a time.
 */
export class Purger {
  readonly #db: Db
  readonly #retentionDays: number
  #timer: ReturnType<typeof setInterval> | null = null
  #purging: Promise<void> | null = null
  /** Set by stop(): a purge under way ends after its current batch. */
  #stopped = false

  constructor(db: Db, retentionDays: number) {
    this.#db = db
    this.#retentionDays = retentionDays
  }

  start(): void {
    this.#stopped = false
    this.#timer = setInterval(() => this.purge(), PURGE_EVERY_MS)
    this.#timer.unref?.()
    this.purge()
  }

  /** Stops the timer at once; the purge under way ends after its current batch. */
  stop(): Promise<void> {
    this.#stopped = true
    if (this.#timer) clearInterval(this.#timer)
    return this.#purging ?? Promise.resolve()
  }

  /** Starts a purge unless one runs; resolves when it is over (it never rejects). */
  purge(): Promise<void> {
    this.#purging ??= this.#run().finally(() => {
      this.#purging = null
    })
    return this.#purging
  }

  /**
   * Deletes old events and, in the same statement, their deliveries (no foreign key cascades them).
   * Ids grow with time, so each batch looks only at the oldest rows through the primary key instead
   * of scanning a table that can be large.
   */
  async #run(): Promise<void> {
    try {
      for (let batch = 0; batch < PURGE_MAX_BATCHES && !this.#stopped; batch++) {
        const result = await this.#db.execute(sql`
          WITH oldest AS (SELECT id FROM events ORDER BY id LIMIT ${PURGE_BATCH}),
          gone AS (
            DELETE FROM events e USING oldest
            WHERE e.id = oldest.id
              AND e.dispatched_at < now() - make_interval(days => ${this.#retentionDays})
              AND NOT EXISTS (
                SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.attempted_at IS NULL
              )
            RETURNING e.id
          ), deliveries AS (
            DELETE FROM webhook_deliveries d USING gone WHERE d.event_id = gone.id
          )
          SELECT count(*)::int AS n FROM gone`)
        if (Number(rowsOf(result)[0]?.n ?? 0) < PURGE_BATCH) break
      }
    } catch (err) {
      log.warn('purging old webhook events failed', errorFields(err))
    }
  }
}
