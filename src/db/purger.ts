import type { SQL } from 'drizzle-orm'
import { errorFields, log } from '../lib/log'
import { rowsOf } from '../delivery/prepared'
import type { Db } from './client'

const PURGE_EVERY_MS = 10 * 60_000
/** The wait before the next purge when one stopped at its most batches with rows left to look at. */
const PURGE_AGAIN_MS = 1_000
const PURGE_BATCH = 5_000
const PURGE_MAX_BATCHES = 100

/** Rows that have outlived their use, deleted a batch at a time. */
export interface PurgeJob {
  /** What goes, for the log line of a failed purge. */
  what: string
  /**
   * One statement deleting at most `limit` rows, looking on from `after` (the `next` of the batch
   * before; null at first), which answers their number as `n` and, as `next`, where the batch after it
   * looks on from: null when nothing is left to look at. A job that looks at deletable rows alone needs
   * no position: its `next` is any text while it deleted a full batch.
   */
  batch(limit: number, after: string | null): SQL
}

/**
 * Runs a PurgeJob at start and every ten minutes, one purge at a time, batch after batch while the job
 * has rows left to look at (up to 100 batches of 5,000 a purge; then the next purge goes on from there
 * a second later, so a backlog is worked through however large). Purges of several instances may overlap: each
 * batch is one statement, so they only delete what the other left.
 */
export class Purger {
  #timer: ReturnType<typeof setInterval> | null = null
  #again: ReturnType<typeof setTimeout> | null = null
  #purging: Promise<void> | null = null
  /** Where the next batch looks on from: kept between purges, so rows that must stay are passed once. */
  #after: string | null = null
  /** Set by stop(): a purge under way ends after its current batch. */
  #stopped = false

  constructor(
    private readonly db: Db,
    private readonly job: PurgeJob,
    private readonly limits = { rows: PURGE_BATCH, batches: PURGE_MAX_BATCHES, againMs: PURGE_AGAIN_MS },
  ) {}

  start(): void {
    this.#stopped = false
    this.#timer = setInterval(() => this.purge(), PURGE_EVERY_MS)
    this.#timer.unref?.()
    this.purge()
  }

  /** Stops the timers at once; the purge under way ends after its current batch. */
  stop(): Promise<void> {
    this.#stopped = true
    if (this.#timer) clearInterval(this.#timer)
    if (this.#again) clearTimeout(this.#again)
    return this.#purging ?? Promise.resolve()
  }

  /** Starts a purge unless one runs; resolves when it is over (it never rejects). */
  purge(): Promise<void> {
    this.#purging ??= this.#run().finally(() => {
      this.#purging = null
    })
    return this.#purging
  }

  async #run(): Promise<void> {
    try {
      for (let batch = 0; batch < this.limits.batches; batch++) {
        if (this.#stopped) return
        const next = rowsOf(await this.db.execute(this.job.batch(this.limits.rows, this.#after)))[0]?.next
        this.#after = next === null || next === undefined ? null : String(next)
        if (this.#after === null) return
      }
      if (this.#stopped) return
      this.#again = setTimeout(() => this.purge(), this.limits.againMs)
      this.#again.unref?.()
    } catch (err) {
      log.warn(`purging ${this.job.what} failed`, errorFields(err))
    }
  }
}
