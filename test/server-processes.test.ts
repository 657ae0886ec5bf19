import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from 'bun:test'
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs'
import { availableParallelism, tmpdir } from 'node:os'
import { connect } from 'node:net'
import { join } from 'node:path'
import { decode, hwid, insertLicense, nonce, verifySigned } from './support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_MASTER_KEY, TEST_REDIS_URL } from './support/helpers'
import { launchSettingsOf, runToExit, type ServerProcess, startServer, twoProcessesWithMetricsPort } from './support/server-process'
import { freePort } from './support/servers'
import { sample } from './support/metrics-text'
import { createOwnDatabase } from './support/own-database'
import { postgresBehindProxy } from './support/tampering-proxy'
import { newDataDir } from './support/data-dir'
import { startReceiver, testCertificate } from './support/webhooks-receiver'
import { LAUNCH_ENV, OTHERS_STOP_MS } from '../src/server-processes'
import { LOW_FD_LIMIT } from '../src/lib/process-metrics'

// Each test starts server processes: on a slow 2-core host under the whole suite's load, one start (the
// file's first also makes the migrated template its copy comes from) took more than 30 s.
setDefaultTimeout(90_000)

/** Pids of the processes `pid` started itself (the other server processes; workers are threads). */
const childrenOf = (pid: number) =>
  Bun.spawnSync(['pgrep', '-P', String(pid)]).stdout.toString().split('\n').filter(Boolean).map(Number)

/** Server processes a first one started for `port` (by their environment: once it is gone they belong to no one). */
function startedFor(port: number): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .filter((pid) => {
      try {
        const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')
        return env.includes(`PORT=${port}`) && env.some((v) => v.startsWith('LS_SERVER_PROCESS_INDEX='))
      } catch {
        return false
      }
    })
    .map(Number)
}

