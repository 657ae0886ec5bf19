import { readFileSync } from 'node:fs'

/**
 * Whether the host's CPUs are saturated by work that is not background work, read from Linux's
 * /proc/stat: the share of all CPU time spent in user, system, interrupt and steal time since the
 * previous reading. Time of niced threads (the delivery threads themselves, at nice 19) and idle time
 * do not count. Readings are at least `intervalMs` apart; between them the last answer stands.
 * Where /proc/stat cannot be read the host is never saturated.
 */
export class HostLoad {
  readonly #threshold: number
  readonly #intervalMs: number
  /** Reads the counters: /proc/stat, or a test's own. */
  readonly #read: () => CpuTimes | null
  #last: { busy: number; total: number; at: number } | null = null
  #saturated = false

  /**
   * `threshold`: the busy share (0–1) from which the host counts as saturated. The first reading is
   * taken now, so the first answer after `intervalMs` already covers a real interval.
   */
  constructor(threshold: number, intervalMs = 250, read: () => CpuTimes | null = readCpuTimes) {
    this.#threshold = threshold
    this.#intervalMs = intervalMs
    this.#read = read
    const sample = read()
    if (sample) this.#last = { ...sample, at: performance.now() }
  }

  saturated(): boolean {
    const at = performance.now()
    if (this.#last && at - this.#last.at < this.#intervalMs) return this.#saturated
    const sample = this.#read()
    if (!sample) return false
    if (this.#last && sample.total > this.#last.total) {
      this.#saturated = (sample.busy - this.#last.busy) / (sample.total - this.#last.total) >= this.#threshold
    }
    this.#last = { ...sample, at }
    return this.#saturated
  }
}

/** Cumulative CPU time of all CPUs: not niced nor idle (`busy`), and everything (`total`). */
export interface CpuTimes {
  busy: number
  total: number
}

function readCpuTimes(): CpuTimes | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').slice(0, 256).split('\n', 1)[0] ?? ''
    // cpu  user nice system idle iowait irq softirq steal …
    const [user, nice, system, idle, iowait, irq, softirq, steal] = line.trim().split(/\s+/).slice(1, 9).map(Number)
    if (steal === undefined || [user, nice, system, idle, iowait, irq, softirq, steal].some((n) => !Number.isFinite(n))) return null
    const busy = user! + system! + irq! + softirq! + steal
    return { busy, total: busy + nice! + idle! + iowait! }
  } catch {
    return null
  }
}
