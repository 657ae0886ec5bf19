import type { Database } from '../db/client'
import type { EventBus } from './outbox'
import type { LabeledCounter } from '../lib/metrics'
import { log } from '../lib/log'
import { type DomainEvent, recordEvents } from './outbox'
import { errorCode } from '../db/errors'
import { classifyWriteError, writeIsolated } from '../db/isolated-write'
import { startTransaction, type TransactionMark, transactionStatus } from '../db/commit-outcome'

/**
 * How long a license.validated event waits in memory for others to join its INSERT. It fires on
 * every login, and per statement PostgreSQL pays a commit (WAL flush) and the statement's fixed
 * costs: at thousands of logins a second, one statement per 50 ms costs far less database CPU per
 * event than one per 5 ms. The price: a crash loses the events not yet written, those of the last
 * 50 ms and the batch being written meanwhile (no database change caused them, so there is no
 * transaction they could join).
 */
export const VALIDATED_BATCH_MS = 50

/**
 * Most events kept in memory while PostgreSQL is unreachable: about 10 s of 10,000 logins a second,
 * some 30 MB. Past it the oldest are dropped (counted, and one error line per outage).
 */
export const MAX_KEPT_EVENTS = 100_000
/** Most events per INSERT: a backlog after an outage goes in several statements of this size. */
const WRITE_CHUNK = 5_000
/** Back-off between attempts while the database is unreachable: doubling from the first to the last. */
const RETRY_FIRST_MS = 100
const RETRY_MAX_MS = 2_000

/** A write whose COMMIT's answer was lost: its transaction, its rows' ids, its events. */
interface UnsureWrite {
  mark: TransactionMark
  ids: number[]
  events: DomainEvent[]
}

export interface ValidatedEventBatchOptions {
  /** Writes one batch; recordEvents in a transaction whose outcome can be asked for (see #unsure), unless a test replaces it. */
  write?: (list: readonly DomainEvent[]) => Promise<void>
  maxKept?: number
}

/**
 * license.validated fires on every login: written in batches (one INSERT per VALIDATED_BATCH_MS,
 * one write at a time) instead of one transaction per request. An event PostgreSQL refuses is split
 * off and dropped alone (writeIsolated); while the database is unreachable the events wait here,
 * up to maxKept, and are retried with back-off until it answers. A write whose COMMIT's answer was lost
 * (the connection dropped with it on its way) is not simply written again: its rows are looked for
 * first, so events it did commit are not recorded, and delivered, twice.
 */
export class ValidatedEventBatch {
  /** Oldest first: the events of the current wait, behind any an outage kept. */
  #pending: DomainEvent[] = []
  #timer: ReturnType<typeof setTimeout> | null = null
  #retry: ReturnType<typeof setTimeout> | null = null
  #writing: Promise<void> | null = null
  #failures = 0
  #overflowReported = false
  /**
   * Writes that failed as an outage after their rows were inserted: each may have committed all the
   * same. Their events wait here, apart, and go back to be written only once PostgreSQL shows that
   * transaction did not commit; meanwhile later events are written as ever.
   */
  #unsure: UnsureWrite[] = []
  /** The next look at the unsure writes, while one is still undecided and nothing else would look. */
  #recheck: ReturnType<typeof setTimeout> | null = null
  /** While one is undecided they are asked about every RETRY_MAX_MS, not at every batch; 0: at the next. */
  #settleAfter = 0
  readonly #write: (list: readonly DomainEvent[]) => Promise<void>
  readonly #maxKept: number

  constructor(
    private readonly sink: { database: Database; bus: EventBus; dropped: LabeledCounter },
    options: ValidatedEventBatchOptions = {},
  ) {
    this.#write = options.write ?? ((list) => this.#writeTracked(list))
    this.#maxKept = options.maxKept ?? MAX_KEPT_EVENTS
  }

  add(event: DomainEvent): void {
    this.#pending.push(event)
    this.#timer ??= setTimeout(this.#due, VALIDATED_BATCH_MS)
  }

