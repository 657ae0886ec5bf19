import { errorFields, logEvery } from '../../lib/log'
import type { HostLoad } from './host-load'

/** Gap between passes while a backlog drains (wake-ups from commits use minGapMs). */
const BACKLOG_GAP_MS = 5

/** What the schedule runs: the dispatcher's fan-out and claim. */
export interface Work {
  /** A commit wrote events. */
  committed(): void
  /** The poll came round. */
  polled(): void
  /** One pass; resolves whether more is waiting. */
  pass(): Promise<boolean>
  /** Whether a pass now would have room to take what is waiting. */
  ready(): boolean
}

export interface ScheduleOptions {
  pollMs: number
  minGapMs: number
  /** Null: never give way to API requests. */
  load: Pick<HostLoad, 'saturated'> | null
  /** Calls the listener after every commit that wrote events; returns the unsubscribe. */
  onCommit(listener: () => void): () => void
}

/**
 * When passes run: on every commit's wake-up and every poll, at most one at a time and spaced
 * (minGapMs, or BACKLOG_GAP_MS while a backlog drains); wake-ups during a pass are served by one more.
 * While API requests are short of CPU only the poll's passes run: the events wait undispatched in
 * PostgreSQL, costing it one row each, and are sent once the load drops.
 */
export class Schedule {
  readonly #options: ScheduleOptions
  readonly #work: Work
  #running = false
  #unsubscribe: (() => void) | null = null
  #poll: ReturnType<typeof setInterval> | null = null
  #delayed: ReturnType<typeof setTimeout> | null = null
  #pumping: Promise<void> | null = null
  /** A wake-up came in during the pass. */
  #again = false
  /** The last pass left work waiting. */
  #backlog = false
  /** The next pass was asked for by the poll: it runs even while the host is saturated. */
  #pollPass = true
  #lastPass = 0

  constructor(options: ScheduleOptions, work: Work) {
    this.#options = options
    this.#work = work
  }

  get running(): boolean {
    return this.#running
  }

  start(): void {
    if (this.#running) return
    this.#running = true
    this.#unsubscribe = this.#options.onCommit(() => {
      this.#work.committed()
      this.kick()
    })
    this.#poll = setInterval(() => {
      this.#work.polled()
      this.#pollPass = true
      this.kick()
    }, this.#options.pollMs)
    this.#poll.unref?.()
    this.kick()
  }

  /** Stops the timers and wake-ups at once; resolves when the pass under way is over. */
  stop(): Promise<void> {
    this.#running = false
    this.#unsubscribe?.()
    if (this.#poll) clearInterval(this.#poll)
    if (this.#delayed) clearTimeout(this.#delayed)
    return this.#pumping ?? Promise.resolve()
  }

  /** Runs a pass now, or as soon as the gap since the last one allows. */
  kick(): void {
    if (!this.#running) return
    if (this.#pumping) {
      this.#again = true
      return
    }
    if (this.#delayed) return
    const wait = this.#lastPass + (this.#backlog ? BACKLOG_GAP_MS : this.#options.minGapMs) - performance.now()
    if (wait > 0) {
      this.#delayed = setTimeout(() => {
        this.#delayed = null
        this.kick()
      }, wait)
      return
    }
    this.#lastPass = performance.now()
    this.#pumping = this.#pump().finally(() => {
      this.#pumping = null
      // Wake-ups that came in during the pass are served by one more (spaced) pass.
      if (this.#again || (this.#backlog && this.#work.ready())) this.kick()
    })
  }

  async #pump(): Promise<void> {
    this.#again = false
    const polled = this.#pollPass
    this.#pollPass = false
    if (!polled && this.#options.load?.saturated()) {
      // Giving way to API requests: the poll's next pass claims what is due (see yieldAbove).
      this.#backlog = false
      return
    }
    try {
      this.#backlog = await this.#work.pass()
    } catch (err) {
      // The poll asks again (a claim cleared before its failed statement included).
      this.#backlog = false
      logEvery('error', 'webhook dispatch failed; retrying on the next poll', () => errorFields(err))
    }
  }
}
