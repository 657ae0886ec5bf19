/**
 * `npm run bench:scale`: does a license the server has not cached cost what a cached one does? Seeds a
 * 2,000-license app and a 1,000,000-license app (bench/seed.ts seedBulk, HWIDs bound), starts the real
 * server on PostgreSQL + Redis and runs validate for licenses picked at random in each set, alternating,
 * over several rounds of one run. Prints per scenario req/s, p50/p99, the CPU per request of the server,
 * PostgreSQL, Redis and wrk, the ratio 1M ÷ 2k per round and the server's RSS at the end of each round.
 * Both sets are held by one server, so that ratio cannot see what holding the million costs every
 * request: each round also runs the 2k set against a second server started without the warm-up, which
 * holds only them, and prints the first server's 2k ÷ the second's. Every server but the one measured is
 * paused meanwhile (SIGSTOP), so no idle server's timers or collector take the cores. Needs wrk.
 *
 * Settings (environment): BENCH_PG_ADMIN_URL, BENCH_REDIS_URL (flushed before and after, and first
 * filled with keys standing for a week's nonces as in bench/run.ts; default redis://127.0.0.1:6379/13), BENCH_DURATION seconds per scenario and round (5), BENCH_ROUNDS (4),
 * BENCH_CONNECTIONS (64), BENCH_PROCESSES (SERVER_PROCESSES, 2), BENCH_BIG (1000000), BENCH_SMALL (2000),
 * BENCH_CACHE_MAX_MB (the server's CACHE_MAX_MB; unset: the server's default, an eighth of this machine's memory split among
 * the processes, which the summary says whether it holds both sets), BENCH_PROFILE_DIR (a CPU profile
 * from the server's first process, in markdown and as samples for bench/profile.ts), BENCH_COMPARE (the root of another checkout, e.g. a
 * `git worktree` of the commit before a change: its server runs beside this one on the same database and
 * Redis, each scenario of both back to back, in turn first, so the two are compared in one run).
 */
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { licenseRecordBytes } from '../src/actors/license-cache'
import { loadConfig } from '../src/config'
import { setLogLevel } from '../src/lib/log'
import { machineTicks, procCpu, redisCounters } from './proc'
import { seedBulk } from './seed'
import { launchServer, measureAlone, profileFlags, runWrk, type Server } from './server'
import { benchStores, median, presizeKeyspace } from './stores'

const ADMIN_URL = process.env.BENCH_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379/13'
const DURATION = Number(process.env.BENCH_DURATION ?? 5)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4)
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64)
const PROCESSES = process.env.BENCH_PROCESSES ?? '2'
const BIG = Number(process.env.BENCH_BIG ?? 1_000_000)
const SMALL = Number(process.env.BENCH_SMALL ?? 2_000)
// Unset, the bound a server started here with no CACHE_MAX_MB gets; set explicitly all the same, so the
// summary and the RSS check read the bound the server ran with.
const CACHE_MAX_MB =
  process.env.BENCH_CACHE_MAX_MB ??
  String(loadConfig({ DATABASE_URL: 'postgres://bench/default', REDIS_URL: 'redis://bench', SERVER_PROCESSES: PROCESSES }).cacheMaxMb)
// What holds every license of both sets within the warm-up's 90%, each at its record's size in the cache.
const BULK_APP = randomUUID()
const BULK_RECORD_BYTES = licenseRecordBytes(BULK_APP, 'BIGS-0000-0000-0000', {
  key: 'BIGS-0000-0000-0000',
  appId: BULK_APP,
  status: 'active',
  expiresAt: null,
  maxHwidSlots: 1,
  unlimitedHwidSlots: false,
  hwids: [`h${BIG}`],
  label: null,
  variables: {},
})
const HOLDING_BOTH_MB = Math.ceil(((BIG + SMALL) * BULK_RECORD_BYTES) / 0.9 / 2 ** 20)
const COMPARE = process.env.BENCH_COMPARE
const root = join(import.meta.dir, '..')

interface LicenseSet {
  appId: string
  appSecret: string
  prefix: string
  count: number
}

interface Result {
  rps: number
  p50: number
  p99: number
  errors: number
  cpuUs: number
  /** Of cpuUs, the main threads' share (the JavaScript of every request); the rest is mostly the collector's threads. */
  mainUs: number
  /** CPU of the PostgreSQL backends serving this bench's database, per request. */
  pgUs: number
  /** The whole Redis server's CPU per request, and of it the time inside scripts (bench/proc.ts redisCounters). */
  redisUs: number
  scriptUs: number
  /** wrk's own CPU per request: the machine's third user, on the same two cores. */
  wrkUs: number
  /** Share of the machine's CPU time left idle: above a few % the run was not CPU-bound. */
  idlePct: number
}

/** CPU seconds of the PostgreSQL backends connected to `dbName` (this bench's alone, not the other users of the server). */
let pgCpu: () => Promise<number> = async () => 0

let runs = 0

/** Every server started, each paused while another is measured. */
const servers: Server[] = []

