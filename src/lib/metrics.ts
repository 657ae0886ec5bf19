/**
 * The process's Prometheus registry, kept in plain maps: recording is a map lookup and a few additions,
 * cheap enough for the /auth hot path. A scrape collects families (name, help, type, samples), which
 * several server processes merge into one exposition (see http/scrape.ts). HTTP labels are the route
 * pattern, never the raw path, so the number of series stays bounded by the number of routes.
 */
import { PublicError } from './errors'

/** Upper bounds in seconds; the low end resolves the sub-millisecond requests this server mostly serves. */
export const DURATION_BUCKETS = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
] as const

/** One line of a family: the metric name (a histogram's carries its suffix), its labels rendered, its value. */
export type Sample = [name: string, labels: string, value: number]

/** A metric family as collected, plain data: it crosses from one server process to another as it is. */
export interface Family {
  name: string
  help: string
  type: 'counter' | 'gauge' | 'histogram'
  samples: Sample[]
}

export const escapeLabel = (value: string): string =>
  value.replaceAll('\\', '\\\\').replaceAll('"', '\\"').replaceAll('\n', '\\n')

/** Adds a label to rendered labels ('' for none). */
export const withLabel = (labels: string, label: string): string => (labels ? `${labels},${label}` : label)

/** A counter with one label. */
export class LabeledCounter {
  readonly #values = new Map<string, number>()

  constructor(
    readonly name: string,
    readonly help: string,
    readonly label: string,
  ) {}

  add(value: string, n = 1): void {
    this.#values.set(value, (this.#values.get(value) ?? 0) + n)
  }

  addAll(counts: Record<string, number>): void {
    for (const [value, n] of Object.entries(counts)) this.add(value, n)
  }

  /** The count of one label value (tests and the scrape read it). */
  value(value: string): number {
    return this.#values.get(value) ?? 0
  }

  collect(): Family {
    const samples: Sample[] = [...this.#values]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([value, n]) => [this.name, `${this.label}="${escapeLabel(value)}"`, n])
    return { name: this.name, help: this.help, type: 'counter', samples }
  }
}

/** Counts how a client request ends: `success`, or the public error code it answers with. */
export async function countResult<T>(counter: LabeledCounter, work: Promise<T>): Promise<T> {
  try {
    const result = await work
    counter.add('success')
    return result
  } catch (err) {
    counter.add(err instanceof PublicError ? err.code : 'system_error')
    throw err
  }
}

interface Series {
  labels: string
  /** The status class too: what an error-rate alert sums over. */
  counterLabels: string
  count: number
  sum: number
  /** Per-bucket counts, not cumulative; the exposition adds them up. */
  buckets: number[]
}

const statusClass = (status: number) => `${Math.floor(status / 100)}xx`

/** http_requests_total (by method, route pattern, status and its class) and http_request_duration_seconds (the class aside). */
export class HttpMetrics {
  readonly #series = new Map<string, Series>()

  record(method: string, route: string, status: number, seconds: number): void {
    const id = `${method} ${status} ${route}`
    let s = this.#series.get(id)
    if (!s) {
      const labels = `method="${escapeLabel(method)}",route="${escapeLabel(route)}",status="${status}"`
      const counterLabels = `${labels},class="${statusClass(status)}"`
      s = { labels, counterLabels, count: 0, sum: 0, buckets: new Array(DURATION_BUCKETS.length).fill(0) }
      this.#series.set(id, s)
    }
    s.count++
    s.sum += seconds
    for (let i = 0; i < DURATION_BUCKETS.length; i++) {
      if (seconds <= (DURATION_BUCKETS[i] as number)) {
        s.buckets[i] = (s.buckets[i] ?? 0) + 1
        break
      }
    }
  }

