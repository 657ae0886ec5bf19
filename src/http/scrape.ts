import { sql } from 'drizzle-orm'
import type { Context } from '../context'
import { countDatabaseError } from '../db/errors'
import { rowsOf } from '../delivery/prepared'
import { errorFields, log } from '../lib/log'
import { type Family, labelled, render } from '../lib/metrics'
import { processFamilies } from '../lib/process-metrics'
import { SingleFlight } from '../lib/single-flight'
import { Deadline, withTimeout } from '../lib/with-timeout'

/**
 * A scrape across server processes, over the IPC channel each process has with the first:
 * - collect / collected: the first asks another for its own families, which it answers;
 * - scrape / scraped: another process that a scrape reached asks the first for the whole server's.
 */
export type ScrapeMessage =
  | { type: 'metrics:collect'; id: number }
  | { type: 'metrics:collected'; id: number; families: Family[] }
  | { type: 'metrics:scrape'; id: number }
  | { type: 'metrics:scraped'; id: number; families: Family[] }

const isScrapeMessage = (m: unknown): m is ScrapeMessage =>
  typeof m === 'object' && m !== null && typeof (m as { type?: unknown }).type === 'string' && (m as { type: string }).type.startsWith('metrics:')

/** How long a scrape waits for another process; one that does not answer is left out and counted missing. */
export const PROCESS_ANSWER_MS = 2000

/** How long one backlog count answers every scrape: /metrics is anonymous where METRICS_PORT is unset. */
export const BACKLOG_CACHE_MS = 1000

/** A scrape waits this long for the backlog count, then answers without it: a hung database must not hang it. */
export const BACKLOG_TIMEOUT_MS = 1000

/** Counting stops here: a backlog this deep is an incident whatever its exact size, and the count stays cheap. */
export const BACKLOG_COUNT_CAP = 100_000

/** The first process's view of the others (server-processes.ts's OtherServerProcesses). */
export interface OtherProcesses {
  indexes(): number[]
  /** False when that process is not running or its channel closed: never throws. */
  send(index: number, message: unknown): boolean
}

/** Where this process stands: alone, first of several, or one the first started (with its channel to it). */
export type ProcessRole =
  | { kind: 'single' }
  | { kind: 'first' }
  | { kind: 'other'; index: number; toFirst: (message: unknown) => boolean }

const gauge = (name: string, help: string, value: number, labels = ''): Family => ({
  name,
  help,
  type: 'gauge',
  samples: [[name, labels, value]],
})

/**
 * The /metrics exposition of the whole server. Every process's own series carry `process="i"` when
 * several share the port, so a scrape that any one of them answers describes all of them, each
 * counter monotonic on its own; server-wide figures (the outbox backlog) appear once, unlabelled.
 */
export class ServerMetrics {
  readonly #ctx: Context
  readonly #role: ProcessRole
  #others: OtherProcesses | null = null
  readonly #waiting = new Map<number, (families: Family[]) => void>()
  #seq = 0
  // One backlog count at a time, its answer kept BACKLOG_CACHE_MS; one gathering for concurrent scrapes.
  readonly #flights = new SingleFlight<Family[]>()
  #backlogAnswer: Promise<Family[]> | null = null
  #backlogAt = 0
  #backlogTimeouts = 0

  constructor(ctx: Context, role: ProcessRole) {
    this.#ctx = ctx
    this.#role = role
  }

  /** The first process: the others, once started (a scrape before then describes the first alone). */
  attach(others: OtherProcesses): void {
    this.#others = others
  }

