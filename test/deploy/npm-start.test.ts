/**
 * `npm start` as a supervisor runs it (supervisord, pm2, a `CMD npm start`): a SIGTERM to npm alone,
 * not to its process group, must stop the server it started.
 */
import { expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { MODE, TEST_MASTER_KEY } from '../support/helpers'
import { newDataDir } from '../support/data-dir'
import { freePort, until } from '../support/servers'

/** The server processes running for `port` (by their environment and command line). */
const serversOn = (port: number) =>
  readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .filter((pid) => {
      try {
        const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')
        return env.includes(`PORT=${port}`) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('src/main.ts')
      } catch {
        return false
      }
    })
    .map(Number)

// An embedded server in either pass: run once.
test.skipIf(MODE !== 'embedded')('a SIGTERM to npm start stops the server, which frees its port', async () => {
  const port = await freePort()
  const npm = Bun.spawn(['npm', 'start', '--silent'], {
    cwd: join(import.meta.dir, '..', '..'),
    env: {
      ...process.env,
      HOST: '127.0.0.1',
      PORT: String(port),
      DATA_DIR: await newDataDir('ls-npm-start-', { embedded: true }),
      DATABASE_URL: '',
      REDIS_URL: '',
      MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
    },
    stdout: 'ignore',
    stderr: 'ignore',
  })
  const healthy = () => fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false)
  try {
    expect(await until(healthy, (up) => up, 30_000)).toBe(true)
    npm.kill('SIGTERM')
    await npm.exited
    expect(await until(async () => serversOn(port), (left) => left.length === 0, 10_000)).toEqual([])
    expect(await healthy()).toBe(false)
  } finally {
    npm.kill('SIGKILL')
    for (const pid of serversOn(port)) process.kill(pid, 'SIGKILL')
  }
})
