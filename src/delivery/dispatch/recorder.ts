import { type SQL, sql } from 'drizzle-orm'
import type { Db } from '../../db/client'
import { errorFields, log, logEvery } from '../../lib/log'
import { type Attempt, recordAttempts } from '../attempts'
import { deliveryOutcome } from './options'

const FLUSH_DELAY_MS = 100
const RECORD_BATCH = 1_000
/**
 * How long a stopping instance keeps trying to record what it sent: a result not recorded is sent
 * again once its lease (2 minutes) runs out, so a short database outage at a deploy must not give
 * them up. Well inside the 30 s a container stop allows.
 */
const STOP_RECORD_WAIT_MS = 15_000

/** One delivery: an outbox event to one webhook. */
export interface DeliveryKey {
  eventId: number
  webhookId: string
}

const keyOf = (d: { eventId?: number; webhookId: string }) => `${d.eventId} ${d.webhookId}`

/** Sets the claim of each delivery not attempted yet: now (renewed) or NULL (handed back). */
function setClaims(db: Db, deliveries: DeliveryKey[], claimedAt: SQL): Promise<unknown> {
  const rows = deliveries.map((d) => ({ event_id: d.eventId, webhook_id: d.webhookId }))
  return db.execute(sql`
    UPDATE webhook_deliveries AS d SET claimed_at = ${claimedAt}
    FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS r(event_id bigint, webhook_id text)
    WHERE d.event_id = r.event_id AND d.webhook_id = r.webhook_id AND d.attempted_at IS NULL`)
}

/**
 * The ledger of this instance's claims, from claim to outcome: finished attempts are written in
 * batches (attempt rows and the webhooks' lastDelivery*), deliveries cancelled before sending are
 * handed back at stop. One write in flight at a time; later results queue up.
 */
export class Recorder {
  readonly #db: Db
  /** Deliveries this instance claimed and has not recorded yet, by keyOf. */
  readonly #owned = new Map<string, DeliveryKey>()
  #results: Attempt[] = []
  /** Claimed deliveries cancelled at shutdown before they were sent. */
  #released: DeliveryKey[] = []
  #flushing: Promise<void> | null = null
  /** Once stopping, results are written at once and a write that keeps failing is given up. */
  #stopping = false
  /** When stopping() was called: the writes give up STOP_RECORD_WAIT_MS after it. */
  #stoppedAt = 0

  readonly #recorded: (outcomes: Record<string, number>) => void

  constructor(db: Db, recorded: (outcomes: Record<string, number>) => void) {
    this.#db = db
    this.#recorded = recorded
  }

  /**
   * Takes a claimed delivery on; false when this instance already has it on the way: its own claim
   * that expired while queued or unrecorded (a saturated CPU, a database outage), which re-claiming
   * only extended. Sending it again would be a duplicate.
   */
  take(d: DeliveryKey): boolean {
    const key = keyOf(d)
    if (this.#owned.has(key)) return false
    this.#owned.set(key, { eventId: d.eventId, webhookId: d.webhookId })
    return true
  }

  /** A finished (or, with status null, skipped) delivery: written with the next batch. */
  record(attempt: Attempt): void {
    this.#results.push(attempt)
    this.#flush()
  }

  /** A delivery cancelled before it was sent: its claim is cleared at stop. */
  handBack(d: DeliveryKey): void {
    this.#released.push({ eventId: d.eventId, webhookId: d.webhookId })
    this.#owned.delete(keyOf(d))
  }

  /**
   * Stamps the claims of every delivery this instance has on the way (claimed_at = now), so no other
   * instance takes one over while it waits behind a slow receiver: a lease runs out only when its
   * instance stops renewing it (a crash). A failed renewal is logged; the next one tries again.
   */
  async renew(): Promise<void> {
    if (this.#owned.size === 0) return
    try {
      await setClaims(this.#db, [...this.#owned.values()], sql`now()`)
    } catch (err) {
      logEvery('warn', 'renewing webhook delivery claims failed; will retry', () => errorFields(err))
    }
  }

  /** From now on nothing waits: results are written at once, and a write still failing STOP_RECORD_WAIT_MS later is given up. */
  stopping(): void {
    this.#stopping = true
    // The monotonic clock, as the bound is a wait: a wall clock stepped forward would end it at once.
    this.#stoppedAt = performance.now()
  }

  /** Writes every result still waiting, then hands back what was cancelled. After stopping(). */
  async drain(): Promise<void> {
    this.#flush()
    await this.#flushing
    await this.#release()
  }

  #flush(): void {
    if (this.#flushing || this.#results.length === 0) return
    this.#flushing = this.#write().finally(() => {
      this.#flushing = null
      if (this.#results.length > 0 && !this.#stopping) this.#flush()
    })
  }

  async #write(): Promise<void> {
    // Results arrive one by one: a short wait turns them into one statement per batch.
    if (!this.#stopping) await Bun.sleep(FLUSH_DELAY_MS)
    let failures = 0
    while (this.#results.length > 0) {
      const batch = this.#results.splice(0, RECORD_BATCH)
      try {
        await recordAttempts(this.#db, batch)
        const outcomes: Record<string, number> = {}
        for (const a of batch) {
          this.#owned.delete(keyOf(a))
          const outcome = deliveryOutcome(a.status)
          outcomes[outcome] = (outcomes[outcome] ?? 0) + 1
        }
        this.#recorded(outcomes)
        failures = 0
        // What arrived during the write waits for the next batch (after the delay), unless a full
        // batch is already there: back-to-back statements of a few rows each cost the most.
        if (!this.#stopping && this.#results.length < RECORD_BATCH) break
      } catch (err) {
        failures++
        logEvery('error', 'recording webhook attempts failed', () => errorFields(err))
        // Unrecorded results are re-sent after the lease: keep trying while running, and while stopping
        // as long as a stop may take.
        const left = this.#stopping ? this.#stoppedAt + STOP_RECORD_WAIT_MS - performance.now() : Number.POSITIVE_INFINITY
        if (left <= 0) {
          log.error('stopped without recording webhook deliveries already sent: they are sent again once their lease runs out', {
            deliveries: batch.length + this.#results.length,
          })
          return
        }
        this.#results.unshift(...batch)
        await Bun.sleep(Math.min(5_000, 200 * 2 ** failures, left))
      }
    }
  }

  /** Clears the claims of deliveries cancelled before sending, so the next start sends them at once. */
  async #release(): Promise<void> {
    if (this.#released.length === 0) return
    try {
      await setClaims(this.#db, this.#released.splice(0), sql`NULL`)
    } catch (err) {
      // Their lease runs out instead: still sent once, only later.
      log.warn('could not hand back unsent webhook deliveries', errorFields(err))
    }
  }
}
