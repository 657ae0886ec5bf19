import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { TEST_MASTER_KEY } from './helpers'

export interface ServerProcess {
  url: string
  pid: number
  /** Everything the server has logged so far (stderr). */
  log(): string
  /** SIGTERM, then the exit code. */
  stop(): Promise<number>
}

/** Starts `bun src/main.ts` on a free port and resolves once it logs that it listens. */
export async function startServer(env: Record<string, string>): Promise<ServerProcess> {
  const proc = Bun.spawn([process.execPath, join(import.meta.dir, '..', '..', 'src', 'main.ts')], {
    env: {
      ...process.env,
      HOST: '127.0.0.1',
      PORT: '0',
      DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-proc-')),
      MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
      LOG_LEVEL: 'info',
      WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
      ...env,
    },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  // stream: a multi-byte character split between two chunks is decoded whole, not as two U+FFFD.
  const decoder = new TextDecoder()
  let seen = ''
  const reader = proc.stderr.getReader()
  while (true) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`server exited before listening:\n${seen}`)
    seen += decoder.decode(value, { stream: true })
    const line = seen.split('\n').find((l) => l.includes('"listening"'))
    if (line) {
      const url = (JSON.parse(line) as { url: string }).url
      // Keep draining stderr so the child never blocks on a full pipe.
      void (async () => {
        for (;;) {
          const next = await reader.read()
          if (next.done) return
          seen += decoder.decode(next.value, { stream: true })
        }
      })()
      return {
        url,
        pid: proc.pid,
        log: () => seen,
        async stop() {
          proc.kill('SIGTERM')
          return proc.exited
        },
      }
    }
  }
}

/** Runs one of the project's entry points (`src/operator/cli.ts`, `src/main.ts`) to its exit and collects its output. */
export async function runToExit(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const proc = Bun.spawn([process.execPath, ...args], {
    cwd: join(import.meta.dir, '..', '..'),
    env: { ...process.env, ...env },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ])
  return { code, stdout, stderr }
}
