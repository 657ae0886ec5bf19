/**
 * Validate throughput with and without a subscribed license.validated webhook, then proof that every
 * validated event of the webhook run was delivered exactly once.
 *
 *   bun bench/validate-webhook.ts [--duration 10] [--connections 64] [--rounds 3]
 *
 * Needs wrk, PostgreSQL and Redis (BENCH_PG_ADMIN_URL, BENCH_REDIS_URL; BENCH_PROFILE_DIR as in
 * bench/run.ts). It creates and drops its
 * own database, starts the real server (src/main.ts) on a free port, and runs an HTTPS receiver
 * with a self-signed certificate the server trusts through NODE_EXTRA_CA_CERTS. Runs alternate
 * (without, with, without, with) because this machine is noisy: compare the medians of one run.
 *
 * The receiver stands for the vendor's own server, on another machine in production: here it runs at
 * nice 19, so it takes CPU only when the server leaves some. It still verifies every signature and
 * counts every request. Deliveries give way to API requests while the CPU is saturated (see the
 * dispatcher): after each webhook run the bench waits for the backlog and reports how many were
 * delivered during the load and after it, and how long the drain took.
 */
import { spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { LAUNCH_ENV } from '../src/server-processes'
import { procCpu } from './proc'
import { type Seeded, seedBench } from './seed'
import { DIE_WITH_BENCH, profileFlags } from './server'

const args = process.argv.slice(2)
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? Number(args[i + 1]) : fallback
}
const DURATION = flag('duration', 10)
const CONNECTIONS = flag('connections', 64)
const ROUNDS = flag('rounds', 3)
const LICENSES = 200
const PG_ADMIN = process.env.BENCH_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379/13'
const root = join(import.meta.dir, '..')
const dir = mkdtempSync(join(tmpdir(), 'ls-bench-wh-'))

function certificate() {
  const certFile = join(dir, 'cert.pem')
  const keyFile = join(dir, 'key.pem')
  const made = spawnSync('openssl', [
    'req', '-x509', '-newkey', 'ed25519', '-nodes', '-days', '1', '-keyout', keyFile, '-out', certFile,
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
  ])
  if (made.status !== 0) throw new Error(`openssl failed: ${made.stderr}`)
  return { certFile, keyFile }
}

async function startServer(env: Record<string, string>) {
  const proc = Bun.spawn([process.execPath, DIE_WITH_BENCH, ...profileFlags(), 'src/main.ts'], { cwd: root, env, stdout: 'ignore', stderr: 'pipe' })
  let log = ''
  let base: string | null = null
  void (async () => {
    for await (const chunk of proc.stderr) {
      log += new TextDecoder().decode(chunk)
      base ??= /"msg":"listening","url":"(https?:\/\/[^"]+)"/.exec(log)?.[1]?.replace('0.0.0.0', '127.0.0.1') ?? null
    }
  })()
  for (let i = 0; i < 600 && !base && proc.exitCode === null; i++) await Bun.sleep(50)
  if (!base) throw new Error(`server did not start:\n${log}`)
  return { proc, base: base as string }
}

/** wrk POSTing validate for random licenses with a fresh nonce per request. */
function wrkScript({ appId, appSecret, licenses }: Seeded) {
  const path = join(dir, 'validate.lua')
  writeFileSync(
    path,
    `
local keys = { ${licenses.map((l) => `"${l.key}"`).join(', ')} }
local hwids = { ${licenses.map((l) => `"${l.hwid}"`).join(', ')} }
local counter = 0
local tid = 0
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) tid = tonumber(wrk.thread:get("tid")) or math.random(1, 1e9); math.randomseed(os.time() + tid) end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function request()
  counter = counter + 1
  local i = (counter + tid * 7) % #keys + 1
  local nonce = string.format("%d-%d-%d", tid, counter, math.random(1, 1e9))
  local body = '{"appId":"${appId}","appSecret":"${appSecret}","licenseKey":"' .. keys[i] .. '","hwid":"' .. hwids[i] .. '","nonce":"' .. nonce .. '"}'
  return wrk.format(nil, "/auth/validate", nil, body)
end
local non2xx = 0
function response(status, headers, body) if status ~= 200 then non2xx = non2xx + 1 end end
`,
  )
  return path
}

async function runWrk(base: string, script: string) {
  const proc = Bun.spawn(['wrk', '-t2', `-c${CONNECTIONS}`, `-d${DURATION}s`, '-s', script, base], { stdout: 'pipe' })
  const stdout = await new Response(proc.stdout).text()
  await proc.exited
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? 0)
  const total = Number(/(\d+) requests in/.exec(stdout)?.[1] ?? 0)
  const errors = Number(/Non-2xx or 3xx responses: (\d+)/.exec(stdout)?.[1] ?? 0)
  return { rps, total, errors, raw: stdout }
}

