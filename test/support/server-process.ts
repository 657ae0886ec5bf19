import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { procMemoryMb } from '../../bench/proc'
import { type Server, spawnServer } from '../../bench/server'
import { newDataDir } from './data-dir'
import { TEST_MASTER_KEY } from './helpers'
import { LAUNCH_ENV } from '../../src/server-processes'

export type ServerProcess = Server

/**
 * Starts `bun src/main.ts` on a free port (bench/server.ts) and resolves once it logs that it listens;
 * `flags` go to Bun (a `--preload` of a test's).
 */
export const startServer = async (env: Record<string, string>, flags: string[] = []): Promise<ServerProcess> =>
  spawnServer(
    join(import.meta.dir, '..', '..', 'src', 'main.ts'),
    {
      DATA_DIR: env.DATA_DIR ?? (await newDataDir('ls-proc-', { embedded: !(env.DATABASE_URL ?? process.env.DATABASE_URL) })),
      MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
      WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
      ...env,
    },
    flags,
  )

/** What a running process's environment says of the LAUNCH_ENV variables (src/server-processes.ts). */
export function launchSettingsOf(pid: number): Record<string, string> {
  const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')
  const settings: Record<string, string> = {}
  for (const name of Object.keys(LAUNCH_ENV)) {
    const entry = env.find((e) => e.startsWith(`${name}=`))
    if (entry !== undefined) settings[name] = entry.slice(name.length + 1)
  }
  return settings
}

/** Runs one of the project's entry points (`src/operator/cli.ts`, `src/main.ts`) to its exit and collects its output. */
export async function runToExit(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string; peakRssMb: number }> {
  const proc = Bun.spawn([process.execPath, ...args], {
    cwd: join(import.meta.dir, '..', '..'),
    env: { ...process.env, ...env },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  // Read from /proc while it runs: the exit's ru_maxrss counts this process's memory too (Linux keeps
  // the high-water mark of the memory a spawned child shared with its parent until its exec).
  let peakRssMb = 0
  const sampling = setInterval(() => {
    peakRssMb = Math.max(peakRssMb, procMemoryMb(proc.pid, 'VmHWM'))
  }, 10)
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]).finally(() => clearInterval(sampling))
  return { code, stdout, stderr, peakRssMb }
}

/** Two server processes on PostgreSQL and Redis (TEST_*_URL), the first with its internal metrics listener. */
export async function twoProcessesWithMetricsPort(databaseUrl: string, redisUrl: string, metricsPort: number): Promise<ServerProcess> {
  return startServer({ DATABASE_URL: databaseUrl, REDIS_URL: redisUrl, SERVER_PROCESSES: '2', METRICS_PORT: String(metricsPort) })
}