  collect(): Family[] {
    const series = [...this.#series.values()].sort((a, b) => a.labels.localeCompare(b.labels))
    const histogram: Sample[] = []
    for (const s of series) {
      let cumulative = 0
      DURATION_BUCKETS.forEach((le, i) => {
        cumulative += s.buckets[i] ?? 0
        histogram.push(['http_request_duration_seconds_bucket', `${s.labels},le="${le}"`, cumulative])
      })
      histogram.push(['http_request_duration_seconds_bucket', `${s.labels},le="+Inf"`, s.count])
      histogram.push(['http_request_duration_seconds_sum', s.labels, s.sum])
      histogram.push(['http_request_duration_seconds_count', s.labels, s.count])
    }
    return [
      {
        name: 'http_requests_total',
        help: 'HTTP requests served, by method, route pattern, status and status class.',
        type: 'counter',
        samples: series.map((s) => ['http_requests_total', s.counterLabels, s.count]),
      },
      {
        name: 'http_request_duration_seconds',
        help: 'Time from receiving a request to sending its response.',
        type: 'histogram',
        samples: histogram,
      },
    ]
  }
}

/**
 * Failures talking to Redis and to the database, per process: the store and the database are opened
 * below any context (and in the CLI), so these two live at module level rather than in Metrics.
 */
export const storeErrors = new LabeledCounter(
  'store_errors_total',
  'Redis operations that failed (connection errors and failed commands), by kind.',
  'kind',
)
export const databaseErrors = new LabeledCounter(
  'database_errors_total',
  'Database failures the server met, by SQLSTATE class or driver code (08: connection, 40: rollback, 23: constraint, …).',
  'code',
)

/** The counters of one server process (one context), collected with the process's own figures at each scrape. */
export class Metrics {
  readonly http = new HttpMetrics()
  /** reason: refused (PostgreSQL refused its data), overflow (past the bound while it was unreachable), shutdown. */
  readonly validatedEventsDropped = new LabeledCounter(
    'license_validated_events_dropped_total',
    'license.validated events never written to the outbox, by reason.',
    'reason',
  )
  readonly validations = new LabeledCounter(
    'license_validations_total',
    'POST /auth/validate requests that reached the service, by result: success or the error code answered.',
    'result',
  )
  readonly heartbeats = new LabeledCounter(
    'license_heartbeats_total',
    'POST /auth/heartbeat requests that reached the service, by result: success or the error code answered.',
    'result',
  )
  readonly selfbans = new LabeledCounter(
    'license_selfbans_total',
    'POST /auth/selfban requests that reached the service, by result: success or the error code answered.',
    'result',
  )
  readonly seatBinds = new LabeledCounter(
    'license_seat_binds_total',
    'New HWIDs a validate asked to bind to a seat, by result: bound, refused (no free seat, or the license changed meanwhile) or failed.',
    'result',
  )
  readonly webhookDeliveries = new LabeledCounter(
    'webhook_deliveries_total',
    'Webhook delivery attempts recorded, by outcome: success (2xx), http_error (another status), no_response (timeout, refused, blocked target) or skipped (webhook disabled meanwhile).',
    'outcome',
  )

  collect(): Family[] {
    return [
      ...this.http.collect(),
      this.validations.collect(),
      this.heartbeats.collect(),
      this.selfbans.collect(),
      this.seatBinds.collect(),
      this.webhookDeliveries.collect(),
      this.validatedEventsDropped.collect(),
      storeErrors.collect(),
      databaseErrors.collect(),
    ]
  }
}

/** Prometheus text exposition format 0.0.4; families of the same name (from several processes) are merged. */
export function render(families: readonly Family[]): string {
  const merged = new Map<string, Family>()
  for (const f of families) {
    const known = merged.get(f.name)
    if (known) known.samples.push(...f.samples)
    else merged.set(f.name, { ...f, samples: [...f.samples] })
  }
  const out: string[] = []
  for (const f of merged.values()) {
    out.push(`# HELP ${f.name} ${f.help}`, `# TYPE ${f.name} ${f.type}`)
    for (const [name, labels, value] of f.samples) out.push(`${name}${labels ? `{${labels}}` : ''} ${value}`)
  }
  return `${out.join('\n')}\n`
}

/** The families with `label` added to every sample: each server process's series stay its own. */
export const labelled = (families: readonly Family[], label: string): Family[] =>
  families.map((f) => ({ ...f, samples: f.samples.map(([name, labels, value]) => [name, withLabel(labels, label), value]) }))