/** An account with credits and an app, made by the operator CLI on `env`'s storage, and POSTs to `server`'s Developer API as it. */
async function tenantOn(server: ServerProcess, env: Record<string, string>, name: string) {
  const cli = async (args: string[]) => JSON.parse((await runToExit(['src/operator/cli.ts', ...args], env)).stdout.trim().split('\n').at(-1)!)
  const account = await cli(['account', 'create', '--name', name, '--credits', '1000'])
  const app = await cli(['app', 'create', '--account', account.accountId, '--name', name])
  const api = (path: string, body: unknown) =>
    fetch(`${server.url}${path}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${account.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    })
  return { app, api }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

async function until<T>(probe: () => T | undefined | Promise<T | undefined>, timeoutMs = 10_000): Promise<T> {
  const end = performance.now() + timeoutMs
  for (;;) {
    const value = await probe()
    if (value !== undefined) return value
    if (performance.now() > end) throw new Error('timed out')
    await Bun.sleep(50)
  }
}

// A new connection per request, so the kernel picks a process each time.
const freshFetch = (server: ServerProcess, path: string, init: RequestInit = {}) =>
  fetch(`${server.url}${path}`, { ...init, keepalive: false, headers: { ...init.headers, connection: 'close' } })

/** The process labels scrapes on fresh connections show, scraping until `enough` or 60 scrapes. */
async function processLabelsSeen(server: ServerProcess, enough: (seen: Set<string>) => boolean): Promise<Set<string>> {
  const seen = new Set<string>()
  for (let i = 0; i < 60 && !enough(seen); i++) {
    const text = await (await freshFetch(server, '/metrics')).text()
    for (const m of text.matchAll(/process="(\d+)"/g)) seen.add(m[1]!)
    await Bun.sleep(20)
  }
  return seen
}

test.skipIf(MODE !== 'embedded')('SIGTERM while the embedded database is first made: exit 0, the database closed, nothing left in DATA_DIR but it', async () => {
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    const dataDir = mkdtempSync(join(tmpdir(), 'ls-start-stop-'))
    const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
      cwd: join(import.meta.dir, '..'),
      env: { ...process.env, DATA_DIR: dataDir, DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: TEST_MASTER_KEY.toString('hex'), HOST: '127.0.0.1', PORT: '0' },
      stdout: 'ignore',
      stderr: 'pipe',
    })
    // The socket is made in the same turn as the handlers: from then on the start is the server's to stop.
    await until(() => (readdirSync(dataDir).includes('operator.sock') ? true : undefined), 30_000)
    proc.kill(signal)
    expect(await proc.exited, await new Response(proc.stderr).text()).toBe(0)
    expect(readdirSync(dataDir).filter((name) => name !== 'pglite' && name !== 'master.key')).toEqual([])
    // What it made opens again.
    const again = await startServer({ DATA_DIR: dataDir, DATABASE_URL: '', REDIS_URL: '' })
    expect((await fetch(`${again.url}/readyz`)).status).toBe(200)
    expect(await again.stop()).toBe(0)
  }
}, 120_000)

/** Whether `pid` catches SIGTERM now (its caught-signals mask in /proc), or null once it is gone. */
function catchesSigterm(pid: number): boolean | null {
  try {
    const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
    return mask === undefined ? null : (BigInt(`0x${mask}`) & (1n << 14n)) !== 0n
  } catch {
    return null
  }
}

test.skipIf(MODE !== 'embedded')('SIGTERM is caught from the start-up handlers on: never a moment of the default action, which kills', async () => {
  const dataDir = await newDataDir('ls-signal-window-', { embedded: true })
  const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
    cwd: join(import.meta.dir, '..'),
    env: { ...process.env, DATA_DIR: dataDir, DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: TEST_MASTER_KEY.toString('hex'), HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info' },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  let log = ''
  const reading = (async () => {
    for await (const chunk of proc.stderr.pipeThrough(new TextDecoderStream())) log += chunk
  })()
  // Polled from the moment the start-up handlers catch it until the server listens (and the handlers
  // that stop it took over): once the last listener of a signal is removed, Bun restores its default.
  let caught = false
  let uncaughtAfter = false
  while (!log.includes('"listening"') && proc.exitCode === null) {
    const now = catchesSigterm(proc.pid)
    if (now === true) caught = true
    if (now === false && caught) uncaughtAfter = true
    await Bun.sleep(0)
  }
  proc.kill('SIGTERM')
  expect(await proc.exited).toBe(0)
  await reading
  expect(caught).toBe(true)
  expect(uncaughtAfter).toBe(false)
})

// An embedded server in either pass: run once.
test.skipIf(MODE !== 'embedded')('SIGTERM while a request body is still on its way: the server stops within seconds, not at its deadline', async () => {
  const server = await startServer({ DATABASE_URL: '', REDIS_URL: '' })
  const socket = connect(Number(new URL(server.url).port), '127.0.0.1')
  socket.on('error', () => {})
  socket.write('POST /v1/licenses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{')
  const drip = setInterval(() => socket.writable && socket.write(' '), 200)
  try {
    await Bun.sleep(300)
    const stopping = performance.now()
    expect(await server.stop()).toBe(0)
    expect(performance.now() - stopping).toBeLessThan(10_000)
  } finally {
    clearInterval(drip)
    socket.destroy()
  }
})

test.skipIf(MODE !== 'postgres')('SIGTERM with PostgreSQL not answering: the last writes wait out their bounds side by side, not one after the other', async () => {
  const receiver = startReceiver(() => 'hang')
  const own = await createOwnDatabase('ls_stopbh')
  const { proxy, url } = await postgresBehindProxy(own.url)
  const env = { DATA_DIR: await newDataDir('ls-stopbh-', { embedded: false }), DATABASE_URL: url, REDIS_URL: TEST_REDIS_URL!, MASTER_KEY: TEST_MASTER_KEY.toString('hex') }
  const server = await startServer({ ...env, NODE_EXTRA_CA_CERTS: testCertificate().certFile })
  try {
    const { app, api } = await tenantOn(server, env, 'Stop')
    expect((await api(`/v1/apps/${app.appId}/webhooks`, { url: receiver.url('/hook'), events: ['license.created'] })).status).toBe(201)
    const licenseKey = (await (await api('/v1/licenses', { appId: app.appId })).json()).licenses[0].licenseKey
    // A delivery on its way to a receiver that hangs.
    await until(() => (receiver.at('/hook').length >= 1 ? true : undefined))
    const validate = () =>
      fetch(`${server.url}/auth/validate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ appId: app.appId, appSecret: app.appSecret, licenseKey, hwid: 'stop-1', nonce: nonce() }),
      })
    expect((await validate()).status).toBe(200)
    await Bun.sleep(500)
    // PostgreSQL stops answering: a charge, a license.validated event and the delivery's result wait to be written.
    proxy.holdWrites('all')
    expect((await validate()).status).toBe(200)
    const stopping = performance.now()
    expect(await server.stop()).toBe(0)
    // The dispatcher's 20 s from the signal on, then the pool's 5 s close at most; one step after the other it took 29 s.
    // A slow 2-core host under the suite's load adds about a second to the process's own exit (25.9 s seen).
    expect(performance.now() - stopping).toBeLessThan(27_000)
  } finally {
    await server.stop()
    proxy.close()
    await own.drop()
  }
})

