import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { procCpu } from './proc'

/** A server under test, as the benches start it: its URL, its processes' CPU and memory, and a stop. */
export interface Server {
  url: string
  /** Server processes sharing the port, as the first one logs it (the baseline logs none: 1). */
  processes: number
  /** CPU seconds the server's processes have used so far (user + system, all threads). */
  cpu(): number
  /** CPU seconds of the processes' main threads, which run every request's JavaScript. */
  mainCpu(): number
  /** Resident memory of each of the server's processes, in MB (VmRSS). */
  rssMb(): number[]
  stop(): Promise<void>
}

/** The server entry of a checkout; checkouts from before the move to feature rooms start at src/index.ts. */
export const serverEntry = (checkout: string) =>
  [join(checkout, 'src', 'main.ts'), join(checkout, 'src', 'index.ts')].find((entry) => existsSync(entry)) as string

function rssMb(pid: string): number {
  try {
    const kb = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
    return kb ? Number(kb) / 1024 : 0
  } catch {
    return 0
  }
}

/** Starts `entry` with `env` on a free port and resolves once it logs that it listens. */
export async function spawnServer(entry: string, env: Record<string, string>, flags: string[] = []): Promise<Server> {
  // A SERVER_PROCESSES of the shell running the bench must not leak into the default configuration.
  const { SERVER_PROCESSES: _, ...inherited } = process.env
  const proc = Bun.spawn([process.execPath, ...flags, entry], {
    env: { ...inherited, HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  const reader = proc.stderr.getReader()
  const decoder = new TextDecoder()
  let seen = ''
  for (;;) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`${entry} exited before listening:\n${seen}`)
    seen += decoder.decode(value)
    const line = seen.split('\n').find((l) => l.includes('"listening"'))
    if (!line) continue
    void (async () => {
      while (!(await reader.read()).done) {}
    })()
    // With SERVER_PROCESSES above 1 the first process has started the others before it logs.
    const pids = [String(proc.pid), ...Bun.spawnSync(['pgrep', '-P', String(proc.pid)]).stdout.toString().split('\n').filter(Boolean)]
    const sum = (path: (pid: string) => string) => pids.reduce((total, pid) => total + procCpu(path(pid)).seconds, 0)
    const listening = JSON.parse(line) as { url: string; processes?: number }
    return {
      url: listening.url,
      processes: listening.processes ?? 1,
      cpu: () => sum((pid) => pid),
      mainCpu: () => sum((pid) => `${pid}/task/${pid}`),
      rssMb: () => pids.map(rssMb),
      async stop() {
        proc.kill('SIGTERM')
        await proc.exited
      },
    }
  }
}