  /** A message from another process: from process `from` in the first, from the first in the others. */
  receive(message: unknown, from = 0): void {
    if (!isScrapeMessage(message)) return
    switch (message.type) {
      case 'metrics:collect':
        return this.#reply({ type: 'metrics:collected', id: message.id, families: this.#own() })
      case 'metrics:scrape':
        // Never rejects into main.ts's unhandledRejection (which exits): the asker falls back to its own figures.
        this.#server()
          .then((families) => this.#others?.send(from, { type: 'metrics:scraped', id: message.id, families }))
          .catch((err: unknown) => log.error('metrics scrape for another server process failed', errorFields(err)))
        return
      case 'metrics:collected':
      case 'metrics:scraped':
        this.#waiting.get(message.id)?.(message.families)
    }
  }

  /** Prometheus text for the whole server. */
  async exposition(): Promise<string> {
    const role = this.#role
    if (role.kind !== 'other') return render(await this.#server())
    const ask = (id: number) => role.toFirst({ type: 'metrics:scrape', id })
    // The first waits PROCESS_ANSWER_MS for the others: this one waits for that, and then some.
    const families = await this.#ask(ask, PROCESS_ANSWER_MS * 2)
    // The first process is gone or stuck (this one is shutting down then): its own figures beat none.
    return render(families ?? this.#own())
  }

  #reply(message: ScrapeMessage): void {
    if (this.#role.kind === 'other') this.#role.toFirst(message)
  }

  /** What the process `send` asks answers, or null after `ms` (at once when `send` could not send). */
  #ask(send: (id: number) => boolean, ms: number): Promise<Family[] | null> {
    const id = ++this.#seq
    return new Promise((resolve) => {
      const deadline = new Deadline(() => done(null), ms)
      const done = (families: Family[] | null) => {
        deadline.clear()
        this.#waiting.delete(id)
        resolve(families)
      }
      this.#waiting.set(id, done)
      if (!send(id)) done(null)
    })
  }

  /** This process's series: the context's counters, the process's figures and its credit flush lag. */
  #own(): Family[] {
    const families = [
      ...this.#ctx.metrics.collect(),
      ...processFamilies(),
      gauge(
        'credit_flush_lag_seconds',
        "Seconds since this process's reconciler last moved every pending credit charge from the store into PostgreSQL.",
        this.#ctx.credits.flushLagSeconds(),
      ),
    ]
    if (this.#role.kind === 'single') return families
    return labelled(families, `process="${this.#role.kind === 'first' ? 0 : this.#role.index}"`)
  }

  /** Every process's series (the others' asked in parallel) and the server-wide ones; concurrent scrapes share one. */
  #server(): Promise<Family[]> {
    return this.#flights.run('gather', () => this.#gather())
  }

  async #gather(): Promise<Family[]> {
    const others = this.#others
    const indexes = others?.indexes() ?? []
    const [answers, backlog] = await Promise.all([
      Promise.all(
        indexes.map((index) =>
          this.#ask((id) => others?.send(index, { type: 'metrics:collect', id }) ?? false, PROCESS_ANSWER_MS),
        ),
      ),
      this.#backlog(),
    ])
    const families = [...this.#own(), ...backlog]
    let missing = 0
    for (const answer of answers) {
      if (answer) families.push(...answer)
      else missing++
    }
    if (this.#role.kind === 'first') {
      families.push(gauge('server_processes_missing', 'Server processes that did not answer this scrape in time.', missing))
    }
    return families
  }

  /**
   * The backlog and how often counting it timed out. A count that outlives its scrape's wait is not
   * started again while it runs, so a hung database holds one pool connection, not one per scrape.
   */
  #backlog(): Promise<Family[]> {
    const now = performance.now()
    if (this.#backlogAnswer === null || now - this.#backlogAt >= BACKLOG_CACHE_MS) {
      this.#backlogAt = now
      const counting = this.#flights.run('backlog', () => this.#countBacklog())
      this.#backlogAnswer = withTimeout(counting, BACKLOG_TIMEOUT_MS).then((families) => {
        if (families !== null) return families
        this.#backlogTimeouts++
        return []
      })
    }
    return this.#backlogAnswer.then((families) => [
      ...families,
      {
        name: 'webhook_backlog_count_timeouts_total',
        help: `Backlog counts that took over ${BACKLOG_TIMEOUT_MS} ms: the scrapes of the next ${BACKLOG_CACHE_MS} ms answered without webhook_backlog.`,
        type: 'counter',
        samples: [['webhook_backlog_count_timeouts_total', '', this.#backlogTimeouts]],
      },
    ])
  }

  /** The outbox backlog, counted up to BACKLOG_COUNT_CAP on the partial indexes of pending rows. */
  async #countBacklog(): Promise<Family[]> {
    try {
      const result = await this.#ctx.database.db.execute(sql`
        SELECT
          (SELECT count(*) FROM (SELECT 1 FROM events WHERE dispatched_at IS NULL LIMIT ${BACKLOG_COUNT_CAP}) e)::int AS events,
          (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE attempted_at IS NULL LIMIT ${BACKLOG_COUNT_CAP}) d)::int AS deliveries`)
      const row = rowsOf(result)[0] ?? {}
      const name = 'webhook_backlog'
      return [
        {
          name,
          help: `Outbox rows waiting (counted up to ${BACKLOG_COUNT_CAP}): events not yet fanned out to their webhooks, deliveries not yet attempted.`,
          type: 'gauge',
          samples: [
            [name, 'stage="undispatched_events"', Number(row.events)],
            [name, 'stage="unattempted_deliveries"', Number(row.deliveries)],
          ],
        },
      ]
    } catch (err) {
      // The database is down: the scrape still answers, with database_errors_total saying why.
      countDatabaseError(err)
      return []
    }
  }
}