// An embedded server in either pass: run once.
test.skipIf(MODE !== 'embedded')('a low open-files limit is warned of at the start, and scraped as process_max_fds', async () => {
  const dataDir = await newDataDir('ls-proc-', { embedded: true })
  const server = Bun.spawn(['prlimit', '--nofile=1000:1000', process.execPath, join(import.meta.dir, '..', 'src', 'main.ts')], {
    env: { ...process.env, HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', DATABASE_URL: '', REDIS_URL: '', DATA_DIR: dataDir, MASTER_KEY: TEST_MASTER_KEY.toString('hex') },
    stdout: 'ignore',
    stderr: 'pipe',
  })
  try {
    let log = ''
    const decoder = new TextDecoder()
    for await (const chunk of server.stderr) {
      log += decoder.decode(chunk, { stream: true })
      if (log.includes('"listening"')) break
    }
    const warned = log.split('\n').find((line) => line.includes('the open-files limit is low'))
    expect(JSON.parse(warned!)).toMatchObject({ level: 'warn', limit: 1000, wanted: LOW_FD_LIMIT })
    const { url } = JSON.parse(log.split('\n').find((line) => line.includes('"listening"'))!)
    expect(await (await fetch(`${url}/metrics`)).text()).toContain('\nprocess_max_fds 1000\n')
  } finally {
    server.kill('SIGTERM')
    await server.exited
  }
})

// An embedded server in either pass: run once.
test.skipIf(MODE !== 'embedded')("SIGTERM stops the webhook dispatcher's claims at once: deliveries queued behind a hanging receiver do not go out during the drain", async () => {
  const receiver = startReceiver(() => 'hang')
  const dataDir = await newDataDir('ls-proc-', { embedded: true })
  const server = await startServer({ DATABASE_URL: '', REDIS_URL: '', DATA_DIR: dataDir, NODE_EXTRA_CA_CERTS: testCertificate().certFile })
  const env = { DATA_DIR: dataDir, DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: TEST_MASTER_KEY.toString('hex') }
  const { app, api } = await tenantOn(server, env, 'Drain')
  let socket: ReturnType<typeof connect> | null = null
  try {
    expect((await api(`/v1/apps/${app.appId}/webhooks`, { url: receiver.url('/hook'), events: ['license.created'] })).status).toBe(201)
    expect((await api('/v1/licenses', { appId: app.appId, quantity: 60 })).status).toBe(201)
    // Each delivery worker's 16 requests to the receiver hang; the other deliveries wait for them, claimed.
    await until(() => (receiver.at('/hook').length >= 16 ? true : undefined))
    const firstSent = Date.now()
    // A body that never ends holds the stop's 5 s drain; the first deliveries time out (10 s) within it.
    socket = connect(Number(new URL(server.url).port), '127.0.0.1')
    socket.on('error', () => {})
    socket.write('POST /v1/licenses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{')
    await Bun.sleep(Math.max(0, firstSent + 8_000 - Date.now()))
    const sentBefore = receiver.at('/hook').length
    expect(sentBefore).toBeLessThan(60)
    const stopping = performance.now()
    expect(await server.stop()).toBe(0)
    // The drain and the hanging deliveries' own timeouts (5-6 s): not the 10 s of a second wave sent
    // meanwhile, which would hold the stop 12 s at least (its first deliveries time out 2 s into it).
    expect(performance.now() - stopping).toBeLessThan(10_000)
    expect(receiver.at('/hook')).toHaveLength(sentBefore)
  } finally {
    socket?.destroy()
    await receiver.stop()
  }
})

// Several processes share the port only with the shared database and store: PostgreSQL mode only.
if (MODE === 'postgres') {
  // What a production install gets from DATABASE_URL and REDIS_URL alone.
  test('SERVER_PROCESSES unset: one process per core serves the port', async () => {
    const cores = availableParallelism()
    const server = await startServer({ DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '' })
    try {
      expect(server.log()).toContain(`"processes":${cores}`)
      expect(childrenOf(server.pid)).toHaveLength(cores - 1)
      // Started without the launchers' allocator setting, the first process still gives it to the others.
      for (const child of childrenOf(server.pid)) expect(launchSettingsOf(child)).toEqual(LAUNCH_ENV)
      const seen = await processLabelsSeen(server, (labels) => labels.size === cores)
      // One process labels nothing: its metrics are the server's.
      expect(seen.size).toBe(cores > 1 ? cores : 0)
    } finally {
      await server.stop()
    }
  })

  describe('SERVER_PROCESSES=2', async () => {
    const t = await makeTestApp()
    // Started before the first test, not in the describe body: a run whose filter (bun test -t) leaves
    // none of these tests runs the body all the same, but neither hook, and would leave the server running.
    let server: ServerProcess
    beforeAll(async () => {
      server = await startServer({ DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '2' })
    })
    afterAll(async () => {
      // Unset when the start failed: that error is the one to see.
      if (server && alive(server.pid)) await server.stop()
    })
    const fresh = (path: string, init: RequestInit = {}) => freshFetch(server, path, init)
    const labelsSeen = (enough: (seen: Set<string>) => boolean) => processLabelsSeen(server, enough)

    test('both processes serve the port, each labelling its own metrics', async () => {
      expect(childrenOf(server.pid)).toHaveLength(1)
      const seen = await labelsSeen((labels) => labels.size === 2)
      expect([...seen].sort()).toEqual(['0', '1'])
    })

    test('validates through either process are signed, and a HWID bound by one passes on the other', async () => {
      const s = await t.seed()
      const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
      const machine = hwid()
      for (let i = 0; i < 10; i++) {
        const res = await fresh('/auth/validate', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: machine, nonce: nonce() }),
        })
        const body = (await res.json()) as { payload: string; signature: string }
        expect(res.status).toBe(200)
        expect(verifySigned(body, s.publicKey)).toBe(true)
        expect(decode(body.payload).hwid).toBe(machine)
      }
    })

    test('a process that dies is counted missing by scrapes until it is started again, and then serves', async () => {
      const [first] = childrenOf(server.pid)
      process.kill(first!, 'SIGKILL')
      await until(() => (alive(first!) ? undefined : true))
      // The first process alone holds the port now; the other is started again a second later.
      const scrape = await (await fresh('/metrics')).text()
      expect(sample(scrape, 'server_processes_missing')).toBe(1)
      expect(scrape).not.toContain('process="1"')
      const next = await until(() => childrenOf(server.pid).find((pid) => pid !== first))
      expect(next).not.toBe(first)
      expect((await labelsSeen((labels) => labels.has('1'))).has('1')).toBe(true)
    })

    test('a second server started on the same port refuses to start, and takes none of the traffic', async () => {
      const port = new URL(server.url).port
      const second = await runToExit(['src/main.ts'], {
        HOST: '127.0.0.1',
        PORT: port,
        DATABASE_URL: TEST_DATABASE_URL!,
        REDIS_URL: TEST_REDIS_URL!,
        SERVER_PROCESSES: '2',
        MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
        DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-second-')),
      })
      expect(second.code).toBe(1)
      expect(second.stderr).toBe(`error: port ${port} on 127.0.0.1 is in use: one server per port (its own processes share it)\n`)
      expect((await fresh('/healthz')).status).toBe(200)
    })

    test('SIGTERM to the first process stops them all, exit code 0', async () => {
      const others = childrenOf(server.pid)
      expect(await server.stop()).toBe(0)
      for (const pid of others) expect(alive(pid)).toBe(false)
    })
  })

  test('a stop waits OTHERS_STOP_MS at most for a process that answers no SIGTERM (stopped), then kills it', async () => {
    const server = await startServer({ DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '2' })
    const [child] = childrenOf(server.pid)
    process.kill(child!, 'SIGSTOP')
    const stopping = performance.now()
    expect(await server.stop()).toBe(0)
    expect(performance.now() - stopping).toBeLessThan(OTHERS_STOP_MS + 5_000)
    expect(alive(child!)).toBe(false)
    expect(server.log()).toContain('"msg":"server process did not stop in time: killed","index":1')
  }, OTHERS_STOP_MS + 60_000)

  test('two servers started at the same moment on one port: one serves, the other refuses to start', async () => {
    const port = await freePort()
    const start = () =>
      Bun.spawn([process.execPath, join(import.meta.dir, '..', 'src', 'main.ts')], {
        env: {
          ...process.env,
          HOST: '127.0.0.1',
          PORT: String(port),
          DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-twin-')),
          MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
          DATABASE_URL: TEST_DATABASE_URL!,
          REDIS_URL: TEST_REDIS_URL!,
          SERVER_PROCESSES: '2',
        },
        stdout: 'ignore',
        stderr: 'pipe',
      })
    const servers = [start(), start()]
    try {
      // The probe of the port passes for both: the refusal comes from the claim the first one took.
      const bothStarted = Bun.sleep(20_000).then(() => ({ i: -1, code: null }))
      const refused = await Promise.race([...servers.map(async (server, i) => ({ i, code: await server.exited as number | null })), bothStarted])
      expect(refused.code).toBe(1)
      expect(await new Response(servers[refused.i]!.stderr).text()).toBe(
        `error: port ${port} on 127.0.0.1 is in use: one server per port (its own processes share it)\n`,
      )
      const serving = servers[1 - refused.i]!
      await until(() => fetch(`http://127.0.0.1:${port}/healthz`).then((r) => (r.ok ? true : undefined), () => undefined))
      serving.kill('SIGTERM')
      expect(await serving.exited).toBe(0)
    } finally {
      for (const pid of startedFor(port)) process.kill(pid, 'SIGKILL')
      for (const server of servers) server.kill('SIGKILL')
    }
  })

  test('SIGTERM while the other processes are still starting stops them too: none is left on the port', async () => {
    const port = await freePort()
    const server = Bun.spawn([process.execPath, join(import.meta.dir, '..', 'src', 'main.ts')], {
      env: {
        ...process.env,
        HOST: '127.0.0.1',
        PORT: String(port),
        DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-proc-')),
        MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
        DATABASE_URL: TEST_DATABASE_URL!,
        REDIS_URL: TEST_REDIS_URL!,
        SERVER_PROCESSES: '2',
      },
      stdout: 'ignore',
      stderr: 'ignore',
    })
    const healthy = () => fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false)
    try {
      // The first process answers as soon as it listens, before the other one does.
      await until(async () => ((await healthy()) ? true : undefined))
      server.kill('SIGTERM')
      expect(await server.exited).toBe(0)
      await until(() => (startedFor(port).length === 0 ? true : undefined))
      expect(await healthy()).toBe(false)
    } finally {
      for (const pid of startedFor(port)) process.kill(pid, 'SIGKILL')
    }
  })

  test("on SIGTERM the first process stops its own parts beside the others' stop, not after it", async () => {
    const metricsPort = await freePort()
    const server = await twoProcessesWithMetricsPort(TEST_DATABASE_URL!, TEST_REDIS_URL!, metricsPort)
    const port = Number(new URL(server.url).port)
    // Bodies that never finish keep requests in flight until their deadline (10 s), which a stopping
    // process waits for: 16 connections, which the kernel spreads over both processes.
    const sockets = Array.from({ length: 16 }, () => {
      const socket = connect(port, '127.0.0.1')
      socket.on('error', () => {})
      socket.write('POST /auth/validate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{')
      return socket
    })
    const scrapes = () => fetch(`http://127.0.0.1:${metricsPort}/metrics`).then((r) => r.ok, () => false)
    try {
      expect(await until(async () => ((await scrapes()) ? true : undefined))).toBe(true)
      await Bun.sleep(200)
      process.kill(server.pid, 'SIGTERM')
      // Its metrics listener, the first of its own parts to stop, closes at once, while the other
      // process still waits for its requests.
      expect(await until(async () => ((await scrapes()) ? undefined : true), 3_000)).toBe(true)
      expect(childrenOf(server.pid)).toHaveLength(1)
    } finally {
      for (const socket of sockets) socket.destroy()
      await server.stop()
    }
  })

  test('the other processes stop when the first one is killed outright', async () => {
    const server = await startServer({ DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '2' })
    const [other] = childrenOf(server.pid)
    process.kill(server.pid, 'SIGKILL')
    await until(() => (alive(other!) ? undefined : true))
  })
}
