import { readdirSync, readFileSync } from 'node:fs'
import { monitorEventLoopDelay } from 'node:perf_hooks'
import { heapSize } from 'bun:jsc'
import type { Family } from './metrics'

const START_SECONDS = Date.now() / 1000 - process.uptime()
const NS_PER_SECOND = 1e9
const US_PER_SECOND = 1e6

/** The window event-loop delay is reported over: a scrape reads the last complete one. */
export const EVENT_LOOP_WINDOW_MS = 10_000

/**
 * Event-loop delay (the runtime's own timer, every 20 ms) over fixed windows: each window's figures
 * are kept when it closes and the histogram starts again. A read changes nothing, so scrapes however
 * frequent (or a stranger's) neither wipe the window nor leave gaps in the series.
 */
class EventLoopDelay {
  readonly #histogram = monitorEventLoopDelay({ resolution: 20 })
  #last: Family | null = null

  constructor(windowMs = EVENT_LOOP_WINDOW_MS) {
    this.#histogram.enable()
    setInterval(() => this.#close(windowMs), windowMs).unref()
  }

  /** The last complete window's figures; null before one closed. */
  family(): Family | null {
    return this.#last
  }

  #close(windowMs: number): void {
    const h = this.#histogram
    if (h.count === 0) return
    const seconds = (ns: number) => ns / NS_PER_SECOND
    const name = 'process_event_loop_delay_seconds'
    this.#last = {
      name,
      help: `How late the event loop ran its timers over the last complete ${windowMs / 1000} s window: mean, 99th percentile and max.`,
      type: 'gauge',
      samples: [
        [name, 'stat="mean"', seconds(h.mean)],
        [name, 'stat="p99"', seconds(h.percentile(99))],
        [name, 'stat="max"', seconds(h.max)],
      ],
    }
    h.reset()
  }
}

// One per process: Bun's histograms share one native monitor, so a second one's reset wipes the first's.
let eventLoop: EventLoopDelay | null = null

/**
 * Starts measuring event-loop delay: a server's, not a CLI's or a test's, so main.ts starts it. Until
 * then the gauges are absent; the first call's window holds.
 */
export function startEventLoopMonitor(windowMs = EVENT_LOOP_WINDOW_MS): void {
  eventLoop ??= new EventLoopDelay(windowMs)
}

/** Open file descriptors (sockets included), where /proc tells; null elsewhere. */
function openFds(): number | null {
  try {
    return readdirSync('/proc/self/fd').length
  } catch {
    return null
  }
}

/**
 * Below this many file descriptors a server warns at its start. Each client connection holds one, and
 * at the limit Bun keeps retrying the accept (oven-sh/bun#32705): a core spins and new connections wait
 * until others close. Bun raises the soft limit to the hard one itself, so only a low hard limit (a
 * container's or a service unit's) gets here.
 */
export const LOW_FD_LIMIT = 4096

/** The most file descriptors this process may open (its soft limit), where /proc tells; null elsewhere or unlimited. */
export function maxFds(): number | null {
  try {
    const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max open files'))
    const soft = line?.slice('Max open files'.length).trim().split(/\s+/)[0]
    return soft && /^\d+$/.test(soft) ? Number(soft) : null
  } catch {
    return null
  }
}

const gauge = (name: string, help: string, value: number): Family => ({ name, help, type: 'gauge', samples: [[name, '', value]] })

/**
 * This process's CPU, memory, file descriptors, event-loop delay, start time and uptime, read at the
 * scrape; the delay figures are the last complete window's (EventLoopDelay).
 */
export function processFamilies(): Family[] {
  const cpu = process.cpuUsage()
  const families: Family[] = [
    {
      name: 'process_cpu_seconds_total',
      help: 'CPU time this process used, user and system together.',
      type: 'counter',
      samples: [['process_cpu_seconds_total', '', (cpu.user + cpu.system) / US_PER_SECOND]],
    },
    gauge('process_resident_memory_bytes', 'Resident memory of this process.', process.memoryUsage.rss()),
    // JavaScriptCore's own figure: Bun's process.memoryUsage().heapUsed counts more than the heap.
    gauge('process_heap_bytes', 'JavaScript heap in use.', heapSize()),
    gauge('process_start_time_seconds', 'When this process started, in seconds since the Unix epoch.', START_SECONDS),
    gauge('process_uptime_seconds', 'How long this process has run.', process.uptime()),
  ]
  const fds = openFds()
  if (fds !== null) families.push(gauge('process_open_fds', 'Open file descriptors of this process, sockets included.', fds))
  const max = maxFds()
  if (max !== null) families.push(gauge('process_max_fds', 'The most file descriptors this process may open.', max))
  const delay = eventLoop?.family()
  if (delay) families.push(delay)
  return families
}