/** CPU seconds used so far by the server process (all threads), its database's backends, Redis and the receiver. */
function cpu(serverPid: number) {
  let pg = 0
  let redis = 0
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    const { comm, seconds: t } = procCpu(pid)
    // Only the backends serving this benchmark's database: others may be busy with other work.
    if (comm === 'postgres' && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(dbName)) pg += t
    if (comm.startsWith('redis')) redis += t
  }
  // Per thread of the server: the API (main), delivery workers, Bun's HTTP client thread, the rest.
  const threads: Record<string, number> = { main: 0, workers: 0, http: 0, other: 0 }
  try {
    for (const tid of readdirSync(`/proc/${serverPid}/task`)) {
      const { comm, seconds: t } = procCpu(`${serverPid}/task/${tid}`)
      const kind = tid === String(serverPid) ? 'main' : comm === 'Worker' ? 'workers' : comm === 'HTTP Client' ? 'http' : 'other'
      threads[kind] = (threads[kind] ?? 0) + t
    }
  } catch {}
  return { server: procCpu(String(serverPid)).seconds, threads, pg, redis, receiver: procCpu(String(receiver.pid)).seconds }
}
function cpuDelta(a: ReturnType<typeof cpu>, b: ReturnType<typeof cpu>, n: number) {
  const us = (x: number) => ((x / n) * 1e6).toFixed(0)
  const th = Object.keys(b.threads)
    .map((k) => `${k} ${us((b.threads[k] ?? 0) - (a.threads[k] ?? 0))}`)
    .join(' ')
  return (
    `CPU µs/request: server ${us(b.server - a.server)} (${th}), postgres ${us(b.pg - a.pg)}, redis ${us(b.redis - a.redis)}, ` +
    `receiver ${us(b.receiver - a.receiver)}`
  )
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0

const dbName = `ls_bench_wh_${process.pid}`
const admin = postgres(PG_ADMIN, { max: 1, onnotice: () => {} })
await admin.unsafe(`CREATE DATABASE ${dbName}`)
const dbUrl = new URL(PG_ADMIN)
dbUrl.pathname = `/${dbName}`
const { certFile, keyFile } = certificate()

// A receiver is another machine in production: niced here so it takes CPU only when the server leaves some.
const receiver = Bun.spawn(['nice', '-n', '19', process.execPath, DIE_WITH_BENCH, join(import.meta.dir, 'webhook-receiver.ts'), certFile, keyFile], {
  stdout: 'pipe',
})
const receiverPort = Number(new TextDecoder().decode((await receiver.stdout.getReader().read()).value).trim())
const receiverTls = { ca: await Bun.file(certFile).text() }
const receiverCounts = async () =>
  (await (await fetch(`https://127.0.0.1:${receiverPort}/`, { tls: receiverTls })).json()) as { received: number; rejected: number }

const env: Record<string, string> = {
  ...(process.env as Record<string, string>),
  // As the image and `npm start` launch the server.
  ...LAUNCH_ENV,
  HOST: '127.0.0.1',
  PORT: '0',
  DATA_DIR: dir,
  DATABASE_URL: dbUrl.toString(),
  REDIS_URL: REDIS,
  MASTER_KEY: randomBytes(32).toString('hex'),
  WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
  NODE_EXTRA_CA_CERTS: certFile,
  VALIDATE_LIMIT_PER_IP: '1000000000',
  VALIDATE_LIMIT_PER_LICENSE: '1000000000',
  LOG_LEVEL: 'warn',
}
const db = postgres(dbUrl.toString(), { max: 1, onnotice: () => {} })
let server: Awaited<ReturnType<typeof startServer>> | undefined
try {
  const { default: Redis } = await import('ioredis')
  const redis = new Redis(REDIS)
  await redis.flushdb()
  redis.disconnect()
  const seeded = await seedBench(env, LICENSES)
  server = await startServer({ ...env, LOG_LEVEL: 'info' })
  const api = (method: string, path: string, body?: unknown) =>
    fetch(`${server!.base}${path}`, {
      method,
      headers: { authorization: `Bearer ${seeded.apiKey}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(async (r) => ({ status: r.status, body: (await r.json()) as any }))
  const script = wrkScript(seeded)
  await runWrk(server.base, script) // warm-up: caches, JIT
  // Created disabled, so the receiver knows the secret before the first delivery; each round enables it.
  const created = await api('POST', `/v1/apps/${seeded.appId}/webhooks`, {
    url: `https://127.0.0.1:${receiverPort}/bench`,
    events: ['license.validated'],
    enabled: false,
  })
  if (created.status !== 201) throw new Error(`webhook create: ${JSON.stringify(created.body)}`)
  const webhookId: string = created.body.webhookId
  await fetch(`https://127.0.0.1:${receiverPort}/secret`, { method: 'PUT', body: created.body.secret, tls: receiverTls })

  const without: number[] = []
  const withHook: number[] = []
  let hookRequests = 0
  let hookErrors = 0
  const drains: { during: number; after: number; seconds: number }[] = []
  for (let round = 0; round < ROUNDS; round++) {
    let before = cpu(server.proc.pid)
    const plain = await runWrk(server.base, script)
    without.push(plain.rps)
    console.log(`without webhook: ${plain.rps.toFixed(0)} req/s (${plain.errors} non-2xx); ${cpuDelta(before, cpu(server.proc.pid), plain.total)}`)

    await api('PUT', `/v1/apps/${seeded.appId}/webhooks/${webhookId}`, { enabled: true })
    const receivedBefore = (await receiverCounts()).received
    before = cpu(server.proc.pid)
    const hookedRun = await runWrk(server.base, script)
    const loadEnded = performance.now()
    const during = (await receiverCounts()).received - receivedBefore
    withHook.push(hookedRun.rps)
    hookRequests += hookedRun.total - hookedRun.errors
    hookErrors += hookedRun.errors
    console.log(`with webhook:    ${hookedRun.rps.toFixed(0)} req/s (${hookedRun.errors} non-2xx); ${cpuDelta(before, cpu(server.proc.pid), hookedRun.total)}`)
    // Deliveries give way to API requests while the CPU is saturated: the backlog of this run is
    // delivered after the load, before the webhook is disabled (fan-out honours `enabled`).
    let drained = false
    for (let i = 0; i < 3000 && !drained; i++) {
      const [row] = await db`SELECT count(*)::int AS n FROM webhook_deliveries WHERE attempted_at IS NULL`
      const [pending] = await db`SELECT count(*)::int AS n FROM events WHERE dispatched_at IS NULL`
      drained = row?.n === 0 && pending?.n === 0
      if (!drained) await Bun.sleep(100)
    }
    const drainSeconds = (performance.now() - loadEnded) / 1000
    const after = (await receiverCounts()).received - receivedBefore - during
    drains.push({ during, after, seconds: drainSeconds })
    console.log(
      `  delivered during the load: ${during}; after it: ${after}; ` +
        (drained ? `backlog drained ${drainSeconds.toFixed(1)} s after the load` : `NOT drained after ${drainSeconds.toFixed(0)} s`),
    )
    await api('PUT', `/v1/apps/${seeded.appId}/webhooks/${webhookId}`, { enabled: false })
  }

  const [events] = await db`SELECT count(*)::int AS n FROM events WHERE event = 'license.validated'`
  const [attempts] = await db`
    SELECT count(*)::int AS n, count(*) FILTER (WHERE http_status = 204)::int AS ok,
           count(DISTINCT event_id)::int AS distinct_events
    FROM webhook_deliveries WHERE webhook_id = ${webhookId}`
  const a = median(without)
  const b = median(withHook)
  const { received: delivered, rejected } = await receiverCounts()
  console.log('')
  console.log(`validate without webhook (median): ${a.toFixed(0)} req/s`)
  console.log(`validate with webhook    (median): ${b.toFixed(0)} req/s  (${((b / a - 1) * 100).toFixed(1)}%)`)
  console.log(
    `successful validates in webhook runs: ${hookRequests}; license.validated events: ${events?.n}; ` +
      `delivery rows: ${attempts?.n} (distinct events ${attempts?.distinct_events}, 204: ${attempts?.ok}); ` +
      `signed requests the receiver verified: ${delivered} (bad signatures: ${rejected})`,
  )
  // wrk does not count requests still in flight when it stops, so validates and events may differ by
  // at most the connection count; deliveries must match events exactly.
  const n = events?.n ?? -1
  const exact =
    attempts?.n === n && attempts?.distinct_events === n && attempts?.ok === n && delivered === n && rejected === 0 &&
    Math.abs(n - hookRequests) <= CONNECTIONS * ROUNDS
  console.log(exact ? 'every validated event delivered exactly once' : 'MISMATCH between validates and deliveries')
  console.log(b >= a * 0.85 ? 'within 15%' : 'NOT within 15%')
  if (!exact || b < a * 0.85) process.exitCode = 1
} finally {
  server?.proc.kill('SIGTERM')
  await server?.proc.exited
  receiver.kill()
  await db.end()
  await admin.unsafe(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`)
  await admin.end()
}
