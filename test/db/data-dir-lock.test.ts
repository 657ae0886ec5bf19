/**
 * One process owns an embedded DATA_DIR: a second server exits with one line and leaves the first
 * one's socket alone, a CLI goes through the running server or waits for the lock, and a lock left by
 * a killed server does not block the next start.
 */
import { afterAll, describe, expect, setDefaultTimeout, setSystemTime, test } from 'bun:test'
import { existsSync, mkdtempSync, rmSync, statSync, utimesSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { isLock, lockDataDir, tryLockDataDir } from '../../src/db/data-dir-lock'
import { newDataDir } from '../support/data-dir'
import { MODE, TEST_MASTER_KEY } from '../support/helpers'
import { until } from '../support/servers'
import { runToExit, startServer } from '../support/server-process'

setDefaultTimeout(60_000)

const ROOT = join(import.meta.dir, '..', '..')
const dirs: string[] = []
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
})

/** Embedded settings on a data dir of the test's own. */
async function embedded(): Promise<Record<string, string>> {
  const dataDir = await newDataDir('ls-lock-', { embedded: true })
  dirs.push(dataDir)
  return { DATA_DIR: dataDir, DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: TEST_MASTER_KEY.toString('hex'), LOG_LEVEL: 'info' }
}

/** A second server: its exit code and stderr, or null when it was still running (and listening) after `ms`. */
async function secondServer(env: Record<string, string>, ms = 20_000) {
  const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
    cwd: ROOT,
    env: { ...process.env, ...env, HOST: '127.0.0.1', PORT: '0' },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  const stderr = new Response(proc.stderr).text()
  const code = await Promise.race([proc.exited, Bun.sleep(ms).then(() => null)])
  if (code === null) proc.kill('SIGKILL')
  await proc.exited
  return { code, stderr: await stderr }
}

async function cli(env: Record<string, string>, args: string[]) {
  const run = await runToExit(['src/operator/cli.ts', ...args], env)
  const last = run.stdout.trimEnd().split('\n').at(-1) ?? ''
  return { ...run, json: run.code === 0 ? JSON.parse(last) : null }
}

function expectOneLine(stderr: string, mentions: RegExp) {
  const lines = stderr.trimEnd().split('\n')
  expect(lines, stderr).toHaveLength(1)
  expect(lines[0]).toMatch(mentions)
}

