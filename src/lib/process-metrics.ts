import { readdirSync } from 'node:fs'
import { monitorEventLoopDelay } from 'node:perf_hooks'
import { heapSize } from 'bun:jsc'
import type { Family } from './metrics'

const START_SECONDS = Date.now() / 1000 - process.uptime()
const NS_PER_SECOND = 1e9
const US_PER_SECOND = 1e6

let eventLoop: ReturnType<typeof monitorEventLoopDelay> | null = null

/**
 * Starts sampling event-loop delay (the runtime's own timer, every 20 ms): a server's, not a CLI's or a
 * test's, so main.ts starts it. Until then the lag gauges are absent.
 */
export function startEventLoopMonitor(): void {
  if (eventLoop) return
  eventLoop = monitorEventLoopDelay({ resolution: 20 })
  eventLoop.enable()
}

/** Open file descriptors (sockets included), where /proc tells; null elsewhere. */
function openFds(): number | null {
  try {
    return readdirSync('/proc/self/fd').length
  } catch {
    return null
  }
}

const gauge = (name: string, help: string, value: number): Family => ({ name, help, type: 'gauge', samples: [[name, '', value]] })

/**
 * This process's CPU, memory, file descriptors, event-loop delay, start time and uptime, read at the
 * scrape. The delay figures cover the time since the previous scrape, whose read resets them.
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
  if (eventLoop && eventLoop.count > 0) {
    const seconds = (ns: number) => ns / NS_PER_SECOND
    families.push({
      name: 'process_event_loop_delay_seconds',
      help: 'How late the event loop ran its timers since the previous scrape: mean, 99th percentile and max.',
      type: 'gauge',
      samples: [
        ['process_event_loop_delay_seconds', 'stat="mean"', seconds(eventLoop.mean)],
        ['process_event_loop_delay_seconds', 'stat="p99"', seconds(eventLoop.percentile(99))],
        ['process_event_loop_delay_seconds', 'stat="max"', seconds(eventLoop.max)],
      ],
    })
    eventLoop.reset()
  }
  return families
}
