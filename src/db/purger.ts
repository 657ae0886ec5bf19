import type { SQL } from 'drizzle-orm'
import { errorFields, log } from '../lib/log'
import { rowsOf } from '../delivery/prepared'
import type { Db } from './client'

const PURGE_EVERY_MS = 10 * 60_000
const PURGE_BATCH = 5_000
const PURGE_MAX_BATCHES = 100

/** Rows that have outlived their use, deleted a batch at a time. */
export interface PurgeJob {
  /** What goes, for the log line of a failed purge. */
  what: string
  /** One statement deleting at most `limit` rows, which answers their number as `n`. */
  batch(limit: number): SQL
}

/**
 * Runs a PurgeJob at start and every ten minutes, one purge at a time, batch after batch while they
 * come back full (up to 100 a purge). Purges of several instances may overlap: each batch is one
 * statement, so they only delete what the other left.
 */
export class Purger {
  #timer: ReturnType<typeof setInterval> | null = null
  #purging: Promise<void> | null = null
  /** Set by stop(): a purge under way ends after its current batch. */
  #stopped = false

  constructor(
    private readonly db: Db,
    private readonly job: PurgeJob,
  ) {}

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

  async #run(): Promise<void> {
    try {
      for (let batch = 0; batch < PURGE_MAX_BATCHES && !this.#stopped; batch++) {
        const result = await this.db.execute(this.job.batch(PURGE_BATCH))
        if (Number(rowsOf(result)[0]?.n ?? 0) < PURGE_BATCH) break
      }
    } catch (err) {
      log.warn(`purging ${this.job.what} failed`, errorFields(err))
    }
  }
}