// The lock guards the embedded database and the socket of a server without shared storage; the
// PostgreSQL + Redis pass runs servers that have neither.
if (MODE === 'embedded') {
  describe('DATA_DIR lock', () => {
    test('a second server exits with one line; the first keeps its socket and serves the CLI', async () => {
      const env = await embedded()
      const first = await startServer(env)
      try {
        const second = await secondServer(env)
        expect(second.code, second.stderr).not.toBeNull()
        expect(second.code).not.toBe(0)
        expectOneLine(second.stderr, new RegExp(`DATA_DIR .* in use by a running server \\(pid ${first.pid}\\)`))
        expect(existsSync(join(env.DATA_DIR ?? '', 'operator.sock'))).toBe(true)

        const created = await cli(env, ['account', 'create', '--name', 'Through the first'])
        expect(created.code, created.stderr).toBe(0)
        const account = await fetch(`${first.url}/v1/account`, {
          headers: { authorization: `Bearer ${created.json.apiKey}` },
        })
        expect(account.status).toBe(200)
        expect(await account.json()).toMatchObject({ accountId: created.json.accountId })
        expect(first.log()).toContain('"operator command"')
      } finally {
        expect(await first.stop()).toBe(0)
      }
      expect(existsSync(join(env.DATA_DIR ?? '', 'lock'))).toBe(false)
    })

    test('a lock left by a server killed with SIGKILL does not block the next start', async () => {
      const env = await embedded()
      const killed = await startServer(env)
      process.kill(killed.pid, 'SIGKILL')
      await killed.stop()
      expect(existsSync(join(env.DATA_DIR ?? '', 'lock'))).toBe(true)

      const next = await startServer(env)
      try {
        const created = await cli(env, ['account', 'create', '--name', 'After the crash'])
        expect(created.code, created.stderr).toBe(0)
        expect(next.log()).toContain('"operator command"')
      } finally {
        expect(await next.stop()).toBe(0)
      }
    })

    test('a CLI finding the lock held by a process that does not answer fails with one line', async () => {
      const env = await embedded()
      // This test process holds it, as a server whose socket is gone would.
      const lock = await tryLockDataDir(env.DATA_DIR ?? '', 'server')
      if (!isLock(lock)) throw new Error('the fresh data dir was locked')
      try {
        const run = await cli(env, ['account', 'create', '--name', 'Blocked'])
        expect(run.code).not.toBe(0)
        expect(run.stdout).toBe('')
        expectOneLine(run.stderr, new RegExp(`DATA_DIR .* in use by a running server \\(pid ${process.pid}\\)`))
      } finally {
        lock.release()
      }
      expect(existsSync(join(env.DATA_DIR ?? '', 'lock'))).toBe(false)
    })

    test("a CLI waits for another CLI's command that holds the DATA_DIR past 10 s, as a first one creating the database does", async () => {
      const env = await embedded()
      // This test process holds it, as a CLI in direct mode would.
      const lock = await tryLockDataDir(env.DATA_DIR ?? '', 'cli')
      if (!isLock(lock)) throw new Error('the fresh data dir was locked')
      const released = Bun.sleep(11_000).then(() => lock.release())
      const run = await cli(env, ['account', 'create', '--name', 'Patient'])
      await released
      expect([run.code, run.stderr]).toEqual([0, ''])
    }, 30_000)

    test('two CLIs in direct mode at once: one waits for the other, both succeed', async () => {
      // Its database is already created and migrated (newDataDir): the wait, not the set-up, is what this
      // test is about.
      const env = await embedded()
      const runs = await Promise.all([
        cli(env, ['account', 'create', '--name', 'One']),
        cli(env, ['account', 'create', '--name', 'Two']),
      ])
      expect(runs.map((r) => [r.code, r.stderr])).toEqual([
        [0, ''],
        [0, ''],
      ])
      const server = await startServer(env)
      try {
        for (const { json } of runs) {
          const res = await fetch(`${server.url}/v1/account`, { headers: { authorization: `Bearer ${json.apiKey}` } })
          expect(res.status).toBe(200)
        }
      } finally {
        await server.stop()
      }
    })
  })
}

test('a lock whose holder was killed but not yet reaped (a zombie) is taken over', async () => {
  // The inner shell prints its pid and exits; its parent has exec'd into sleep, which never reaps it.
  const parent = Bun.spawn(['sh', '-c', 'sh -c "echo \\$\\$" & exec sleep 5'], { stdout: 'pipe' })
  const pid = Number((await new Response(parent.stdout).text()).trim())
  try {
    const stat = await until(
      async () => Bun.file(`/proc/${pid}/stat`).text(),
      (text) => text.slice(text.lastIndexOf(')') + 2).startsWith('Z'),
    )
    const started = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
    const dataDir = mkdtempSync(join(tmpdir(), 'ls-lock-'))
    dirs.push(dataDir)
    await Bun.write(join(dataDir, 'lock'), JSON.stringify({ pid, started, owner: 'server' }))
    const lock = await tryLockDataDir(dataDir, 'server')
    expect(isLock(lock), JSON.stringify(lock)).toBe(true)
    if (isLock(lock)) lock.release()
  } finally {
    parent.kill('SIGKILL')
  }
})