const wrk = (server: Server, set: LicenseSet, seconds: number) => measureAlone(servers, server, () => measure(server, set, seconds))

async function measure(server: Server, set: LicenseSet, seconds: number): Promise<Result> {
  const pg0 = await pgCpu()
  const redis0 = redisCounters(REDIS_URL)
  const ticks0 = machineTicks()
  const cpu0 = server.cpu()
  const main0 = server.mainCpu()
  const runId = `${process.pid.toString(16)}s${(runs++).toString(16)}x`
  const { rps, p50, p99, errors, total, cpuUs: wrkCpuUs } = await runWrk([
    '-t2', `-c${CONNECTIONS}`, `-d${seconds}s`, '-s', join(import.meta.dir, 'scale.lua'),
    server.url, '--', set.appId, set.appSecret, set.prefix, String(set.count), runId,
  ])
  const cpuUs = ((server.cpu() - cpu0) * 1e6) / total
  const mainUs = ((server.mainCpu() - main0) * 1e6) / total
  const ticks = machineTicks()
  const redis = redisCounters(REDIS_URL)
  return {
    rps,
    p50,
    p99,
    errors,
    cpuUs,
    mainUs,
    pgUs: (((await pgCpu()) - pg0) * 1e6) / total,
    redisUs: ((redis.cpuSeconds - redis0.cpuSeconds) * 1e6) / total,
    scriptUs: (redis.scriptUs - redis0.scriptUs) / total,
    wrkUs: wrkCpuUs / total,
    idlePct: (100 * (ticks.idle - ticks0.idle)) / (ticks.total - ticks0.total),
  }
}

/** Where a request's CPU went, in µs: the server (its main threads), PostgreSQL, Redis (its scripts), wrk. */
const cpuLine = (r: Omit<Result, 'rps' | 'p50' | 'p99' | 'errors' | 'idlePct'>) =>
  `server CPU ${r.cpuUs.toFixed(0)} µs/req (main threads ${r.mainUs.toFixed(0)}), PostgreSQL ${r.pgUs.toFixed(0)}, Redis ${r.redisUs.toFixed(0)} (scripts ${r.scriptUs.toFixed(0)}), wrk ${r.wrkUs.toFixed(0)}`

/** Each figure's median over the rounds. */
const medianResult = (list: Result[]) => {
  const m = (f: (r: Result) => number) => median(list.map(f))
  return { rps: m((r) => r.rps), p50: m((r) => r.p50), p99: m((r) => r.p99), cpuUs: m((r) => r.cpuUs), mainUs: m((r) => r.mainUs), pgUs: m((r) => r.pgUs), redisUs: m((r) => r.redisUs), scriptUs: m((r) => r.scriptUs), wrkUs: m((r) => r.wrkUs) }
}

/** One scenario's medians over the rounds: req/s, p50/p99 and where its CPU went. */
const summaryLine = (label: string, list: Result[]) => {
  const r = medianResult(list)
  return `    ${label.padEnd(17)} ${r.rps.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms  ${cpuLine(r)}`
}

