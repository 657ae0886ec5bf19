import type { Subprocess } from 'bun'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { procCpu, procMemoryMb } from './proc'
import { LAUNCH_ENV } from '../src/server-processes'

/** A server under test, as the benches and the tests start it: its URL, its processes' CPU and memory, its log, and a stop. */
export interface Server {
  url: string
  /** The first process's (with SERVER_PROCESSES above 1, the one that started the others). */
  pid: number
  /** Server processes sharing the port, as the first one logs it (the baseline logs none: 1). */
  processes: number
  /** CPU seconds the server's processes have used so far (user + system, all threads). */
  cpu(): number
  /** CPU seconds of the processes' main threads, which run every request's JavaScript. */
  mainCpu(): number
  /** Resident memory of each of the server's processes, in MB (VmRSS). */
  rssMb(): number[]
  /** Everything the server has logged so far (stderr). */
  log(): string
  /** Resolves once every server process has logged a line containing `text`; throws when the server exits first or `timeoutMs` passes. */
  logged(text: string, timeoutMs?: number): Promise<void>
  /** SIGTERM (or `signal`), then the exit code. */
  stop(signal?: 'SIGTERM' | 'SIGKILL'): Promise<number>
  /**
   * Stops every process of the server (SIGSTOP) or lets them go on (SIGCONT): while another server on
   * the same cores is measured, this one's timers and collector then take none of their time.
   */
  pause(paused: boolean): void
}

/**
 * Runs `measure` with every server of `servers` but `server` paused: an idle server's timers and
 * collector would otherwise take the measured one's cores, by an amount that varies with what it holds.
 */
export async function measureAlone<T>(servers: readonly Server[], server: Server, measure: () => Promise<T>): Promise<T> {
  const others = servers.filter((other) => other !== server)
  for (const other of others) other.pause(true)
  try {
    return await measure()
  } finally {
    for (const other of others) other.pause(false)
  }
}

/** The server entry of a checkout; checkouts from before the move to feature rooms start at src/index.ts. */
const serverEntry = (checkout: string) =>
  [join(checkout, 'src', 'main.ts'), join(checkout, 'src', 'index.ts')].find((entry) => existsSync(entry)) as string

/**
 * Bun's flag that kills a process when its parent dies: a bench killed outright (a timeout's SIGKILL)
 * must not leave servers running to skew the next run. Benches only: under it a server's own
 * processes die with the first one whether or not the server sees to it, which a test checks.
 */
export const DIE_WITH_BENCH = '--no-orphans'

/**
 * BENCH_PROFILE_DIR's flags: the server writes its CPU profile there when it stops, as markdown to read
 * and as the raw samples (.cpuprofile), which `bun bench/profile.ts` counts. The markdown weighs each
 * sample by the time since the one before it, so a timer that fires after an idle spell between
 * scenarios carries the whole spell; a count of the samples does not.
 */
export function profileFlags(): string[] {
  const dir = process.env.BENCH_PROFILE_DIR
  return dir ? ['--cpu-prof', '--cpu-prof-md', `--cpu-prof-dir=${dir}`] : []
}

/** Starts a checkout's server as the image and `npm start` launch it (LAUNCH_ENV), with `env` on top; it dies with the bench. */
export const launchServer = (checkout: string, env: Record<string, string>, flags: string[] = []) =>
  spawnServer(serverEntry(checkout), { ...LAUNCH_ENV, ...env }, [DIE_WITH_BENCH, ...flags])

/** The processes `pid` started; none where pgrep is missing (the tests start servers with this too). */
function childPids(pid: number): string[] {
  try {
    return Bun.spawnSync(['pgrep', '-P', String(pid)]).stdout.toString().split('\n').filter(Boolean)
  } catch {
    return []
  }
}

/**
 * Servers still running when the process that started them exits (a test that failed before its stop)
 * are stopped with it: one left behind served on, against a database its test run had dropped.
 */
const running = new Set<Subprocess>()
process.on('exit', () => {
  for (const proc of running) proc.kill('SIGTERM')
})

