/**
 * Servers a fault test owns: a redis-server and a PostgreSQL cluster on ports of their own, which the
 * test stops, restarts (empty) and starts again without touching the machine's shared servers.
 */
import { chownSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { basename, dirname, join } from 'node:path'

/** Whether a listener on 127.0.0.1 can bind `port` now. */
export const canListen = (port: number) =>
  new Promise<boolean>((resolve) => {
    const srv = createServer()
    srv.once('error', () => resolve(false))
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)))
  })

/**
 * A port free now, below Linux's ephemeral range (32768 and up): a port the kernel handed out to a listener
 * is soon handed to some outgoing connection (to PostgreSQL, to Redis) before the server that was to bind
 * it starts, which failed tests with EADDRINUSE.
 */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000)
    if (await canListen(port)) return port
  }
}

/** Calls `fn` every 100 ms until `ok` holds or `ms` pass; returns the last value either way. */
export async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 10_000): Promise<T> {
  // The monotonic clock: a wall clock stepped forward (a VM resumed from a pause) would end the wait at once.
  const deadline = performance.now() + ms
  for (;;) {
    const v = await fn()
    if (ok(v) || performance.now() > deadline) return v
    await Bun.sleep(100)
  }
}

async function waitForPort(port: number, ms = 10_000): Promise<void> {
  const open = () =>
    new Promise<boolean>((resolve) => {
      Bun.connect({
        hostname: '127.0.0.1',
        port,
        socket: {
          open: (s) => {
            s.end()
            resolve(true)
          },
          data: () => {},
          connectError: () => resolve(false),
        },
      }).catch(() => resolve(false))
    })
  if (!(await until(open, (up) => up, ms))) throw new Error(`nothing listens on port ${port}`)
}

export interface OwnRedis {
  url: string
  port: number
  /** Kills the server (SIGKILL: nothing is saved). */
  stop(): Promise<void>
  /** Starts it again on the same port; without persistence it comes back empty. */
  start(): Promise<void>
  /** Sends the server a signal: SIGSTOP holds it (its connections stay open, nothing is answered), SIGCONT resumes it. */
  signal(signal: 'SIGSTOP' | 'SIGCONT'): void
}

/** Where ownRedis's servers run; a prefix of the clusters' too, which the reaping of either finds. */
const REDIS_DIR_PREFIX = 'ls-redis-'

/**
 * Kills the servers of a test's own (run in a `tmpdir()/<prefix>*` directory, their --dir) whose test
 * process is gone, their parent now init, and removes their directories: bun test runs a describe's
 * body, which may start them, but not its afterAll when a filter leaves none of its tests, and emits no
 * 'exit'. A cluster's took the port range from every later cluster.
 */
export function reapOrphanedServers(prefix: string): void {
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const parent = /^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
      const dir = readlinkSync(`/proc/${pid}/cwd`)
      if (parent !== '1' || !basename(dir).startsWith(prefix) || dirname(dir) !== tmpdir()) continue
      process.kill(Number(pid), 'SIGKILL')
      rmSync(dir, { recursive: true, force: true })
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
}

/** A redis-server of the test's own, without persistence unless `args` asks for it. */
export async function ownRedis(args: string[] = ['--save', '', '--appendonly', 'no']): Promise<OwnRedis> {
  reapOrphanedServers(REDIS_DIR_PREFIX)
  const port = await freePort()
  const dir = mkdtempSync(join(tmpdir(), REDIS_DIR_PREFIX))
  let proc: ReturnType<typeof Bun.spawn> | null = null
  const handle: OwnRedis = {
    url: `redis://127.0.0.1:${port}`,
    port,
    async start() {
      proc = Bun.spawn(['redis-server', '--port', String(port), '--bind', '127.0.0.1', '--dir', dir, ...args], {
        stdout: 'ignore',
        stderr: 'ignore',
      })
      await waitForPort(port)
    },
    signal(signal) {
      proc?.kill(signal)
    },
    async stop() {
      if (!proc) return
      proc.kill('SIGCONT')
      proc.kill('SIGKILL')
      await proc.exited
      proc = null
    },
  }
  await handle.start()
  return handle
}

export interface OwnPostgres {
  url: string
  /** Fast shutdown: every connection is cut. */
  stop(): Promise<void>
  start(): Promise<void>
  /** Stops the cluster and deletes its files. */
  destroy(): Promise<void>
}

// initdb and the server refuse to run as root, which CI is.
const asPostgres = (cmd: string[]) => (process.getuid?.() === 0 ? ['runuser', '-u', 'postgres', '--', ...cmd] : cmd)

async function run(cmd: string[]): Promise<void> {
  const proc = Bun.spawn(asPostgres(cmd), { stdout: 'pipe', stderr: 'pipe' })
  const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()])
  if (code !== 0) throw new Error(`${cmd[0]} exited ${code}: ${err}`)
}

function postgresUid(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null
  const out = Bun.spawnSync(['id', '-u', 'postgres']).stdout.toString().trim()
  const gid = Bun.spawnSync(['id', '-g', 'postgres']).stdout.toString().trim()
  return { uid: Number(out), gid: Number(gid) }
}

/** A PostgreSQL cluster of the test's own (initdb + pg_ctl from the machine's binaries), trust auth. */
export async function ownPostgres(): Promise<OwnPostgres> {
  const port = await freePort()
  const root = mkdtempSync(join(tmpdir(), 'ls-pg-'))
  const owner = postgresUid()
  if (owner) chownSync(root, owner.uid, owner.gid)
  const data = join(root, 'data')
  await run(['initdb', '-D', data, '-U', 'postgres', '--auth=trust', '--no-sync', '-E', 'UTF8'])
  const options = `-p ${port} -k ${root} -c listen_addresses=127.0.0.1 -c fsync=off`
  const handle: OwnPostgres = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    async start() {
      await run(['pg_ctl', '-D', data, '-o', options, '-l', join(root, 'log'), '-w', 'start'])
    },
    async stop() {
      await run(['pg_ctl', '-D', data, '-m', 'fast', '-w', 'stop'])
    },
    async destroy() {
      await run(['pg_ctl', '-D', data, '-m', 'immediate', '-w', 'stop']).catch(() => {})
      rmSync(root, { recursive: true, force: true })
    },
  }
  await handle.start()
  return handle
}