  /** Events not yet written (waiting for the batch or for the database). */
  get kept(): number {
    return this.#pending.length + this.#unsureCount()
  }

  #unsureCount(): number {
    return this.#unsure.reduce((n, write) => n + write.events.length, 0)
  }

  /** Writes what is pending now, at once even while backing off (tests and shutdown). */
  async flush(): Promise<void> {
    this.#clearTimers()
    this.#settleAfter = 0
    // The write under way took only what was pending when it began.
    await this.#writing
    await this.#drain()
  }

  /** Flushes, then gives up on what the database did not take: one error line with the count. */
  async stop(): Promise<void> {
    await this.flush()
    this.#clearTimers()
    const unsure = this.#unsureCount()
    this.#unsure = []
    if (unsure > 0) {
      this.sink.dropped.add('shutdown', unsure)
      log.error('license.validated events of a write whose answer was lost, its outcome still unknown at shutdown: they may be lost', { events: unsure })
    }
    const lost = this.#pending.length
    if (lost === 0) return
    this.#pending = []
    this.sink.dropped.add('shutdown', lost)
    log.error('database unavailable at shutdown: license.validated events lost', { events: lost })
  }

  #clearTimers(): void {
    for (const timer of [this.#timer, this.#retry, this.#recheck]) if (timer) clearTimeout(timer)
    this.#timer = null
    this.#retry = null
    this.#recheck = null
  }

  readonly #due = (): void => {
    this.#timer = null
    this.#trim()
    // While backing off, the retry writes what piled up.
    if (this.#retry === null) void this.#drain()
  }

  #drain(): Promise<void> {
    this.#writing ??= this.#writeDue().finally(() => {
      this.#writing = null
      // Events added during the write found its batch wait already over: they start their own.
      if (this.#pending.length > 0 && this.#retry === null) this.#timer ??= setTimeout(this.#due, VALIDATED_BATCH_MS)
    })
    return this.#writing
  }

  async #writeTracked(list: readonly DomainEvent[]): Promise<void> {
    const written: { mark?: TransactionMark; ids?: number[] } = {}
    try {
      await this.sink.database.db.transaction(async (tx) => {
        written.mark = await startTransaction(tx)
        written.ids = await recordEvents(tx, list)
      })
    } catch (err) {
      // Only a COMMIT leaves the outcome open: without the INSERT's answer, none was sent.
      const { mark, ids } = written
      if (mark !== undefined && ids !== undefined && classifyWriteError(err) === 'outage') this.#unsure.push({ mark, ids, events: [...list] })
      throw err
    }
  }

  /**
   * Settles the unsure writes PostgreSQL can tell about: the events of one whose rows are there are done,
   * those of one whose rows are not go back to be written, in front. Found by their ids, not by the
   * transaction's id alone: PostgreSQL gives an id that never reached its log out again after a crash
   * or a failover, and asked later it answered for another transaction. One whose transaction is still
   * open (on a backend that has not noticed its connection is gone) stays, as all do while the
   * database cannot be asked. True while one is left.
   */
  #settleUnsure(): Promise<boolean> {
    // The questions' connection bounds them (Database.aside): one the events table's lock or a server
    // that stopped answering would hold holds the writer a few seconds, and fails as unreachable (a
    // connection that does not open too: the writes stay unsure).
    return this.sink.database.aside(async (ask) => {
      const present = async (write: UnsureWrite) =>
        (await ask('SELECT EXISTS (SELECT 1 FROM events WHERE id = $1) AS found', [write.ids[0]]))[0]?.found === true
      for (const write of [...this.#unsure]) {
        let found: boolean
        let status: Awaited<ReturnType<typeof transactionStatus>>
        try {
          found = await present(write)
          status = found ? 'committed' : await transactionStatus(ask, write.mark)
          // Committed between the two questions (a COMMIT still finishing on a backend whose client is
          // gone): its rows are there now. Still missing, the id was another transaction's.
          if (!found && status === 'committed') found = await present(write)
        } catch {
          // Unreachable: the write below meets the outage too, and backs off.
          return true
        }
        if (status === 'in progress') continue
        this.#unsure.splice(this.#unsure.indexOf(write), 1)
        if (found) this.sink.bus.notify()
        else this.#pending = write.events.concat(this.#pending)
      }
      return this.#unsure.length > 0
    }).catch(() => true)
  }

  async #writeDue(): Promise<void> {
    // A duration (performance.now()): a wall clock stepped back would hold the settling back by the step.
    if (this.#unsure.length > 0 && performance.now() >= this.#settleAfter) {
      const undecided = await this.#settleUnsure()
      this.#settleAfter = undecided ? performance.now() + RETRY_MAX_MS : 0
      if (undecided) this.#recheckLater()
    }
    // Later events wait for their own batch: writing them now would mean more, smaller statements.
    let due = this.#pending.length
    while (due > 0 && this.#pending.length > 0) {
      const chunk = this.#pending.splice(0, Math.min(due, WRITE_CHUNK))
      due -= chunk.length
      const result = await writeIsolated(chunk, this.#write, 'outage')
      const { refused, outage } = result
      // The events of a write whose answer was lost wait apart, in #unsure.
      const apart = this.#unsure.length > 0 ? new Set(this.#unsure.flatMap((write) => write.events)) : null
      const unwritten = apart ? result.unwritten.filter((e) => !apart.has(e)) : result.unwritten
      if (refused.length > 0) {
        this.sink.dropped.add('refused', refused.length)
        log.warn('license.validated events refused by the database, dropped', {
          events: refused.length,
          code: errorCode(refused[0]?.error),
        })
      }
      if (refused.length + result.unwritten.length < chunk.length) this.sink.bus.notify()
      if (result.unwritten.length > 0) {
        this.#pending = unwritten.concat(this.#pending)
        this.#trim()
        this.#backOff(outage)
        return
      }
      if (this.#failures > 0) {
        log.info('database reachable again: writing kept license.validated events', { attempts: this.#failures })
        this.#failures = 0
        this.#overflowReported = false
      }
    }
  }

  #recheckLater(): void {
    if (this.#recheck) return
    this.#recheck = setTimeout(() => {
      this.#recheck = null
      void this.#drain()
    }, RETRY_MAX_MS)
    this.#recheck.unref?.()
  }

  #backOff(outage: unknown): void {
    if (this.#failures === 0) {
      log.warn('database unavailable: keeping license.validated events in memory and retrying', { code: errorCode(outage) })
    }
    const delay = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** this.#failures)
    this.#failures++
    if (this.#retry) clearTimeout(this.#retry)
    this.#retry = setTimeout(() => {
      this.#retry = null
      void this.#drain()
    }, delay)
    // Kept events never hold a process open: stop() reports them lost instead.
    this.#retry.unref?.()
  }

  /**
   * Drops the oldest events beyond the bound, the unsure writes' counted (a link that keeps cutting
   * writes off could pile them up): whole unsure writes first, the oldest and perhaps recorded already,
   * then kept events, oldest first. Runs once per batch wait, not per event.
   */
  #trim(): void {
    const excess = this.#pending.length + this.#unsureCount() - this.#maxKept
    if (excess <= 0) return
    let dropped = 0
    while (dropped < excess && this.#unsure.length > 0) dropped += this.#unsure.shift()!.events.length
    const kept = Math.max(0, Math.min(excess - dropped, this.#pending.length))
    this.#pending.splice(0, kept)
    dropped += kept
    this.sink.dropped.add('overflow', dropped)
    if (this.#overflowReported) return
    this.#overflowReported = true
    log.error('database unavailable: license.validated events beyond the in-memory bound dropped, oldest first', {
      bound: this.#maxKept,
    })
  }
}