/** Starts `entry` with `env` on a free port and resolves once it logs that it listens. */
export async function spawnServer(entry: string, env: Record<string, string>, flags: string[] = []): Promise<Server> {
  // A SERVER_PROCESSES or an allocator setting of the shell running the bench must not leak into the
  // default configuration: a server gets LAUNCH_ENV from launchServer or from the process that started it.
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([name]) => name !== 'SERVER_PROCESSES' && !(name in LAUNCH_ENV)))
  const proc = Bun.spawn([process.execPath, ...flags, entry], {
    env: { ...inherited, HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  running.add(proc)
  void proc.exited.then(() => running.delete(proc))
  const reader = proc.stderr.getReader()
  // stream: a multi-byte character split between two chunks is decoded whole, not as two U+FFFD.
  const decoder = new TextDecoder()
  let seen = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`${entry} exited before listening:\n${seen}`)
    seen += decoder.decode(value, { stream: true })
    const line = seen.split('\n').find((l) => l.includes('"listening"'))
    if (!line) continue
    // Everything logged, kept for `logged`: only the servers' few info lines (the benches run at info).
    // Another process may log before the first one's "listening", so the text before it counts too.
    let exited = false
    const waiters: (() => void)[] = []
    void (async () => {
      for (;;) {
        const { value, done } = await reader.read()
        if (done) exited = true
        else seen += decoder.decode(value, { stream: true })
        for (const wake of waiters.splice(0)) wake()
        if (done) return
      }
    })()
    // With SERVER_PROCESSES above 1 the first process has started the others before it logs.
    const pids = [String(proc.pid), ...childPids(proc.pid)]
    const sum = (path: (pid: string) => string) => pids.reduce((total, pid) => total + procCpu(path(pid)).seconds, 0)
    const listening = JSON.parse(line) as { url: string; processes?: number }
    return {
      url: listening.url,
      pid: proc.pid,
      processes: listening.processes ?? 1,
      cpu: () => sum((pid) => pid),
      mainCpu: () => sum((pid) => `${pid}/task/${pid}`),
      rssMb: () => pids.map((pid) => procMemoryMb(pid, 'VmRSS')),
      log: () => seen,
      async logged(text, timeoutMs = 300_000) {
        const processes = listening.processes ?? 1
        const deadline = performance.now() + timeoutMs
        while (seen.split('\n').filter((l) => l.includes(text)).length < processes) {
          if (exited) throw new Error(`${entry} exited before each process logged "${text}"`)
          const left = deadline - performance.now()
          if (left <= 0) throw new Error(`not every process of ${entry} logged "${text}" within ${timeoutMs} ms`)
          await new Promise<void>((wake) => {
            const timer = setTimeout(wake, left)
            waiters.push(() => {
              clearTimeout(timer)
              wake()
            })
          })
        }
      },
      async stop(signal = 'SIGTERM') {
        proc.kill(signal)
        return proc.exited
      },
      pause(paused) {
        for (const pid of pids) process.kill(Number(pid), paused ? 'SIGSTOP' : 'SIGCONT')
      },
    }
  }
}

/** What one wrk run (with --latency) printed: req/s, p50/p99 in ms, non-2xx responses, requests made. */
export interface WrkFigures {
  rps: number
  p50: number
  p99: number
  errors: number
  total: number
  /** wrk's own CPU time, from its process's resource usage (µs). */
  cpuUs: number
}

const toMs = (v: string, unit: string) => Number(v) * ({ us: 0.001, ms: 1, s: 1000 }[unit] ?? Number.NaN)

/**
 * Runs wrk with `args` (after `--latency`) and reads its figures; throws when wrk fails. Not spawnSync:
 * the bench must go on reading its servers' stderr while wrk runs, or a server that logs more than a
 * pipe holds would stall on its next line in the middle of the measurement.
 */
export async function runWrk(args: string[]): Promise<WrkFigures> {
  const wrk = Bun.spawn(['wrk', '--latency', ...args], { stdout: 'pipe', stderr: 'pipe' })
  const [text, stderr, exitCode] = await Promise.all([new Response(wrk.stdout).text(), new Response(wrk.stderr).text(), wrk.exited])
  if (exitCode !== 0) throw new Error(`wrk failed: ${stderr}`)
  const pct = (p: string) => {
    const m = new RegExp(`^\\s+${p}%\\s+([\\d.]+)(us|ms|s)\\s*$`, 'm').exec(text)
    return m ? toMs(m[1]!, m[2]!) : Number.NaN
  }
  return {
    rps: Number(/Requests\/sec:\s+([\d.]+)/.exec(text)?.[1] ?? Number.NaN),
    p50: pct('50'),
    p99: pct('99'),
    errors: Number(/Non-2xx or 3xx responses:\s+(\d+)/.exec(text)?.[1] ?? 0),
    total: Number(/(\d+) requests in/.exec(text)?.[1] ?? Number.NaN),
    cpuUs: Number(wrk.resourceUsage()?.cpuTime.total ?? Number.NaN),
  }
}
