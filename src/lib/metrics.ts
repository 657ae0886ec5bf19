/**
 * The process's Prometheus registry: HTTP request series and counters of background work, kept in
 * plain maps: recording is a map lookup and a few additions, cheap enough for the /auth hot path.
 * HTTP labels are the route pattern, never the raw path, so the number of series stays bounded by the
 * number of routes.
 */

/** Upper bounds in seconds; the low end resolves the sub-millisecond requests this server mostly serves. */
export const DURATION_BUCKETS = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
] as const

interface Series {
  method: string
  route: string
  status: number
  count: number
  sum: number
  /** Per-bucket counts, not cumulative; the exposition adds them up. */
  buckets: number[]
}

/** A process-wide counter with one label, for work done outside HTTP requests. */
export class LabeledCounter {
  readonly #values = new Map<string, number>()

  constructor(
    readonly name: string,
    readonly help: string,
    readonly label: string,
  ) {}

  add(value: string, n: number): void {
    this.#values.set(value, (this.#values.get(value) ?? 0) + n)
  }

  render(processLabel: string): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`]
    for (const [value, n] of [...this.#values].sort(([a], [b]) => a.localeCompare(b))) {
      out.push(`${this.name}{${this.label}="${escape(value)}"${processLabel}} ${n}`)
    }
    return out
  }
}

export class Metrics {
  /** reason: refused (PostgreSQL refused its data), overflow (past the bound while it was unreachable), shutdown. */
  readonly validatedEventsDropped = new LabeledCounter(
    'license_validated_events_dropped_total',
    'license.validated events never written to the outbox, by reason.',
    'reason',
  )
  readonly #series = new Map<string, Series>()
  /**
   * `process="i"` when several server processes share the port: a scrape reaches one of them, and
   * each one's counters stay a series of their own instead of seeming to jump back and forth.
   */
  readonly #processLabel: string

  constructor(processIndex: number | null = null) {
    this.#processLabel = processIndex === null ? '' : `,process="${processIndex}"`
  }

  record(method: string, route: string, status: number, seconds: number): void {
    const id = `${method} ${status} ${route}`
    let s = this.#series.get(id)
    if (!s) {
      s = {
        method,
        route,
        status,
        count: 0,
        sum: 0,
        buckets: new Array(DURATION_BUCKETS.length).fill(0),
      }
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

  /** Prometheus text exposition format 0.0.4. */
  render(): string {
    const series = [...this.#series.values()].sort(
      (a, b) =>
        a.route.localeCompare(b.route) || a.method.localeCompare(b.method) || a.status - b.status,
    )
    const out: string[] = [
      '# HELP http_requests_total HTTP requests served, by method, route pattern and status.',
      '# TYPE http_requests_total counter',
    ]
    for (const s of series) out.push(`http_requests_total{${this.#labels(s)}} ${s.count}`)
    out.push(
      '# HELP http_request_duration_seconds Time from receiving a request to sending its response.',
      '# TYPE http_request_duration_seconds histogram',
    )
    for (const s of series) {
      const base = this.#labels(s)
      let cumulative = 0
      DURATION_BUCKETS.forEach((le, i) => {
        cumulative += s.buckets[i] ?? 0
        out.push(`http_request_duration_seconds_bucket{${base},le="${le}"} ${cumulative}`)
      })
      out.push(`http_request_duration_seconds_bucket{${base},le="+Inf"} ${s.count}`)
      out.push(`http_request_duration_seconds_sum{${base}} ${s.sum}`)
      out.push(`http_request_duration_seconds_count{${base}} ${s.count}`)
    }
    out.push(...this.validatedEventsDropped.render(this.#processLabel))
    return `${out.join('\n')}\n`
  }

  #labels(s: Series): string {
    return `method="${escape(s.method)}",route="${escape(s.route)}",status="${s.status}"${this.#processLabel}`
  }
}

function escape(value: string): string {
  return value.replaceAll('\\', '\\\\').replaceAll('"', '\\"').replaceAll('\n', '\\n')
}

/** Label for requests that matched no route: one series, whatever paths scanners try. */