describe('a lock held from another pid namespace or boot (a second container on the same volume)', () => {
  /** Longer than the lease (5 s). */
  const LAPSED_MS = 6_000

  /** A lock naming this live process, as seen from a namespace or boot that is not ours. */
  async function foreignLock(elsewhere: { pidNamespace?: string; bootId?: string }, renewedMsAgo = 0) {
    const dataDir = mkdtempSync(join(tmpdir(), 'ls-lock-'))
    dirs.push(dataDir)
    const stat = await Bun.file(`/proc/${process.pid}/stat`).text()
    const started = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
    const holder = { pid: process.pid, started, owner: 'server', ...elsewhere }
    await Bun.write(join(dataDir, 'lock'), JSON.stringify(holder))
    // Its lease as last renewed that long ago.
    const renewed = new Date(Date.now() - renewedMsAgo)
    utimesSync(join(dataDir, 'lock'), renewed, renewed)
    return dataDir
  }

  test.each([[{ pidNamespace: 'pid:[1]' }], [{ bootId: '00000000-0000-0000-0000-000000000000' }]])(
    '%j: its server answering on the socket keeps it, its lease lapsed or not',
    async (elsewhere) => {
      const dataDir = await foreignLock(elsewhere, LAPSED_MS)
      const socket = Bun.serve({ unix: join(dataDir, 'operator.sock'), fetch: () => new Response(null, { status: 404 }) })
      try {
        const result = await tryLockDataDir(dataDir, 'server')
        expect(isLock(result), JSON.stringify(result)).toBe(false)
      } finally {
        socket.stop(true)
      }
    },
  )

  test.each([[{ pidNamespace: 'pid:[1]' }], [{ bootId: '00000000-0000-0000-0000-000000000000' }]])(
    '%j: a lease renewed within 5 s keeps it without a socket (a CLI working on the storage, a server closing its database)',
    async (elsewhere) => {
      const dataDir = await foreignLock(elsewhere)
      const result = await tryLockDataDir(dataDir, 'server')
      expect(isLock(result), JSON.stringify(result)).toBe(false)
    },
  )

  test('a lock this process holds renews its lease each second', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'ls-lock-'))
    dirs.push(dataDir)
    const lock = await tryLockDataDir(dataDir, 'cli')
    if (!isLock(lock)) throw new Error('not locked')
    try {
      const path = join(dataDir, 'lock')
      utimesSync(path, new Date(0), new Date(0))
      await Bun.sleep(1_500)
      expect(Date.now() - statSync(path).mtimeMs).toBeLessThan(1_500)
    } finally {
      lock.release()
    }
  })

  test.each([[{ pidNamespace: 'pid:[1]' }], [{ bootId: '00000000-0000-0000-0000-000000000000' }]])(
    '%j: a lease not renewed and a socket nobody answers on, or none, mean its holder is gone, whatever its pid is here',
    async (elsewhere) => {
      const dataDir = await foreignLock(elsewhere, LAPSED_MS)
      // A crashed server's socket file: nothing listens on it any more.
      const stale = Bun.serve({ unix: join(dataDir, 'operator.sock'), fetch: () => new Response(null) })
      stale.stop(true)
      await Bun.write(join(dataDir, 'operator.sock'), '')
      const lock = await tryLockDataDir(dataDir, 'server')
      expect(isLock(lock), JSON.stringify(lock)).toBe(true)
      if (isLock(lock)) lock.release()
    },
  )

  // An embedded server in either pass: run once.
  test.skipIf(MODE !== 'embedded')('a server started while a gone holder\'s lease has not lapsed yet (a container restarted after a crash) waits for it, then starts', async () => {
    const dataDir = await foreignLock({ pidNamespace: 'pid:[1]' }, 2_000)
    const started = Date.now()
    const server = await startServer({ DATABASE_URL: '', REDIS_URL: '', DATA_DIR: dataDir })
    try {
      expect(Date.now() - started).toBeGreaterThanOrEqual(2_500)
    } finally {
      expect(await server.stop()).toBe(0)
    }
  }, 30_000)

  test('a holder of this namespace and boot is still judged by its pid', async () => {
    const dataDir = await foreignLock({})
    const result = await tryLockDataDir(dataDir, 'server')
    expect(isLock(result)).toBe(false)
  })
})

test('a wait for the DATA_DIR lasts its time whatever the wall clock does: a step forward does not end it', async () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'ls-lock-step-'))
  const held = await tryLockDataDir(dataDir, 'server')
  if (!isLock(held)) throw new Error('the DATA_DIR is held')
  const started = performance.now()
  let stepped = false
  try {
    const result = await lockDataDir(dataDir, 'cli', 1_000, async () => {
      // A VM resumed from a pause, an NTP step.
      if (!stepped) setSystemTime(new Date(Date.now() + 3_600_000))
      stepped = true
      return true
    })
    expect(isLock(result)).toBe(false)
    expect(performance.now() - started).toBeGreaterThanOrEqual(1_000)
  } finally {
    setSystemTime()
    held.release()
    rmSync(dataDir, { recursive: true, force: true })
  }
})