async function main() {
  setLogLevel('warn')
  const dbName = `ls_bench_scale_${process.pid}`
  const stores = await benchStores(ADMIN_URL, REDIS_URL, dbName)
  const { admin } = stores
  pgCpu = async () => {
    const rows = await admin<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE datname = ${dbName}`
    return rows.reduce((total, { pid }) => total + procCpu(String(pid)).seconds, 0)
  }
  try {
    const env: Record<string, string> = {
      DATABASE_URL: stores.databaseUrl,
      REDIS_URL,
      MASTER_KEY: Buffer.alloc(32, 42).toString('hex'),
      DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-bench-scale-')),
      SERVER_PROCESSES: PROCESSES,
      // Limits on, at values this load never reaches: the buckets run, nothing is refused.
      VALIDATE_LIMIT_PER_IP: '1000000000',
      VALIDATE_LIMIT_PER_LICENSE: '1000000000',
      CACHE_MAX_MB,
    }
    const seedStart = performance.now()
    const [small, big] = (await seedBulk(env, [
      { prefix: 'SMAL', count: SMALL },
      { prefix: 'BIGS', count: BIG },
    ])) as [LicenseSet, LicenseSet]
    console.log(`seeded ${SMALL} + ${BIG} licenses with bound HWIDs in ${((performance.now() - seedStart) / 1000).toFixed(1)} s`)
    // The nonces of every run, each server's warm-ups included, at up to 30,000 validates a second.
    await presizeKeyspace(stores.redis, (COMPARE ? 2 : 1) * (ROUNDS * 2 * DURATION + 3 + DURATION) * 30_000)
    const checkouts: { name: string; server: Server }[] = []
    const start = async (name: string, checkout: string, flags: string[] = []) => {
      const startedAt = performance.now()
      const server = await launchServer(checkout, env, flags)
      servers.push(server)
      checkouts.push({ name, server })
      // A checkout that fills its cache at start is measured once it has (each process logs it).
      if (!existsSync(join(checkout, 'src', 'actors', 'warm-up.ts')) || process.env.CACHE_WARM_UP === 'false') return
      await server.logged('license cache warmed')
      console.log(`${name}: cache warmed ${((performance.now() - startedAt) / 1000).toFixed(1)} s after start`)
    }
    await start('this checkout', root, profileFlags())
    if (COMPARE) await start('BENCH_COMPARE', COMPARE)
    const alone = await launchServer(root, { ...env, CACHE_WARM_UP: 'false' })
    servers.push(alone)
    const rssLine = (when: string) =>
      console.log(`RSS ${when} (MB per server process): ${checkouts.map(({ name, server }) => `${name} ${server.rssMb().map((mb) => mb.toFixed(0)).join(' + ')}`).join('; ')}`)
    rssLine('at start')
    // Warm-up: JIT, connection pools, the small set into the caches, the big one to its steady state.
    for (const { server } of [...checkouts, { server: alone }]) await wrk(server, small, 3)
    rssLine(`after the ${SMALL} licenses' warm-up`)
    for (const { server } of checkouts) await wrk(server, big, DURATION)
    const samples = checkouts.map(() => ({ small: [] as Result[], big: [] as Result[], rss: [] as number[][] }))
    const aloneSamples: Result[] = []
    const aloneLabel = `holding only the ${SMALL}`
    const run = async (label: string, server: Server, set: LicenseSet, into: Result[]) => {
      const r = await wrk(server, set, DURATION)
      into.push(r)
      console.log(
        `  ${label.padEnd(34)} ${r.rps.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms  ${cpuLine(r)}; machine idle ${r.idlePct.toFixed(0)}%${r.errors ? `  non-2xx ${r.errors}` : ''}`,
      )
    }
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`round ${round}/${ROUNDS}`)
      // Each scenario of every checkout back to back, in turn first: one ratio sees one machine state.
      const steps = checkouts.flatMap(({ name, server }, i) =>
        (['small', 'big'] as const).map(
          (which) => () => run(`${name}, ${which === 'small' ? SMALL : BIG} licenses`, server, which === 'small' ? small : big, samples[i]![which]),
        ),
      )
      steps.push(() => run(aloneLabel, alone, small, aloneSamples))
      for (const step of round % 2 === 1 ? steps : steps.reverse()) await step()
      checkouts.forEach(({ server }, i) => samples[i]!.rss.push(server.rssMb()))
      rssLine('at the end of the round')
    }
    const bound = `CACHE_MAX_MB=${CACHE_MAX_MB}${process.env.BENCH_CACHE_MAX_MB ? '' : " (the server's default here)"}`
    const holds = Number(CACHE_MAX_MB) >= HOLDING_BOTH_MB ? 'holds both sets' : `holds part of the big set; both need ${HOLDING_BOTH_MB}`
    console.log(`\nsummary of ${ROUNDS} rounds, ${CONNECTIONS} connections, SERVER_PROCESSES=${PROCESSES}, ${bound}, which ${holds} (medians of the rounds)`)
    checkouts.forEach(({ name }, i) => {
      const s = samples[i]!
      const ratios = s.big.map((r, j) => r.rps / s.small[j]!.rps)
      const errors = [...s.small, ...s.big].reduce((n, r) => n + r.errors, 0)
      console.log(`  ${name}:`)
      for (const [label, list] of [[`${SMALL} licenses`, s.small], [`${BIG} licenses`, s.big]] as const) {
        console.log(summaryLine(label, list))
      }
      console.log(`    ${median(ratios) >= 0.9 ? 'ok  ' : 'MISS'} ${BIG} ÷ ${SMALL}: ${median(ratios).toFixed(2)} (rounds: ${ratios.map((r) => r.toFixed(2)).join(', ')}) (>= 0.90)`)
      const largest = s.rss.map((list) => Math.max(...list))
      const ceiling = Number(CACHE_MAX_MB) + 150
      console.log(`    ${Math.max(...largest) <= ceiling ? 'ok  ' : 'MISS'} RSS at the end of each round, largest process: ${largest.map((mb) => mb.toFixed(0)).join(', ')} MB (<= CACHE_MAX_MB + 150 = ${ceiling})`)
      console.log(`    ${errors === 0 ? 'ok  ' : 'MISS'} non-2xx responses: ${errors}`)
    })
    console.log(`  a server ${aloneLabel} (RSS ${alone.rssMb().map((mb) => mb.toFixed(0)).join(' + ')} MB):`)
    console.log(summaryLine(`${SMALL} licenses`, aloneSamples))
    // No target of the issue's: what holding the big set costs every request, which 1M ÷ 2k cannot see.
    const beside = samples[0]!.small.map((r, j) => r.rps / aloneSamples[j]!.rps)
    console.log(`    this checkout's ${SMALL} beside the ${BIG} ÷ ${aloneLabel}: ${median(beside).toFixed(2)} (rounds: ${beside.map((r) => r.toFixed(2)).join(', ')})`)
  } finally {
    await Promise.all(servers.map((s) => s.stop()))
    await stores.close()
  }
}

await main()
