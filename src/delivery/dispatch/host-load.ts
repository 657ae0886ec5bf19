import { readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'

/**
 * Whether API requests are short of CPU, read from Linux's /proc: the host's CPUs are busy (the share
 * of all CPU time spent in user, system, interrupt and steal time, so niced threads such as the
 * delivery threads at nice 19 and idle time do not count) and the process's main thread, which
 * serves the API, is busy too (its share of one CPU). Both over the time since the previous reading.
 * The second condition keeps the dispatcher's own load off the scale: the database work of a backlog
 * being delivered can keep the host busy, but it does not run on the API thread.
 * Readings are at least `intervalMs` apart; between them the last answer stands. Where /proc cannot
 * be read the host is never saturated.
 */
export class HostLoad {
  readonly #hostThreshold: number
  readonly #apiThreshold: number
  readonly #intervalMs: number
  /** Reads the counters: /proc, or a test's own. */
  readonly #read: () => CpuTimes | null
  readonly #cpus: number
  #last: (CpuTimes & { at: number }) | null = null
  #saturated = false

  /**
   * `hostThreshold`: the busy share (0–1) of all CPUs, and `apiThreshold`: the busy share (0–1) of
   * one CPU of the API thread, from which API requests count as short of CPU. The first reading is
   * taken now, so the first answer after `intervalMs` already covers a real interval.
   */
  constructor(
    hostThreshold: number,
    apiThreshold: number,
    intervalMs = 250,
    read: () => CpuTimes | null = readCpuTimes,
    cpus = availableParallelism(),
  ) {
    this.#hostThreshold = hostThreshold
    this.#apiThreshold = apiThreshold
    this.#intervalMs = intervalMs
    this.#read = read
    this.#cpus = Math.max(1, cpus)
    const sample = read()
    if (sample) this.#last = { ...sample, at: performance.now() }
  }

  saturated(): boolean {
    const at = performance.now()
    if (this.#last && at - this.#last.at < this.#intervalMs) return this.#saturated
    const sample = this.#read()
    if (!sample) return false
    const last = this.#last
    if (last && sample.total > last.total) {
      const total = sample.total - last.total
      const host = (sample.busy - last.busy) / total
      const api = (sample.api - last.api) / (total / this.#cpus)
      this.#saturated = host >= this.#hostThreshold && api >= this.#apiThreshold
    }
    this.#last = { ...sample, at }
    return this.#saturated
  }
}

/**
 * Cumulative CPU time in clock ticks: of all CPUs not niced nor idle (`busy`), of all CPUs (`total`),
 * and of this process's main thread (`api`).
 */
export interface CpuTimes {
  busy: number
  total: number
  api: number
}

function readCpuTimes(): CpuTimes | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').slice(0, 256).split('\n', 1)[0] ?? ''
    // cpu  user nice system idle iowait irq softirq steal …
    const [user, nice, system, idle, iowait, irq, softirq, steal] = line.trim().split(/\s+/).slice(1, 9).map(Number)
    // The main thread's id is the process id; fields after the command name: state is the 3rd,
    // utime and stime the 14th and 15th.
    const stat = readFileSync(`/proc/self/task/${process.pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const api = Number(fields[11]) + Number(fields[12])
    const all = [user, nice, system, idle, iowait, irq, softirq, steal, api]
    if (all.some((n) => n === undefined || !Number.isFinite(n))) return null
    const busy = user! + system! + irq! + softirq! + steal!
    return { busy, total: busy + nice! + idle! + iowait!, api }
  } catch {
    return null
  }
}
