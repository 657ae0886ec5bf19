import { afterAll, expect, test } from 'bun:test'
import { join } from 'node:path'
import { TEST_DATABASE_URL, TEST_REDIS_URL } from '../support/helpers'
import { type ServerProcess, startServer } from '../support/server-process'

const HOLD = join(import.meta.dir, '..', 'fixtures', 'hold-main-thread.ts')
const FATAL = 'the main thread has not run for a while: ending the process so that it is restarted'
const settings = { DATABASE_URL: TEST_DATABASE_URL ?? '', REDIS_URL: TEST_REDIS_URL ?? '', SERVER_PROCESSES: '1', STALL_EXIT_SECONDS: '2' }

const started: ServerProcess[] = []
afterAll(async () => {
  for (const server of started) await server.stop('SIGKILL')
})

test('a server whose main thread stops running JavaScript ends itself with one log line, for a supervisor to restart it', async () => {
  const server = await startServer(settings, ['--preload', HOLD])
  started.push(server)
  process.kill(server.pid, 'SIGUSR2')
  const held = performance.now()
  await server.logged(FATAL, 30_000)
  expect(performance.now() - held).toBeGreaterThanOrEqual(2_000)
  const line = JSON.parse(server.log().split('\n').find((l) => l.includes(FATAL)) ?? '{}')
  expect(line).toMatchObject({ level: 'fatal', seconds: 2, pid: server.pid })
  // Killed, not stopped: its SIGTERM handler is the JavaScript that no longer runs.
  expect(await server.stop()).toBe(137)
})

test('a server stopped (SIGSTOP) longer than STALL_EXIT_SECONDS and continued goes on', async () => {
  const server = await startServer(settings)
  started.push(server)
  server.pause(true)
  await Bun.sleep(4_000)
  server.pause(false)
  await Bun.sleep(3_000)
  expect((await fetch(`${server.url}/healthz`)).status).toBe(200)
  expect(server.log()).not.toContain(FATAL)
  expect(await server.stop()).toBe(0)
})

test('STALL_EXIT_SECONDS=0 starts no watch', async () => {
  const server = await startServer({ ...settings, STALL_EXIT_SECONDS: '0' }, ['--preload', HOLD])
  started.push(server)
  process.kill(server.pid, 'SIGUSR2')
  await Bun.sleep(4_000)
  expect(server.log()).not.toContain(FATAL)
  expect(await server.stop('SIGKILL')).toBe(137)
})
